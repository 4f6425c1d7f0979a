"""Unit tests for paddle_dist.cifar.fake: fake copies in the real layouts, and its command line
(`python -m paddle_dist.cifar fake`)."""

import pickle
import subprocess
import sys
import tarfile

import numpy as np
import pytest

from paddle_dist import cifar
from paddle_dist.errors import UserError

from tests.unit.cifar.test_cifar import REPO, TEST, TRAIN
from tests.unit.cifar.test_cifar import forms  # noqa: F401  (fixtures)


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


# --- command line ---------------------------------------------------------------------------

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
