"""paddle_dist/train.py's command lines (train.py, `python -m paddle_dist.train`,
tools/spawn_train.py) refuse bad input with one line and exit 2 before any rank starts, run
here in this process. tests/integration/test_train_cli.py runs a few cases as real processes
(the exit-code path, and those that fail only in a rank)."""

import gzip
import shutil

import pytest

from paddle_dist import worker
from paddle_dist.launch import launcher
from paddle_dist.options import run
from paddle_dist.runs import rundir
from paddle_dist.train import spawn_main, train_main

from tests.conftest import REPO_ROOT
from tests.oracles import ending

BUNDLED = REPO_ROOT / "paddle_dist" / "data" / "bundled" / "mnist"
MAINS = {"train.py": train_main, "tools/spawn_train.py": spawn_main}


@pytest.fixture(autouse=True)
def nothing_starts(monkeypatch):
    """A case whose input passed every check would choose a run directory or start the job
    in this process: it fails instead."""
    def started(*args, **kwargs):
        raise AssertionError("the job got past its checks and would start")
    monkeypatch.setattr(worker, "main", started)
    monkeypatch.setattr(rundir, "choose", started)
    monkeypatch.setattr(launcher, "launch", started)


def _usage_error(capfd, args, *words):
    done = ending(capfd, lambda: run(MAINS[args[0]], args[1:]))
    assert done.code == 2, done.lines
    assert len(done.lines) == 1, done.lines
    for word in words:
        assert word in done.lines[0]
    return done.lines[0]


# train.amp=O2 and model.name=resnet18 on one process fail in the rank, which here would be
# this process: test_train_cli.py runs them.
@pytest.mark.parametrize("args,words", [
    (["train.py", "-c", "no_such.yaml"], ["no_such.yaml", "not found", "mnist_lenet"]),
    (["train.py", "-o", "train.epoch=3"], ["train.epoch", "train.epochs"]),
    (["train.py", "-o", "train.epochs=abc"], ["train.epochs", "integer"]),
    (["train.py", "-o", "model.name=resnet"], ["model.name", "lenet"]),
    (["tools/spawn_train.py", "--nprocs", "0"], ["--nprocs", ">= 1"]),
    (["tools/spawn_train.py", "--gpus", "0,x"], ["malformed", "'x'"]),
    (["tools/spawn_train.py", "--gpus", "0,0"], ["more than once"]),
    (["tools/spawn_train.py", "--gpus", ""], ["--gpus is empty"]),
    (["tools/spawn_train.py", "--nprocs", "two"], ["--nprocs", "two"]),
    (["train.py", "-o", "dist.nprocs=2", "-o", "dist.backend=nccl"], ["nccl needs GPUs"]),
    (["train.py", "-o", "train.lr=nan"], ["train.lr", "finite"]),
    (["train.py", "-c", "configs"], ["directory"]),
    (["train.py", "-o", "dist.nprocs=2", "-o", "data.root=/nonexistent/mnist"],
     ["/nonexistent/mnist", "data.root"]),
    # the pre-flight check, before any rank starts
    (["train.py", "-o", "dist.nprocs=2", "-o", "dist.nccl.socket_ifname=nosuch9"],
     ["nosuch9", "no interface", "lo"]),
    (["train.py", "-o", "dist.nprocs=2", "-o", "sync.compress=fp16"], ["fp16", "gloo", "bf16"]),
    (["train.py", "-o", "sync.mode=dataparallel", "-o", "sync.transport=shm"], ["sync.transport"]),
    # mixed precision: Paddle runs it on GPUs only (on CPU it would silently do nothing)
    (["train.py", "-o", "dist.nprocs=2", "-o", "train.amp=O1"], ["train.amp=O1", "GPU", "train.amp=off"]),
    (["train.py", "-o", "dist.nprocs=2", "-o", "data.name=cifar10", "-o", "model.name=resnet18",
      "-o", "data.root=/nonexistent/cifar"], ["/nonexistent/cifar", "cifar-10-python.tar.gz"]),
    (["train.py", "-o", "train.lr_schedule=step"], ["train.lr_milestones"]),
])
def test_bad_input_is_one_line_and_exit_2(capfd, args, words):
    _usage_error(capfd, args, *words)


def test_corrupted_data_file(capfd, tmp_path):
    for path in BUNDLED.glob("*.gz"):
        shutil.copy(path, tmp_path / path.name)
    victim = tmp_path / "train-images-idx3-ubyte.gz"
    victim.write_bytes(gzip.compress(gzip.decompress(victim.read_bytes())[:-100]))
    runs = tmp_path / "runs"
    _usage_error(capfd, ["train.py", "-o", "dist.nprocs=2", "-o", f"data.root={tmp_path}",
                         "-o", f"output.root={runs}"], "train-images-idx3-ubyte.gz")
    assert not runs.exists(), "a run directory was created for a job that never started"


def test_a_transport_with_no_entry_is_one_line_before_any_rank_starts(capfd, tmp_path):
    line = _usage_error(capfd, ["train.py", "-o", "dist.nprocs=2", "-o", "sync.transport=carrier_pigeon",
                                "-o", f"output.run_dir={tmp_path / 'run'}"])
    assert line == "error: sync.transport must be one of auto, shm, hierarchical, backend (got 'carrier_pigeon')"
    assert not (tmp_path / "run").exists()
