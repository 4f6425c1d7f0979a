"""Hangs that explain themselves: a rank frozen by SIGSTOP mid-training, a rank that skips
an all-reduce, and a rank that is only slow. The first two end the job with exit 4 within
`dist.hang_timeout` + 15 s, with a report naming the rank to blame and the collective the
others wait in; the slow one ends normally. When gloo's own 30 s timeout comes first, the
rank it ends names the rank to blame just the same.

Each job runs in its own session (tests/integration/procs.py) and the test fails if any
process of it is left, the ranks' watchdogs included.
"""

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from .procs import check, finish, run, start

HANG_S = 5
ENDS_WITHIN_S = HANG_S + 15       # the bound a hung job must end in, once hung
MLP = ["-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=32", "-o", "train.epochs=20"]
OWN_FIT = "tests/integration/scripts/own_fit.py"


def _train_py(tmp: Path, ranks: int):
    return ["train.py", "-o", f"dist.nprocs={ranks}", *MLP, "-o", f"dist.hang_timeout={HANG_S}",
            "-o", f"output.run_dir={tmp / 'run'}"], tmp / "run"


def _own_script(tmp: Path, ranks: int, *extra: str):
    (tmp / "out").mkdir()
    return ["-m", "paddle_dist.launch", "--nprocs", str(ranks), "--log_dir", str(tmp / "log"), OWN_FIT,
            "--out", str(tmp / "out"), "--root", str(tmp / "runs"), "--epochs", "40",
            "--override", f"dist.hang_timeout={HANG_S}", *extra], tmp / "runs"


def _status(run_dir: Path):
    """Every rank's status record, by rank ({} until the run directory has them)."""
    found = {}
    try:
        paths = list(run_dir.glob("**/status/rank*.json"))
    except OSError:                # a directory went while it was read (the run's set-up)
        return found
    for path in paths:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):     # being replaced right now
            continue
        found[record["rank"]] = record
    return found


def _wait_for_step(proc, run_dir: Path, ranks: int, step: int) -> dict:
    """Poll the job's own status records until every rank is past `step` (the event)."""
    while proc.poll() is None:
        status = _status(run_dir)
        if len(status) == ranks and all(r["step"] >= step for r in status.values()):
            return status
        time.sleep(0.05)
    raise AssertionError(f"the job ended (exit {proc.returncode}) before step {step}:\n{proc.stderr.read()[-3000:]}")


def _watchdogs_of(pids) -> list:
    """Hang watchdogs (paddle_dist/runtime/_deadline.py --heartbeat PID ...) of these ranks still
    alive after a short grace: each must end when its rank does."""
    def alive():
        found = []
        for entry in Path("/proc").iterdir():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--heartbeat" in argv and argv[argv.index(b"--heartbeat") + 1].decode() in pids:
                found.append(int(entry.name))
        return found
    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive()


def _stop_one_rank(args, run_dir: Path, ranks: int, victim: int, ends_within: float = HANG_S + ENDS_WITHIN_S):
    proc, killer = start(args, limit=240)
    status = _wait_for_step(proc, run_dir, ranks, 10)
    pids = {str(r["pid"]) for r in status.values()}
    os.kill(status[victim]["pid"], signal.SIGSTOP)
    try:
        out, err = finish(proc, killer, timeout=ends_within)   # hung after HANG_S, then ended
    finally:
        with_left = _watchdogs_of(pids)
        for pid in with_left:
            os.kill(pid, signal.SIGKILL)
    assert not with_left, f"watchdogs left behind: {with_left}"
    return proc.returncode, err, _status(run_dir)


def _stopped_rank_named(args, run_dir: Path, ranks: int, victim: int):
    """SIGSTOP `victim` mid-run: exit 4, the report names it, lists every other rank as
    waiting in a collective (not always the same one: a rank stopped after its part of
    one lets some peers through to the next; an all-reduce of gradients or metrics, or the
    all-gather of the weights check at a checkpoint), and its record says hung. Returns
    the report's root-cause line and the status records."""
    code, err, status = _stop_one_rank(args, run_dir, ranks, victim)
    assert code == 4, err
    cause = next(line for line in err.splitlines() if "Root cause:" in line)
    assert f"Root cause: rank {victim} stopped by a signal (process state T)" in cause, err
    for rank in set(range(ranks)) - {victim}:
        assert re.search(rf"\branks? (\d+, )*{rank}(, \d+)* in all-(reduce|gather)( in backward)? #", cause), \
            (rank, cause)
    assert status[victim]["state"] == "hung"
    return cause, status


