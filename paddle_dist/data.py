"""Datasets: MNIST from IDX files (bundled 4,000/1,000 subset or a full copy) and synthetic data.

Every problem with a data file raises DataError with one line: which file, what is wrong,
and how to fix it.

Example:
    train = mnist_dataset("", "train")          # bundled subset, x [4000, 1, 28, 28]
    x, y = train.batch([0, 1, 2])               # y is int64 [3, 1]
"""

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import paddle

from .errors import DataError

BUNDLED_MNIST = Path(__file__).parent / "datasets" / "mnist"
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081
MNIST_SIDE = 28
NUM_CLASSES = 10

_IDX_UBYTE = 0x08
_FIX_CORRUPT = "re-download it or point data.root at a directory with intact MNIST files"
_FIX_MISSING = (
    "set data.root to a directory holding the MNIST IDX files, "
    "or leave it empty for the bundled 4,000/1,000 subset"
)
# The teacher behind the synthetic sets does not depend on `seed`, so seed=0 and seed=1
# give a train and a test set of the same task.
_TEACHER_SEED = 20240601


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


class ArrayDataset(paddle.io.Dataset):
    """In-memory samples: `x` float32 [N, ...] and `y` [N, ...].

    Classification labels are int64 [N, 1] (what CrossEntropyLoss and hapi's Accuracy
    take); regression targets are float32 [N, out_dim].

    Example:
        ds = ArrayDataset(np.zeros((4, 3)), np.zeros((4, 1), np.int64))
        x0, y0 = ds[0]; xb, yb = ds.batch([0, 2])
    """

    def __init__(self, x, y):
        super().__init__()
        x, y = np.asarray(x, dtype=np.float32), np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} samples but y has {len(y)}")
        self.x, self.y = x, y

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)

    def batch(self, indices):
        """Return (x[indices], y[indices]) with one fancy-indexing op per array."""
        idx = np.asarray(indices, dtype=np.int64)
        return self.x[idx], self.y[idx]


def mnist_dataset(root, split, flatten=False):
    """MNIST normalised with mean 0.1307 / std 0.3081: x float32 [N, 1, 28, 28] or [N, 784].

    Example:
        ds = mnist_dataset("", "train", flatten=True)   # x [4000, 784], y int64 [4000, 1]
    """
    images, labels = load_mnist(root, split)
    x = (images.astype(np.float32) / 255.0 - MNIST_MEAN) / MNIST_STD
    x = x.reshape(len(x), -1) if flatten else x[:, None]
    return ArrayDataset(x, labels.reshape(-1, 1))


def synthetic_classification(num_samples, shape=(1, 28, 28), num_classes=10, seed=0):
    """Gaussian inputs labelled by a fixed random linear teacher (argmax), so it is learnable.

    The same `seed` gives the same samples; the teacher depends only on shape and
    num_classes, so different seeds give a train and a test set of one task.

    Example:
        ds = synthetic_classification(256, shape=(20,), num_classes=4)   # y int64 [256, 1]
    """
    features = math.prod(shape)
    teacher = np.random.RandomState(_TEACHER_SEED).standard_normal((features, num_classes))
    x = np.random.RandomState(seed).standard_normal((num_samples, *shape)).astype(np.float32)
    labels = np.argmax(x.reshape(num_samples, features) @ teacher, axis=1)
    return ArrayDataset(x, labels.astype(np.int64).reshape(-1, 1))


def linear_regression(num_samples, in_dim=10, out_dim=1, seed=0, noise=0.01):
    """x ~ N(0, 1) [N, in_dim], y = x @ W + b + noise [N, out_dim], all float32.

    W and b depend only on the dims (like the classification teacher); `seed` picks samples.

    Example:
        ds = linear_regression(128, in_dim=3, out_dim=2, seed=1)
    """
    teacher = np.random.RandomState(_TEACHER_SEED)
    weights, bias = teacher.standard_normal((in_dim, out_dim)), teacher.standard_normal(out_dim)
    rng = np.random.RandomState(seed)
    x = rng.standard_normal((num_samples, in_dim))
    y = x @ weights + bias + noise * rng.standard_normal((num_samples, out_dim))
    return ArrayDataset(x.astype(np.float32), y.astype(np.float32))
