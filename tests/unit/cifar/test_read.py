"""Unit tests for paddle_dist.cifar.read: finding a copy of CIFAR-10 in any of its three forms and
reading a split, every problem with a file one line naming it, and no pickle runs code."""

import io
import os
import pickle
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from paddle_dist import cifar
from paddle_dist.errors import DataError

from tests.unit.cifar.test_cifar import TEST, TRAIN, assert_one_line_naming, closed_port_url
from tests.unit.cifar.test_cifar import forms  # noqa: F401  (fixtures)


SPLITS = {"train": TRAIN, "test": TEST}


def copy_form(forms, form, dest):
    """A private copy of one written form under `dest`, safe to damage; returns its data.root."""
    src = forms[form]
    if src.is_file():
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy(src, dest / src.name))
    return Path(shutil.copytree(src, dest / src.name))


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


def test_empty_root_without_download_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DataError, match="does not exist") as info:
        cifar.load_cifar10("", "test", download=False, url=closed_port_url())
    assert_one_line_naming(info, cifar.default_root())
