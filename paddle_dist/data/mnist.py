"""MNIST's IDX files: find, read and check them, with numpy only (no paddle), so a
launcher can check the data before any rank starts without paying for `import paddle`.

Every problem with a data file raises DataError with one line: which file, what is wrong,
and how to fix it.

Example:
    images, labels = load_mnist("", "test")   # the bundled subset: uint8 [1000, 28, 28], int64 [1000]
"""

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError

MNIST_MEAN = 0.1307         # the training images' mean and standard deviation (of x / 255)
MNIST_STD = 0.3081

BUNDLED_MNIST = Path(__file__).parent / "bundled" / "mnist"
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_SIDE = 28
NUM_CLASSES = 10

_IDX_UBYTE = 0x08
_FIX_CORRUPT = "re-download it or point data.root at a directory with intact MNIST files"
_FIX_MISSING = (
    "set data.root to a directory holding the MNIST IDX files, "
    "or leave it empty for the bundled 4,000/1,000 subset"
)


def _read_payload(path):
    """Return the file's bytes, gunzipped when the name ends in .gz."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read {path} ({exc.strerror or exc}); {_FIX_CORRUPT}") from exc
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    # BadGzipFile is an OSError; a cut-off stream gives EOFError, bad deflate data zlib.error.
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataError(f"{path} is corrupted (gzip: {exc}); {_FIX_CORRUPT}") from exc


def read_idx(path):
    """Read an IDX file of unsigned bytes (gzip or raw) into a numpy uint8 array.

    Example:
        images = read_idx("train-images-idx3-ubyte.gz")   # shape (N, 28, 28)
    """
    path = Path(path)
    data = _read_payload(path)
    # Magic: two zero bytes, the element type (0x08 = uint8), the number of dimensions.
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != _IDX_UBYTE or not 1 <= data[3] <= 4:
        raise DataError(
            f"{path} is not a uint8 IDX file (magic bytes {data[:4].hex() or 'missing'}, "
            f"expected 000008 then 01..04); {_FIX_CORRUPT}"
        )
    ndim = data[3]
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise DataError(f"{path} is corrupted (header cut short); {_FIX_CORRUPT}")
    dims = struct.unpack(f">{ndim}I", data[4:offset])
    expected, got = math.prod(dims), len(data) - offset
    # A short payload means truncation; a long one means the header lies. Both are corrupt.
    if got != expected:
        raise DataError(
            f"{path} is corrupted (header says {expected} bytes of data for shape {dims}, "
            f"file has {got}); {_FIX_CORRUPT}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims).copy()


def _expected_names():
    return ", ".join(f"{stem}[.gz]" for pair in MNIST_FILES.values() for stem in pair)


def find_mnist_file(root, stem):
    """Return the path of `stem.gz` or `stem` in `root` (or in `root/mnist`, Paddle's cache layout).

    Example:
        find_mnist_file("~/.cache/paddle/dataset", "train-images-idx3-ubyte")
    """
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DataError(f"data.root {root} {what}; {_FIX_MISSING}")
    # paddle.vision.datasets.MNIST caches its downloads in ~/.cache/paddle/dataset/mnist.
    for folder in (root, root / "mnist"):
        for name in (f"{stem}.gz", stem):
            if (folder / name).is_file():
                return folder / name
    raise DataError(
        f"{stem}[.gz] not found in {root}; expected the files {_expected_names()}; {_FIX_MISSING}"
    )


def _check_mnist(images_path, images, labels_path, labels):
    """Raise DataError unless images are [N, 28, 28], labels [N] and every label is 0..9."""
    side = (MNIST_SIDE, MNIST_SIDE)
    if images.ndim != 3 or images.shape[1:] != side:
        raise DataError(
            f"{images_path} holds shape {images.shape}, not [N, 28, 28]; {_FIX_CORRUPT}"
        )
    if labels.ndim != 1:
        raise DataError(f"{labels_path} holds shape {labels.shape}, not [N]; {_FIX_CORRUPT}")
    if len(images) != len(labels):
        raise DataError(
            f"{images_path} has {len(images)} images but {labels_path} has {len(labels)} labels; "
            "use an images file and a labels file from the same MNIST split"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DataError(f"{labels_path} has label {labels.max()}, not 0..9; {_FIX_CORRUPT}")


def load_mnist(root, split):
    """Load one MNIST split as (images uint8 [N, 28, 28], labels int64 [N]).

    `root` "" or None means the bundled subset; `split` is "train" or "test".

    Example:
        images, labels = load_mnist("", "test")   # 1,000 bundled test digits
    """
    if split not in MNIST_FILES:
        raise DataError(f"unknown MNIST split {split!r}; use one of {sorted(MNIST_FILES)}")
    root = Path(root) if root else BUNDLED_MNIST
    images_path, labels_path = (find_mnist_file(root, stem) for stem in MNIST_FILES[split])
    images, labels = read_idx(images_path), read_idx(labels_path)
    _check_mnist(images_path, images, labels_path, labels)
    return images, labels.astype(np.int64)
