"""Unit tests for paddle_dist.cifar: real files in tmp_path, a real HTTP server on 127.0.0.1."""

import functools
import hashlib
import http.server
import io
import os
import pickle
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest

from paddle_dist import cifar
from paddle_dist.errors import DataError, UserError

REPO = Path(__file__).resolve().parents[3]
TRAIN, TEST = cifar.fake_arrays(50, 10, seed=0)
SPLITS = {"train": TRAIN, "test": TEST}


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """{form: the data.root write_fake returned}, each in its own directory, written once."""
    base = tmp_path_factory.mktemp("forms")
    return {form: cifar.write_fake(base / form.replace(".", "_"), form) for form in cifar.FORMS}


def copy_form(forms, form, dest):
    """A private copy of one written form under `dest`, safe to damage; returns its data.root."""
    src = forms[form]
    if src.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(src, dest / src.name))
    return Path(shutil.copytree(src, dest / src.name))


def assert_one_line_naming(info, path):
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message


def batch_pickle(**entries):
    return pickle.dumps({k.encode(): v for k, v in entries.items()}, protocol=2)


def py2_pickle(data, labels):
    """The bytes Python 2's cPickle wrote for a real batch (protocol 2, numpy 1 module names,
    str as BINSTRING), built opcode by opcode, since Python 3 cannot write them."""
    def short(b):
        return b"U" + bytes([len(b)]) + b    # SHORT_BINSTRING
    raw = data.tobytes()
    dtype = (b"cnumpy\ndtype\n" + short(b"u1") + b"K\x00K\x01\x87R"
             + b"(K\x03" + short(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + short(b"b")
             + b"\x87R(K\x01J" + struct.pack("<i", len(data)) + b"M\x00\x0c\x86" + dtype
             + b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb")
    label_list = b"](" + b"".join(b"K" + bytes([int(y)]) for y in labels) + b"e"
    return b"\x80\x02}(" + short(b"data") + array + short(b"labels") + label_list + b"u."


# --- the three forms agree ----------------------------------------------------------------

def roots(forms, form):
    """Every kind of data.root that must find `form`: the form's own path and its parent."""
    return [forms[form], forms[form].parent]


@pytest.mark.parametrize("form", cifar.FORMS)
@pytest.mark.parametrize("split", ["train", "test"])
def test_every_form_and_root_reads_the_ground_truth(forms, form, split):
    want_x, want_y = SPLITS[split]
    for root in roots(forms, form):
        assert cifar.find_cifar10(str(root)) == (form, forms[form])
        images, labels = cifar.load_cifar10(str(root), split)
        assert images.dtype == np.uint8 and images.shape == (len(want_x), 3, 32, 32)
        assert labels.dtype == np.int64 and labels.shape == (len(want_x),)
        assert np.array_equal(images, want_x) and np.array_equal(labels, want_y)
        assert images.flags.writeable


def test_fake_data_is_reproducible_and_seeded():
    again = cifar.fake_arrays(50, 10, seed=0)
    other = cifar.fake_arrays(50, 10, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(TRAIN + TEST, again[0] + again[1]))
    assert not np.array_equal(TRAIN[0], other[0][0])
    assert np.bincount(TRAIN[1]).tolist() == [5] * 10


def test_fake_files_have_the_real_layout(forms):
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    with tarfile.open(forms["tar.gz"]) as tar:
        members = set(tar.getnames())
    assert members == {cifar.PY_DIR} | {f"{cifar.PY_DIR}/{n}" for n in names + ["readme.html"]}
    assert forms["tar.gz"].name == "cifar-10-python.tar.gz"
    assert sorted(p.name for p in forms["batches-py"].iterdir()) == sorted(names)
    assert forms["batches-py"].name == "cifar-10-batches-py"
    bins = [f"{n}.bin" for n in names[:6]] + ["batches.meta.txt"]
    assert sorted(p.name for p in forms["batches-bin"].iterdir()) == sorted(bins)
    # 50 train images over 5 batches of 10 records of 3073 bytes each.
    assert (forms["batches-bin"] / "data_batch_3.bin").stat().st_size == 10 * 3073
    first = np.frombuffer((forms["batches-bin"] / "data_batch_1.bin").read_bytes()[:3073], np.uint8)
    assert first[0] == TRAIN[1][0] and np.array_equal(first[1:1025], TRAIN[0][0, 0].ravel())
    meta = pickle.loads((forms["batches-py"] / "batches.meta").read_bytes())
    assert meta[b"label_names"][0] == b"airplane" and meta[b"num_vis"] == 3072


def test_python2_pickles_as_in_the_real_archive_load(tmp_path):
    folder = tmp_path / cifar.PY_DIR
    folder.mkdir()
    x, y = TEST[0].reshape(10, -1), TEST[1]
    (folder / "test_batch").write_bytes(py2_pickle(x, y))
    images, labels = cifar.load_cifar10(str(tmp_path), "test")
    assert np.array_equal(images, TEST[0]) and np.array_equal(labels, TEST[1])


# --- finding ------------------------------------------------------------------------------

def test_find_order_archive_then_pickles_then_binary(forms, tmp_path):
    for form in cifar.FORMS:
        copy_form(forms, form, tmp_path)
    expected = [("tar.gz", tmp_path / cifar.ARCHIVE), ("batches-py", tmp_path / cifar.PY_DIR),
                ("batches-bin", tmp_path / cifar.BIN_DIR)]
    for form, path in expected:
        assert cifar.find_cifar10(str(tmp_path)) == (form, path)
        path.unlink() if path.is_file() else shutil.rmtree(path)


def test_find_prefers_root_itself_to_its_subdirectory(forms, tmp_path):
    root = copy_form(forms, "batches-bin", tmp_path)
    copy_form(forms, "batches-bin", root)     # a nested copy must not win over root itself
    assert cifar.find_cifar10(str(root)) == ("batches-bin", root)


def test_nothing_found_names_the_expected_files(tmp_path):
    with pytest.raises(DataError, match="holds no CIFAR-10 data") as info:
        cifar.find_cifar10(str(tmp_path))
    assert_one_line_naming(info, tmp_path)
    for name in (cifar.ARCHIVE, cifar.PY_DIR, cifar.BIN_DIR, "data_batch_1", "test_batch.bin",
                 "data.root"):
        assert name in str(info.value)


def test_missing_root_and_wrong_file(tmp_path):
    with pytest.raises(DataError, match="does not exist") as info:
        cifar.load_cifar10(str(tmp_path / "nowhere"), "train")
    assert_one_line_naming(info, tmp_path / "nowhere")
    other = tmp_path / "data.zip"
    other.write_bytes(b"PK")
    with pytest.raises(DataError, match="not a .tar.gz archive") as info:
        cifar.find_cifar10(str(other))
    assert_one_line_naming(info, other)


def test_unknown_split(forms):
    with pytest.raises(DataError, match="use 'train' or 'test'"):
        cifar.load_cifar10(str(forms["batches-bin"]), "val")


# --- corrupt data -------------------------------------------------------------------------

def damage_bin(root, name, change):
    path = root / f"{name}.bin"
    path.write_bytes(change(path.read_bytes()))
    return path


def damage_py(root, name, payload):
    path = root / name
    path.write_bytes(payload)
    return path


x10 = TRAIN[0][:10].reshape(10, -1)
BIN_CASES = {
    "not-whole-records": ("data_batch_2", lambda b: b + b"\0", "not a whole"),
    "empty": ("data_batch_1", lambda b: b"", "has 0 bytes"),
    "label-10": ("test_batch", lambda b: b"\x0a" + b[1:], "has label 10"),
}
PY_CASES = {
    "no-labels": ("data_batch_4", batch_pickle(data=x10), "no b'data' and b'labels'"),
    "not-a-dict": ("data_batch_1", pickle.dumps([1, 2], protocol=2), "not a CIFAR-10 batch"),
    "length-mismatch": ("data_batch_3", batch_pickle(data=x10, labels=[1] * 9), "10 images but 9"),
    "label-negative": ("data_batch_1", batch_pickle(data=x10, labels=[-1] * 10), "has label -1"),
    "label-12": ("data_batch_5", batch_pickle(data=x10, labels=[12] * 10), "has label 12"),
    "wrong-shape": ("data_batch_1", batch_pickle(data=x10[:, :1024], labels=[1] * 10), "not uint8"),
    "float-data": ("data_batch_1", batch_pickle(data=x10 / 2, labels=[1] * 10), "not uint8"),
    "str-labels": ("data_batch_1", batch_pickle(data=x10, labels=["a"] * 10), "not integers"),
    "garbage": ("data_batch_2", b"not a pickle at all", "not a readable pickle"),
    "cut-pickle": ("data_batch_2", batch_pickle(data=x10, labels=[1] * 10)[:5000], "not a readable"),
}


@pytest.mark.parametrize("case", BIN_CASES)
def test_corrupt_binary_batch(forms, tmp_path, case):
    name, change, words = BIN_CASES[case]
    root = copy_form(forms, "batches-bin", tmp_path)
    path = damage_bin(root, name, change)
    split = "test" if name == "test_batch" else "train"
    with pytest.raises(DataError, match=words) as info:
        cifar.load_cifar10(str(root), split)
    assert_one_line_naming(info, path)


@pytest.mark.parametrize("case", PY_CASES)
def test_corrupt_pickled_batch(forms, tmp_path, case):
    name, payload, words = PY_CASES[case]
    root = copy_form(forms, "batches-py", tmp_path)
    path = damage_py(root, name, payload)
    with pytest.raises(DataError, match=words) as info:
        cifar.load_cifar10(str(root), "train")
    assert_one_line_naming(info, path)


@pytest.mark.parametrize("form, name", [("batches-py", "data_batch_3"),
                                        ("batches-bin", "data_batch_3.bin")])
def test_missing_batch_file(forms, tmp_path, form, name):
    root = copy_form(forms, form, tmp_path)
    (root / name).unlink()
    with pytest.raises(DataError, match="cannot be read") as info:
        cifar.load_cifar10(str(root), "train")
    assert_one_line_naming(info, root / name)


@pytest.mark.parametrize("cut, words", [
    (lambda b: b[: len(b) // 2], "truncated or corrupt"),
    (lambda b: b"this is not gzip data" * 10, "truncated or corrupt"),
    (lambda b: b[:100] + bytes(200) + b[300:], "truncated or corrupt"),
], ids=["truncated", "not-gzip", "zeroed-bytes"])
def test_corrupt_archive(forms, tmp_path, cut, words):
    path = copy_form(forms, "tar.gz", tmp_path)
    path.write_bytes(cut(path.read_bytes()))
    with pytest.raises(DataError, match=words) as info:
        cifar.load_cifar10(str(path), "train")
    assert_one_line_naming(info, path)


def test_archive_without_a_batch(tmp_path):
    path = tmp_path / cifar.ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{cifar.PY_DIR}/data_batch_1")
        tar.addfile(info)   # empty; test_batch missing altogether
    with pytest.raises(DataError, match="has no member cifar-10-batches-py/test_batch") as info:
        cifar.load_cifar10(str(tmp_path), "test")
    assert_one_line_naming(info, path)


def test_corrupt_member_names_the_member(forms, tmp_path):
    path = tmp_path / cifar.ARCHIVE
    data = b"garbage"
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{cifar.PY_DIR}/test_batch")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError, match="member cifar-10-batches-py/test_batch") as info:
        cifar.load_cifar10(str(path), "test")
    assert_one_line_naming(info, path)


# --- the restricted unpickler -------------------------------------------------------------

class Payload:
    """Unpickling this calls `func(*args)`: what a hostile batch file would do."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("make", [
    lambda marker: Payload(os.system, f"touch {marker}"),
    lambda marker: Payload(eval, f"open({str(marker)!r}, 'w').close()"),
    lambda marker: Payload(subprocess.call, ["touch", str(marker)]),
], ids=["os.system", "eval", "subprocess.call"])
@pytest.mark.parametrize("form", ["batches-py", "tar.gz"])
def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path, make, form):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({b"data": make(marker), b"labels": [1]}, protocol=2)
    folder = tmp_path / cifar.PY_DIR
    folder.mkdir()
    path = damage_py(folder, "test_batch", payload)
    if form == "tar.gz":
        path = tmp_path / cifar.ARCHIVE
        with tarfile.open(path, "w:gz") as tar:
            tar.add(folder / "test_batch", f"{cifar.PY_DIR}/test_batch")
        shutil.rmtree(folder)
    with pytest.raises(DataError, match="refused to load it") as info:
        cifar.load_cifar10(str(tmp_path), "test")
    assert_one_line_naming(info, path)
    assert not marker.exists()


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


def closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/{cifar.ARCHIVE}"


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


def test_empty_root_without_download_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DataError, match="does not exist") as info:
        cifar.load_cifar10("", "test", download=False, url=closed_port_url())
    assert_one_line_naming(info, cifar.default_root())


# --- augmentation -------------------------------------------------------------------------

def candidates(image):
    """All 162 results augment may give for `image`: shift by (dy, dx) in -4..4 with zero fill,
    unflipped then flipped; returns (array [162, 3, 32, 32], [(dy, dx, flipped)])."""
    padded = np.pad(image, ((0, 0), (4, 4), (4, 4)))
    out, labels = [], []
    for dy in range(-4, 5):
        for dx in range(-4, 5):
            shifted = padded[:, 4 - dy:36 - dy, 4 - dx:36 - dx]
            out += [shifted, shifted[:, :, ::-1]]
            labels += [(dy, dx, False), (dy, dx, True)]
    return np.stack(out), labels


def test_augment_is_a_shift_and_maybe_a_flip_of_each_sample():
    images = np.random.default_rng(1).integers(1, 256, (100, 3, 32, 32), dtype=np.uint8)
    before = images.copy()
    out = cifar.augment(images, np.arange(100), seed=7, epoch=0)
    assert out.dtype == np.uint8 and out.shape == images.shape
    assert np.array_equal(images, before)   # the input is not modified
    seen = set()
    for image, result in zip(images, out):
        options, labels = candidates(image)
        matches = [labels[i] for i in np.flatnonzero((options == result).all(axis=(1, 2, 3)))]
        assert len(matches) == 1, matches
        seen.add(matches[0])
    assert len({(dy, dx) for dy, dx, _ in seen}) > 30 and {f for _, _, f in seen} == {False, True}


def test_augment_is_deterministic_and_depends_on_epoch_and_seed():
    images, keys = TRAIN[0], np.arange(50)
    first = cifar.augment(images, keys, seed=3, epoch=1)
    assert np.array_equal(first, cifar.augment(images, keys, seed=3, epoch=1))
    assert not np.array_equal(first, cifar.augment(images, keys, seed=3, epoch=2))
    assert not np.array_equal(first, cifar.augment(images, keys, seed=4, epoch=1))


def test_augment_same_key_same_crop_whatever_the_batch():
    images, keys = TRAIN[0], np.arange(1000, 1050)
    whole = cifar.augment(images, keys, seed=5, epoch=9)
    perm = np.random.default_rng(0).permutation(50)
    assert np.array_equal(cifar.augment(images[perm], keys[perm], seed=5, epoch=9), whole[perm])
    for i in (0, 17, 49):
        alone = cifar.augment(images[i:i + 1], keys[i:i + 1], seed=5, epoch=9)
        assert np.array_equal(alone[0], whole[i])


def test_augment_flips_about_half_and_uses_every_shift():
    # Pixel value = column + 10: a row reads increasing unless flipped, and its value in
    # column 16 gives the horizontal shift dx (column 16 - dx, or 15 - dx once flipped).
    image = np.broadcast_to(np.arange(10, 42, dtype=np.uint8), (3, 32, 32))
    out = cifar.augment(np.broadcast_to(image, (1000, 3, 32, 32)), np.arange(1000), 0, 0)
    row = out[:, 0, 16].astype(int)      # row 16 is inside the image for every vertical shift
    steps = np.diff(row[:, 12:20], axis=1)   # columns 12..19 are inside for every shift
    flipped = (steps == -1).all(axis=1)
    assert ((steps == 1).all(axis=1) ^ flipped).all()
    assert 430 <= flipped.sum() <= 570
    shift = np.where(flipped, 25, 26) - row[:, 16]
    assert set(shift[flipped]) == set(shift[~flipped]) == set(range(-4, 5))


def test_augment_rejects_wrong_shapes():
    with pytest.raises(ValueError, match=r"images \[B, 3, 32, 32\] and keys \[B\]"):
        cifar.augment(np.zeros((2, 32, 32, 3), np.uint8), np.arange(2), 0, 0)
    with pytest.raises(ValueError, match="keys"):
        cifar.augment(np.zeros((2, 3, 32, 32), np.uint8), np.arange(3), 0, 0)


def test_normalise_known_pixels():
    images = np.zeros((1, 3, 32, 32), np.uint8)
    images[0, 0, 0, 0], images[0, 1, 5, 7] = 255, 128
    out = cifar.normalise(images)
    assert out.dtype == np.float32 and out.shape == (1, 3, 32, 32)
    assert out[0, 0, 0, 0] == pytest.approx((1 - 0.4914) / 0.2470, rel=1e-5)
    assert out[0, 1, 5, 7] == pytest.approx((128 / 255 - 0.4822) / 0.2435, rel=1e-5)
    assert out[0, 2, 3, 3] == pytest.approx(-0.4465 / 0.2616, rel=1e-5)


# --- command line and imports -------------------------------------------------------------

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "paddle_dist.cifar", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_data_that_loads(tmp_path):
    done = run_cli("fake", str(tmp_path / "c"), "--form", "batches-bin", "--train", "20",
                   "--test", "5", "--seed", "3")
    assert done.returncode == 0, done.stderr
    root = done.stdout.strip()
    assert root == str(tmp_path / "c" / cifar.BIN_DIR)
    (train_x, train_y), (test_x, test_y) = cifar.fake_arrays(20, 5, seed=3)
    images, labels = cifar.load_cifar10(root, "test")
    assert np.array_equal(images, test_x) and np.array_equal(labels, test_y)
    assert np.array_equal(cifar.load_cifar10(root, "train")[0], train_x)


def test_cli_bad_form_is_one_line_exit_2(tmp_path):
    done = run_cli("fake", str(tmp_path), "--form", "zip")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "invalid choice: 'zip'" in done.stderr


@pytest.mark.parametrize("args, words", [
    (["fake", "DIR", "--train", "2"], ">= 5 train images"),
    (["fake", "DIR", "--test", "x"], "invalid int value"),
    (["fake", "FILE"], "File exists"),
    ([], "required"),
])
def test_cli_usage_errors(tmp_path, capsys, args, words):
    (tmp_path / "file").write_text("")
    args = [{"DIR": str(tmp_path / "d"), "FILE": str(tmp_path / "file")}.get(a, a) for a in args]
    with pytest.raises(UserError) as info:       # options.run: one line on stderr, exit 2
        cifar.main(args)
    said = str(info.value)
    assert said.startswith("python -m paddle_dist.cifar") and "\n" not in said and words in said, said


def test_import_does_not_import_paddle():
    code = "import paddle_dist.cifar, sys; assert 'paddle' not in sys.modules, 'paddle imported'"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
