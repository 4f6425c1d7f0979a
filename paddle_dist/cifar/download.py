"""Download CIFAR-10's python archive (what paddle.vision.datasets.Cifar10 fetches), with
progress on stderr, checked by md5 and renamed into place only when whole.

Example:
    download_cifar10(default_root())   # .../cifar/cifar-10-python.tar.gz (163 MB)
"""

import hashlib
import http.client
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .layout import _FIX_DOWNLOAD, _PROGRESS_SECONDS, ARCHIVE, MD5, URL, _error


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
