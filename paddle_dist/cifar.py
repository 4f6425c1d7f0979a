"""CIFAR-10 with numpy only (no paddle): find it in any of its three on-disk forms, read it,
download it, augment and normalise batches, and write fake copies for tests.

Like idx.py this never imports paddle, so the launcher can check (and download) the data
once, before any rank starts. Every problem with a data file raises DataError with one
line: which file, what is wrong, and how to fix it.

Example:
    images, labels = load_cifar10("", "test")   # Paddle's cache: uint8 [10000, 3, 32, 32], int64 [10000]
    x = normalise(augment(images[:8], np.arange(8), seed=0, epoch=1))   # float32 [8, 3, 32, 32]
"""

import argparse
import hashlib
import http.client
import io
import os
import pickle
import sys
import tarfile
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .errors import DataError

NUM_CLASSES = 10
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
LABEL_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# Where and what paddle.vision.datasets.Cifar10 downloads.
URL = "https://dataset.bj.bcebos.com/cifar/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
ARCHIVE = "cifar-10-python.tar.gz"
PY_DIR = "cifar-10-batches-py"
BIN_DIR = "cifar-10-batches-bin"
FORMS = ("tar.gz", "batches-py", "batches-bin")
BATCHES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}

_PIXELS = 3 * 32 * 32
_RECORD = 1 + _PIXELS           # a .bin record: the label byte, then 1024 R, 1024 G, 1024 B
_PAD = 4
_MARKERS = {"batches-py": ("data_batch_1", "test_batch"),
            "batches-bin": ("data_batch_1.bin", "test_batch.bin")}
_EXPECTED = (f"{ARCHIVE} (tar.gz), a {PY_DIR}/ directory with data_batch_1..data_batch_5 and "
             f"test_batch (batches-py), or a {BIN_DIR}/ directory with data_batch_1.bin.."
             "data_batch_5.bin and test_batch.bin (batches-bin)")
_FIX_MISSING = ("set data.root to one of them (or to the directory holding it), or leave data.root "
                f"empty to download {ARCHIVE} into ~/.cache/paddle/dataset/cifar")
_FIX_CORRUPT = ("replace it with an intact copy of CIFAR-10 (if it is Paddle's cached archive, "
                "delete it and leave data.root empty to download it again)")
_FIX_DOWNLOAD = f"check the network or proxy, or download {ARCHIVE} by hand and set data.root to it"
_PROGRESS_SECONDS = 5.0


def _error(where, what, fix=_FIX_CORRUPT):
    """A one-line DataError: the file, what is wrong with it, how to fix it."""
    return DataError(" ".join(f"{where}: {what}; {fix}".split()))


def default_root() -> Path:
    """Paddle's CIFAR cache, where paddle.vision.datasets.Cifar10 keeps cifar-10-python.tar.gz.

    Example:
        default_root()   # PosixPath('/home/me/.cache/paddle/dataset/cifar')
    """
    # Resolved at every call (Paddle does it once, at import), so a changed $HOME is honoured.
    return Path("~/.cache/paddle/dataset/cifar").expanduser()


# ------------------------------------------------------------------------------ finding
def _candidates(root):
    """(form, path) to try, in order. The archive comes first: Paddle's cache and
    download_cifar10 hold it, and it reads without extracting. Then the pickles it extracts
    to, then the binary version; each in root itself before in its usual subdirectory."""
    return [("tar.gz", root / ARCHIVE), ("batches-py", root), ("batches-py", root / PY_DIR),
            ("batches-bin", root), ("batches-bin", root / BIN_DIR)]


def _present(form, path):
    if form == "tar.gz":
        return path.is_file()
    return any((path / name).is_file() for name in _MARKERS[form])


def find_cifar10(root: str) -> tuple[str, Path]:
    """Return (form, path) of the CIFAR-10 copy at or under `root`; form is one of FORMS.

    Example:
        find_cifar10("data")   # ('batches-bin', PosixPath('data/cifar-10-batches-bin'))
    """
    root = Path(root).expanduser()
    if root.is_file():
        if root.name.endswith((".tar.gz", ".tgz")):
            return "tar.gz", root
        raise _error(f"data.root {root}", f"is a file but not a .tar.gz archive; expected {_EXPECTED}",
                     _FIX_MISSING)
    if not root.is_dir():
        raise _error(f"data.root {root}", f"does not exist; expected {_EXPECTED}", _FIX_MISSING)
    for form, path in _candidates(root):
        if _present(form, path):
            return form, path
    raise _error(f"data.root {root}", f"holds no CIFAR-10 data; expected {_EXPECTED}", _FIX_MISSING)


