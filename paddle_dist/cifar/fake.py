"""Fake CIFAR-10 in the real on-disk layouts, for tests and tools, and its command line
(`python -m paddle_dist.cifar fake DIR [--form F] [--train N] [--test N] [--seed S]`).

Example:
    write_fake(Path("/tmp/c"), "batches-bin")   # /tmp/c/cifar-10-batches-bin
"""

import io
import pickle
import tarfile
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..options import ArgParser
from .layout import _PIXELS, ARCHIVE, BATCHES, BIN_DIR, FORMS, LABEL_NAMES, NUM_CLASSES, PY_DIR


def fake_arrays(num_train: int = 50, num_test: int = 10, seed: int = 0):
    """The images and labels write_fake writes: ((train_x, train_y), (test_x, test_y)),
    uint8 [N, 3, 32, 32] and int64 [N] with the classes as even as N allows.

    Example:
        (train_x, train_y), (test_x, test_y) = fake_arrays(50, 10, seed=0)
    """
    rng = np.random.default_rng(seed)

    def draw(n):
        images = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        return images, rng.permutation(np.arange(n) % NUM_CLASSES).astype(np.int64)

    return draw(num_train), draw(num_test)


def _fake_batches(num_train, num_test, seed):
    """fake_arrays as the real files hold them: [(batch name, data uint8 [n, 3072], labels)]."""
    (train_x, train_y), (test_x, test_y) = fake_arrays(num_train, num_test, seed)
    # The real train split is five batches in order; array_split keeps that for any size.
    parts = zip(np.array_split(train_x, 5), np.array_split(train_y, 5))
    batches = [(name, x, y) for name, (x, y) in zip(BATCHES["train"], parts)]
    batches.append(("test_batch", test_x, test_y))
    return [(name, x.reshape(len(x), _PIXELS), y) for name, x, y in batches]


def _pickles(batches):
    """{file name: bytes} of a batches-py directory: protocol 2 and bytes keys, as in the
    real Python 2 files."""
    files = {}
    for i, (name, x, y) in enumerate(batches):
        label = f"training batch {i + 1} of 5" if i < 5 else "testing batch 1 of 1"
        files[name] = pickle.dumps({
            b"batch_label": label.encode(), b"labels": y.tolist(), b"data": x,
            b"filenames": [f"fake_{i}_{j:05d}.png".encode() for j in range(len(y))]}, protocol=2)
    files["batches.meta"] = pickle.dumps({
        b"label_names": [n.encode() for n in LABEL_NAMES],
        b"num_cases_per_batch": len(batches[0][2]), b"num_vis": _PIXELS}, protocol=2)
    return files


def _write_tar(root, batches):
    path = root / ARCHIVE
    readme = b"<html><body>Fake CIFAR-10, written by paddle_dist.cifar</body></html>\n"
    files = {**_pickles(batches), "readme.html": readme}
    with tarfile.open(path, "w:gz") as tar:
        folder = tarfile.TarInfo(PY_DIR)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(folder)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{PY_DIR}/{name}")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def _write_py(root, batches):
    (root / PY_DIR).mkdir(exist_ok=True)
    for name, data in _pickles(batches).items():
        (root / PY_DIR / name).write_bytes(data)
    return root / PY_DIR


def _write_bin(root, batches):
    (root / BIN_DIR).mkdir(exist_ok=True)
    for name, x, y in batches:
        records = np.concatenate([y.astype(np.uint8)[:, None], x], axis=1)   # label byte first
        (root / BIN_DIR / f"{name}.bin").write_bytes(records.tobytes())
    (root / BIN_DIR / "batches.meta.txt").write_text("".join(f"{n}\n" for n in LABEL_NAMES))
    return root / BIN_DIR


def write_fake(root: Path, form: str, num_train: int = 50, num_test: int = 10, seed: int = 0) -> Path:
    """Write fake_arrays(num_train, num_test, seed) under `root` in the real layout of `form`
    and return the path to use as data.root.

    Example:
        write_fake(Path("/tmp/c"), "batches-bin")   # /tmp/c/cifar-10-batches-bin
    """
    if form not in FORMS:
        raise ValueError(f"unknown CIFAR-10 form {form!r}; use one of {', '.join(FORMS)}")
    if num_train < 5 or num_test < 1:
        raise ValueError(f"fake CIFAR-10 needs >= 5 train images (one per data batch) and >= 1 "
                         f"test image (got {num_train} and {num_test}); ask for more")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    writer = {"tar.gz": _write_tar, "batches-py": _write_py, "batches-bin": _write_bin}[form]
    return writer(root, _fake_batches(num_train, num_test, seed))


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m paddle_dist.cifar fake DIR [--form F] [--train N] [--test N] [--seed S]`.

    Example:
        main(["fake", "/tmp/c", "--form", "batches-py"])   # prints /tmp/c/cifar-10-batches-py
    """
    parser = ArgParser(prog="python -m paddle_dist.cifar", description="CIFAR-10 tools (numpy only).")
    commands = parser.add_subparsers(dest="command", required=True)
    fake = commands.add_parser("fake", help="write random CIFAR-10 data in a real on-disk layout")
    fake.add_argument("dir", help="where to write it (created if missing)")
    fake.add_argument("--form", choices=FORMS, default="tar.gz", help="on-disk form (default tar.gz)")
    fake.add_argument("--train", type=int, default=50, help="train images (default 50)")
    fake.add_argument("--test", type=int, default=10, help="test images (default 10)")
    fake.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        root = write_fake(Path(args.dir), args.form, args.train, args.test, args.seed)
    except (ValueError, OSError) as exc:
        fake.error(str(exc))
    print(root)
    return 0
