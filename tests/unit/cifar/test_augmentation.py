"""Unit tests for paddle_dist.cifar.augmentation: the seeded crop and flip of each sample, and
normalisation."""

import numpy as np
import pytest

from paddle_dist import cifar

from tests.unit.cifar.test_cifar import TRAIN


# --- augmentation -------------------------------------------------------------------------

def candidates(image):
    """All 162 results augment may give for `image`: shift by (dy, dx) in -4..4 with zero fill,
    unflipped then flipped; returns (array [162, 3, 32, 32], [(dy, dx, flipped)])."""
    padded = np.pad(image, ((0, 0), (4, 4), (4, 4)))
    out, labels = [], []
    for dy in range(-4, 5):
        for dx in range(-4, 5):
            shifted = padded[:, 4 - dy:36 - dy, 4 - dx:36 - dx]
            out += [shifted, shifted[:, :, ::-1]]
            labels += [(dy, dx, False), (dy, dx, True)]
    return np.stack(out), labels


def test_augment_is_a_shift_and_maybe_a_flip_of_each_sample():
    images = np.random.default_rng(1).integers(1, 256, (100, 3, 32, 32), dtype=np.uint8)
    before = images.copy()
    out = cifar.augment(images, np.arange(100), seed=7, epoch=0)
    assert out.dtype == np.uint8 and out.shape == images.shape
    assert np.array_equal(images, before)   # the input is not modified
    seen = set()
    for image, result in zip(images, out):
        options, labels = candidates(image)
        matches = [labels[i] for i in np.flatnonzero((options == result).all(axis=(1, 2, 3)))]
        assert len(matches) == 1, matches
        seen.add(matches[0])
    assert len({(dy, dx) for dy, dx, _ in seen}) > 30 and {f for _, _, f in seen} == {False, True}


def test_augment_is_deterministic_and_depends_on_epoch_and_seed():
    images, keys = TRAIN[0], np.arange(50)
    first = cifar.augment(images, keys, seed=3, epoch=1)
    assert np.array_equal(first, cifar.augment(images, keys, seed=3, epoch=1))
    assert not np.array_equal(first, cifar.augment(images, keys, seed=3, epoch=2))
    assert not np.array_equal(first, cifar.augment(images, keys, seed=4, epoch=1))


def test_augment_same_key_same_crop_whatever_the_batch():
    images, keys = TRAIN[0], np.arange(1000, 1050)
    whole = cifar.augment(images, keys, seed=5, epoch=9)
    perm = np.random.default_rng(0).permutation(50)
    assert np.array_equal(cifar.augment(images[perm], keys[perm], seed=5, epoch=9), whole[perm])
    for i in (0, 17, 49):
        alone = cifar.augment(images[i:i + 1], keys[i:i + 1], seed=5, epoch=9)
        assert np.array_equal(alone[0], whole[i])


def test_augment_flips_about_half_and_uses_every_shift():
    # Pixel value = column + 10: a row reads increasing unless flipped, and its value in
    # column 16 gives the horizontal shift dx (column 16 - dx, or 15 - dx once flipped).
    image = np.broadcast_to(np.arange(10, 42, dtype=np.uint8), (3, 32, 32))
    out = cifar.augment(np.broadcast_to(image, (1000, 3, 32, 32)), np.arange(1000), 0, 0)
    row = out[:, 0, 16].astype(int)      # row 16 is inside the image for every vertical shift
    steps = np.diff(row[:, 12:20], axis=1)   # columns 12..19 are inside for every shift
    flipped = (steps == -1).all(axis=1)
    assert ((steps == 1).all(axis=1) ^ flipped).all()
    assert 430 <= flipped.sum() <= 570
    shift = np.where(flipped, 25, 26) - row[:, 16]
    assert set(shift[flipped]) == set(shift[~flipped]) == set(range(-4, 5))


def test_augment_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"images \[B, 3, 32, 32\] and keys \[B\]"):
        cifar.augment(np.zeros((2, 32, 32, 3), np.uint8), np.arange(2), 0, 0)
    with pytest.raises(ValueError, match="keys"):
        cifar.augment(np.zeros((2, 3, 32, 32), np.uint8), np.arange(3), 0, 0)


def test_normalise_known_pixels():
    images = np.zeros((1, 3, 32, 32), np.uint8)
    images[0, 0, 0, 0], images[0, 1, 5, 7] = 255, 128
    out = cifar.normalise(images)
    assert out.dtype == np.float32 and out.shape == (1, 3, 32, 32)
    assert out[0, 0, 0, 0] == pytest.approx((1 - 0.4914) / 0.2470, rel=1e-5)
    assert out[0, 1, 5, 7] == pytest.approx((128 / 255 - 0.4822) / 0.2435, rel=1e-5)
    assert out[0, 2, 3, 3] == pytest.approx(-0.4465 / 0.2616, rel=1e-5)
