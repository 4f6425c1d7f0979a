"""Find CIFAR-10 in any of its three forms and read a split, refusing anything a real batch
never holds (a pickle may only name the few globals CIFAR-10 needs, so loading cannot run
code).

Example:
    images, labels = load_cifar10("", "test")   # Paddle's cache: uint8 [10000, 3, 32, 32], int64 [10000]
"""

import io
import os
import tarfile
import zlib
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..security.safepickle import ArraysOnly
from .download import download_cifar10
from .layout import (_EXPECTED, _FIX_MISSING, _MARKERS, _PIXELS, _RECORD, ARCHIVE, BATCHES, BIN_DIR, MD5,
                     NUM_CLASSES, PY_DIR, URL, _error, default_root)


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
        # Python 2 pickles: str -> bytes
        batch = ArraysOnly(io.BytesIO(raw), "bytes", lambda name: _error(
            where, f"refers to {name}, which a CIFAR-10 batch never needs; refused to load it, "
            "as it could run code")).load()
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