@pytest.mark.parametrize("ranks, victim", [(2, 1), (3, 1)])
def test_a_stopped_rank_of_train_py_is_named_with_what_the_others_wait_in(ranks, victim, tmp_path):
    args, run_dir = _train_py(tmp_path, ranks)
    cause, status = _stopped_rank_named(args, run_dir, ranks, victim)
    assert status[victim]["message"] in cause


@pytest.mark.parametrize("ranks, victim", [(2, 1), (3, 2)])
def test_a_stopped_rank_of_a_users_fit_script_is_named(ranks, victim, tmp_path):
    args, runs = _own_script(tmp_path, ranks)
    _stopped_rank_named(args, runs, ranks, victim)


@pytest.mark.compat           # the training code's own paddle.distributed calls are marked
@pytest.mark.waits
def test_a_rank_that_skips_an_all_reduce_is_named_as_the_odd_one(tmp_path):
    """own_fit.py's model all-reduces a statistic in every training forward; rank 1
    skips it at step 12 and goes on to the gradients' all-reduce."""
    args, runs = _own_script(tmp_path, 3, "--skip-allreduce", "1:12")
    proc, killer = start(args, limit=240)
    out, err = finish(proc, killer, timeout=120)
    assert proc.returncode == 4, err
    cause = next(line for line in err.splitlines() if "Root cause:" in line)
    assert "Root cause: collective mismatch: rank 1 in all-reduce #" in cause, cause
    assert "ranks 0, 2 in all-reduce #" in cause and "(4 B) at step 11" in cause, cause
    assert _status(runs)[1]["state"] == "hung"


@pytest.mark.waits
def test_a_slow_but_live_rank_is_not_a_hang(tmp_path):
    """Rank 1 takes 5 s longer for each of 3 steps, with progress meanwhile: rank 0 waits
    longer than dist.hang_timeout in each of those all-reduces, and the job still ends
    normally, with the same weights on both ranks."""
    result = check(run(["train.py", "-o", "dist.nprocs=2", "-c", "configs/mnist_mlp.yaml",
                        "-o", "train.batch_size=32", "-o", "train.epochs=1", "-o", "dist.hang_timeout=3",
                        "-o", "faults.inject=slow:1:5", "-o", f"output.run_dir={tmp_path}"], timeout=180))
    status = _status(tmp_path)
    assert [status[r]["state"] for r in (0, 1)] == ["done", "done"], result.stderr
    assert status[0]["weights_sha256"] == status[1]["weights_sha256"]


@pytest.mark.waits
def test_a_hang_that_gloo_gives_up_on_first_is_still_named(tmp_path):
    """Gradients through gloo (sync.transport=backend) and the default dist.hang_timeout
    (300 s): gloo's own 30 s timeout ends rank 0's wait first, and rank 0 then names who
    held it up, from the heartbeats."""
    args = ["train.py", "-o", "dist.nprocs=2", *MLP, "-o", "sync.transport=backend",
            "-o", "dist.stop_timeout=5", "-o", f"output.run_dir={tmp_path / 'run'}"]
    code, err, status = _stop_one_rank(args, tmp_path / "run", 2, 1, ends_within=30 + ENDS_WITHIN_S)
    assert code == 4, err
    assert "Root cause: rank 1 stopped by a signal (process state T)" in err
    assert "rank 0 in all-reduce #" in err and "(gloo gave up after 30 s)" in err
    assert status[0]["state"] == "hung"


@pytest.mark.waits
@pytest.mark.parametrize("api", ["loop", "hapi"])
def test_a_stopped_rank_on_the_gpu_default_sync_is_named(api, tmp_path):
    """sync.mode=dataparallel (the GPU default): Paddle's reducer all-reduces inside
    backward(); the backward's exchange is marked, so the waiting ranks read as waiting in
    an all-reduce and the stopped one is named, not every rank."""
    args, run_dir = _train_py(tmp_path, 2)
    cause, _ = _stopped_rank_named(args + ["-o", "sync.mode=dataparallel", "-o", f"train.api={api}"], run_dir, 2, 1)
    assert "silent" not in cause