# ------------------------------------------------------------------------------ reading
class _Unpickler(pickle.Unpickler):
    """Unpickles only what CIFAR-10 batches contain. A pickle can call any importable function
    while it loads (os.system, eval...), so a hostile batch file could run code: every global
    it names must be in this list or loading stops before the name is even looked up."""

    # numpy's array reconstruction under its numpy 1 (the real files) and numpy 2 names;
    # _codecs.encode, how Python 3 writes bytes at protocol 2 (write_fake); plain builtin
    # types, whose Python 2 module is __builtin__.
    ALLOWED = frozenset(
        [(m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray")
         for n in ("_reconstruct", "scalar")]
        + [("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")]
        + [(m, n) for m in ("builtins", "__builtin__") for n in ("bool", "bytearray", "bytes", "complex",
           "dict", "float", "frozenset", "int", "list", "set", "slice", "str", "tuple")])

    def __init__(self, raw, where):
        super().__init__(io.BytesIO(raw), encoding="bytes")   # Python 2 pickles: str -> bytes
        self.where = where

    def find_class(self, module, name):
        if (module, name) not in self.ALLOWED:
            raise _error(self.where, f"refers to {module}.{name}, which a CIFAR-10 batch never "
                         "needs; refused to load it, as it could run code")
        return super().find_class(module, name)


def _check_batch(where, data, labels):
    """(data uint8 [n, 3072], labels int64 [n]) or DataError saying what is off."""
    try:
        data, labels = np.asarray(data), np.asarray(labels)
    except (ValueError, TypeError) as exc:
        raise _error(where, f"holds data or labels that are not arrays ({exc})") from exc
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise _error(where, f"holds data {data.dtype} {list(data.shape)}, not uint8 [N, 3072]")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise _error(where, f"holds labels {labels.dtype} {list(labels.shape)}, not integers [N]")
    if len(data) != len(labels):
        raise _error(where, f"has {len(data)} images but {len(labels)} labels")
    if not len(labels):
        raise _error(where, "holds no images")
    bad = labels[(labels < 0) | (labels >= NUM_CLASSES)]
    if bad.size:
        raise _error(where, f"has label {bad[0]}, not 0..9")
    return data, labels.astype(np.int64)


def _pickled_batch(where, raw):
    try:
        batch = _Unpickler(raw, where).load()
    except DataError:
        raise
    except Exception as exc:   # a damaged pickle fails in many ways: EOFError, KeyError, ValueError...
        raise _error(where, f"is not a readable pickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise _error(where, "is not a CIFAR-10 batch (no b'data' and b'labels' entries)")
    return _check_batch(where, batch[b"data"], batch[b"labels"])


def _binary_batch(where, raw):
    if not raw or len(raw) % _RECORD:
        raise _error(where, f"has {len(raw)} bytes, not a whole (non-zero) number of {_RECORD}-byte "
                     "records (1 label byte + 3072 pixel bytes)")
    records = np.frombuffer(raw, np.uint8).reshape(-1, _RECORD)
    return _check_batch(where, records[:, 1:], records[:, 0])


def _read_bytes(path):
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _error(path, f"cannot be read ({exc.strerror or exc})") from exc


def _read_tar(path, names):
    members, raw = {f"{PY_DIR}/{name}": name for name in names}, {}
    try:
        with tarfile.open(path, "r:gz") as tar:
            # One pass in archive order: opening members by name would seek the gzip stream
            # backwards, decompressing it again for every batch.
            for member in tar:
                name = members.get(os.path.normpath(member.name))
                if name and member.isfile():
                    raw[name] = tar.extractfile(member).read()
                if len(raw) == len(names):
                    break
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise _error(path, f"is a truncated or corrupt archive ({exc})") from exc
    for name in names:
        if name not in raw:
            raise _error(path, f"has no member {PY_DIR}/{name}, so it is not {ARCHIVE}")
    return [_pickled_batch(f"{path} (member {PY_DIR}/{name})", raw[name]) for name in names]


_READERS = {
    "tar.gz": _read_tar,
    "batches-py": lambda folder, names: [_pickled_batch(folder / n, _read_bytes(folder / n))
                                         for n in names],
    "batches-bin": lambda folder, names: [_binary_batch(folder / f"{n}.bin",
                                                        _read_bytes(folder / f"{n}.bin"))
                                          for n in names],
}


def load_cifar10(root: str, split: str, download: bool = True, *, url: str = URL,
                 md5: str = MD5) -> tuple[np.ndarray, np.ndarray]:
    """Load one split as (images uint8 [N, 3, 32, 32], labels int64 [N]); "train" is the five
    data batches in order, "test" the test batch. `root` "" means default_root(), where the
    archive is downloaded from `url` first when it has no CIFAR-10 and `download` is true.

    Example:
        images, labels = load_cifar10("data/cifar-10-batches-bin", "train")   # 50,000 images
    """
    if split not in BATCHES:
        raise DataError(f"unknown CIFAR-10 split {split!r}; use 'train' or 'test'")
    if not root:
        root = default_root()
        if download and not any(_present(form, path) for form, path in _candidates(root)):
            download_cifar10(root, url, md5)
    form, path = find_cifar10(root)
    parts = _READERS[form](path, BATCHES[split])
    images = np.concatenate([data for data, _ in parts]).reshape(-1, 3, 32, 32)
    return images, np.concatenate([labels for _, labels in parts])


# ------------------------------------------------------------------------------ download
def _progress(done, total):
    of = f" / {total / 1e6:.1f}" if total else ""
    print(f"cifar: downloaded {done / 1e6:.1f}{of} MB", file=sys.stderr, flush=True)


def _fetch(url, out):
    """Copy `url` into the open file `out`, with progress on stderr; return its md5."""
    digest, done, last = hashlib.md5(), 0, time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0)
            while chunk := response.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                done += len(chunk)
                if time.monotonic() - last >= _PROGRESS_SECONDS:
                    _progress(done, total)
                    last = time.monotonic()
    # URLError and socket errors are OSErrors; a bad URL is a ValueError.
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _error(f"downloading {url}", f"failed ({exc})", _FIX_DOWNLOAD) from exc
    _progress(done, total)
    return digest.hexdigest()


def download_cifar10(dest_dir: Path, url: str = URL, md5: str = MD5) -> Path:
    """Download the CIFAR-10 python archive into `dest_dir` and return its path.

    The bytes go to a temporary file that is renamed into place only once its md5 matches,
    so an interrupted download, or two ranks downloading at once, never leave a broken archive.

    Example:
        download_cifar10(default_root())   # .../cifar/cifar-10-python.tar.gz (163 MB)
    """
    dest_dir = Path(dest_dir).expanduser()
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{ARCHIVE}.", suffix=".part", dir=dest_dir)
    except OSError as exc:
        raise _error(dest_dir, f"cannot hold the download ({exc})",
                     "make it writable, or set data.root to a CIFAR-10 copy elsewhere") from exc
    print(f"cifar: downloading {url} to {dest_dir}", file=sys.stderr, flush=True)
    try:
        with os.fdopen(fd, "wb") as out:
            got = _fetch(url, out)
        if got != md5:
            raise _error(f"downloading {url}", f"gave a file with md5 {got}, expected {md5} (a cut "
                         "download, a proxy's error page or a changed file); nothing was saved",
                         "retry, or " + _FIX_DOWNLOAD)
        os.chmod(tmp, 0o644)   # mkstemp makes it private; the archive is ordinary data
        os.replace(tmp, dest_dir / ARCHIVE)   # atomic: readers see no archive or a whole one
    finally:
        Path(tmp).unlink(missing_ok=True)
    return dest_dir / ARCHIVE


# ------------------------------------------------------------------------------ augmenting
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


# ------------------------------------------------------------------------------ fake data
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


# ------------------------------------------------------------------------------ command line
class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line on stderr and exit 2, instead of argparse's usage block."""
        self.exit(2, " ".join(f"{self.prog}: error: {message} (see --help)".split()) + "\n")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m paddle_dist.cifar fake DIR [--form F] [--train N] [--test N] [--seed S]`.

    Example:
        main(["fake", "/tmp/c", "--form", "batches-py"])   # prints /tmp/c/cifar-10-batches-py
    """
    parser = _Parser(prog="python -m paddle_dist.cifar", description="CIFAR-10 tools (numpy only).")
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


if __name__ == "__main__":
    sys.exit(main())
