"""Unit tests for paddle_dist.cifar.download: the archive from a local HTTP server, md5-checked and
renamed into place when whole (into Paddle's cache when data.root is empty), or one line."""

import functools
import hashlib
import http.server
import threading
from pathlib import Path

import numpy as np
import pytest

from paddle_dist import cifar
from paddle_dist.errors import DataError

from tests.unit.cifar.test_cifar import TEST, TRAIN, assert_one_line_naming, closed_port_url


# --- download -----------------------------------------------------------------------------

class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def md5_of(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


@pytest.fixture
def served(tmp_path, monkeypatch):
    """A real HTTP server on 127.0.0.1 serving a fake archive: yields (url, md5)."""
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)   # the request must reach our server
    archive = cifar.write_fake(tmp_path / "www", "tar.gz")
    handler = functools.partial(QuietHandler, directory=str(archive.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{cifar.ARCHIVE}", md5_of(archive)
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_download_writes_the_archive_atomically(served, tmp_path, capsys):
    url, md5 = served
    dest = tmp_path / "cache" / "cifar"
    path = cifar.download_cifar10(dest, url=url, md5=md5)
    assert path == dest / cifar.ARCHIVE and md5_of(path) == md5
    assert [p.name for p in dest.iterdir()] == [cifar.ARCHIVE]   # no temporary file left
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert "MB" in capsys.readouterr().err
    assert np.array_equal(cifar.load_cifar10(str(path), "test")[0], TEST[0])


def test_concurrent_downloads_leave_one_whole_archive(served, tmp_path):
    url, md5 = served
    errors = []

    def fetch():
        try:
            cifar.download_cifar10(tmp_path / "d", url=url, md5=md5)
        except Exception as exc:   # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and [p.name for p in (tmp_path / "d").iterdir()] == [cifar.ARCHIVE]
    assert md5_of(tmp_path / "d" / cifar.ARCHIVE) == md5


def test_download_wrong_md5_leaves_nothing(served, tmp_path):
    url, _ = served
    dest = tmp_path / "d"
    with pytest.raises(DataError, match="expected 0123") as info:
        cifar.download_cifar10(dest, url=url, md5="0123" * 8)
    assert "\n" not in str(info.value) and "by hand" in str(info.value)
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("url", [closed_port_url, lambda: "http://127.0.0.1:1/x", lambda: "nope"],
                         ids=["closed-port", "port-1", "bad-url"])
def test_download_failure_is_a_data_error(tmp_path, url):
    url = url()
    with pytest.raises(DataError, match="failed") as info:
        cifar.download_cifar10(tmp_path / "d", url=url)
    assert_one_line_naming(info, url)
    assert "data.root" in str(info.value) and list((tmp_path / "d").iterdir()) == []


def test_download_404_is_a_data_error(served, tmp_path):
    url, md5 = served
    with pytest.raises(DataError, match="404"):
        cifar.download_cifar10(tmp_path / "d", url=url + ".missing", md5=md5)


def test_empty_root_downloads_into_paddles_cache_once(served, tmp_path, monkeypatch):
    url, md5 = served
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cifar.default_root() == tmp_path / "home" / ".cache" / "paddle" / "dataset" / "cifar"
    images, labels = cifar.load_cifar10("", "test", url=url, md5=md5)
    assert np.array_equal(images, TEST[0]) and np.array_equal(labels, TEST[1])
    assert (cifar.default_root() / cifar.ARCHIVE).is_file()
    # Cached now: an unreachable URL is never asked.
    images, _ = cifar.load_cifar10("", "train", url=closed_port_url(), md5=md5)
    assert np.array_equal(images, TRAIN[0])
