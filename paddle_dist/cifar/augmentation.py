"""Augment and normalise CIFAR-10 batches: a seeded crop and flip per sample that depends on
(seed, epoch, sample) only, and per-channel normalisation.

Example:
    x = normalise(augment(images[:8], np.arange(8), seed=0, epoch=1))   # float32 [8, 3, 32, 32]
"""

import numpy as np

from .layout import _PAD, MEAN, STD


def _splitmix64(x):
    """splitmix64 on a uint64 array (wrapping arithmetic): nearby inputs, unrelated outputs."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _sample_bits(keys, seed, epoch):
    """64 random bits per key that depend on (seed, epoch, key) only: a counter-based hash
    has no generator state, so batch composition, rank, world size and resume point cannot
    change them."""
    mask = (1 << 64) - 1
    base = _splitmix64(np.array([seed & mask], dtype=np.uint64))
    base = _splitmix64(base ^ np.uint64(epoch & mask))
    return _splitmix64(base ^ keys.astype(np.uint64))


def augment(images: np.ndarray, keys: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Random 32x32 crop of each image zero-padded by 4 pixels, then a horizontal flip with
    probability 1/2. A sample's crop and flip are a pure function of (seed, epoch, key), its
    key being its index in the dataset: the same in any batch, on any rank, after a resume,
    and different in another epoch or with another seed.

    Example:
        out = augment(images[idx], idx, seed=2024, epoch=3)   # uint8 [B, 3, 32, 32]
    """
    images, keys = np.asarray(images), np.asarray(keys, dtype=np.int64)
    if images.ndim != 4 or images.shape[1:] != (3, 32, 32) or keys.shape != images.shape[:1]:
        raise ValueError(f"augment needs images [B, 3, 32, 32] and keys [B], got {images.shape} "
                         f"and {keys.shape}; pass a batch of CIFAR-10 images and their indices")
    bits = _sample_bits(keys, seed, epoch)
    # Disjoint bits, so the three choices are independent: the low 32 pick the crop's top
    # row in the padded image (0..8), the next 31 its left column, the top bit the flip.
    top = ((bits & np.uint64(0xFFFFFFFF)) % np.uint64(9)).astype(np.intp)
    left = (((bits >> np.uint64(32)) & np.uint64(0x7FFFFFFF)) % np.uint64(9)).astype(np.intp)
    flip = (bits >> np.uint64(63)).astype(bool)
    side = np.arange(32)
    rows = top[:, None] + side
    cols = left[:, None] + np.where(flip[:, None], side[::-1], side)   # flipped: read right to left
    padded = np.pad(images, ((0, 0), (0, 0), (_PAD, _PAD), (_PAD, _PAD)))
    batch, channel = np.arange(len(images))[:, None, None, None], np.arange(3)[:, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def normalise(images: np.ndarray, mean=MEAN, std=STD) -> np.ndarray:
    """uint8 [B, C, H, W] -> float32: /255, minus `mean`, divided by `std`, per channel
    (CIFAR-10's by default).

    Example:
        normalise(np.full((1, 3, 32, 32), 255, np.uint8))[0, :, 0, 0]   # [2.059, 2.128, 2.116]
    """
    mean = np.asarray(mean, np.float32).reshape(-1, 1, 1)
    std = np.asarray(std, np.float32).reshape(-1, 1, 1)
    return (np.asarray(images, np.float32) / np.float32(255) - mean) / std
