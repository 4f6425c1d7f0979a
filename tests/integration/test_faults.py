"""Failures with real processes: a rank raises, is killed, stalls, never arrives; the
launcher is stopped; a job resumes exactly and restarts by itself.

Every job runs in its own session (tests/integration/procs.py) and the test fails if any
process of it is left. Faults are injected with `-o faults.inject=KIND:RANK:STEP`.
"""

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from paddle_dist.runs.layout import Run

from ..oracles import (References, final_weights, free_port, latest_checkpoint, max_difference, rank_status,
                       read_metrics)
from .procs import PY, check, finish, needs_mpirun, run, start

# 4,000 MNIST images, 2 ranks x 32 = 63 steps an epoch; the MLP keeps steps cheap.
JOB = ["-c", "configs/mnist_mlp.yaml", "-o", "train.batch_size=32"]
TWO_RANKS = {"launch": ["train.py", "-o", "dist.nprocs=2"],
             "spawn": ["tools/spawn_train.py", "--nprocs", "2"]}


# ------------------------------------------------------------------ a rank fails
@pytest.mark.parametrize("launcher", ["launch", "spawn"])
def test_rank_raises_at_step_5(launcher, tmp_path):
    result = run(TWO_RANKS[launcher] + JOB + ["-o", "faults.inject=raise:1:5",
                                              "-o", f"output.run_dir={tmp_path}"], timeout=120)
    ended = time.time()
    assert result.returncode == 1, result.stderr
    assert "Root cause: rank 1 raised RuntimeError: injected fault: rank 1 raises at step 5" in result.stderr
    assert "stopped as a consequence: rank 0" in result.stderr
    assert str(Run(tmp_path).rank_log(1)) in result.stderr
    failed = rank_status(tmp_path, 1)
    assert failed["state"] == "failed" and failed["step"] == 5
    assert rank_status(tmp_path, 0)["state"] == "stopped"        # a PeerFailure it could handle
    assert ended - failed["time"] < 10, "the job took too long to stop after the failure"


@pytest.mark.parametrize("launcher", ["launch", "spawn"])
def test_rank_killed_mid_epoch(launcher, tmp_path):
    result = run(TWO_RANKS[launcher] + JOB + ["-o", "faults.inject=kill:1:20",
                                              "-o", f"output.run_dir={tmp_path}"], timeout=120)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "Root cause: rank 1 killed by SIGKILL" in result.stderr
    assert "stopped as a consequence: rank 0" in result.stderr


def test_bare_paddle_launch_names_the_failed_rank(tmp_path):
    result = run(["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                  str(tmp_path / "log"), "train.py"] + JOB +
                 ["-o", "faults.inject=raise:1:5", "-o", f"output.run_dir={tmp_path / 'run'}"],
                 timeout=120)
    assert result.returncode != 0
    # The survivor explains the failure in its own output (Paddle's launcher relays it to
    # the terminal only while it still watches: once it has seen rank 1 fail, it may stop).
    assert "Root cause: rank 1 raised RuntimeError" in (tmp_path / "log" / "workerlog.0").read_text()
    assert rank_status(tmp_path / "run", 0)["state"] == "stopped"


# hang: a stall in Python; nativehang: in a C call that holds the GIL all along, where
# no thread of the rank could run: the watchdog is a process of its own.
@pytest.mark.waits
@pytest.mark.parametrize("kind", ["hang", "nativehang"])
def test_rank_stalls_inside_the_training_loop(kind, tmp_path):
    result = run(TWO_RANKS["launch"] + JOB + [
        "-o", f"faults.inject={kind}:1:5", "-o", "dist.hang_timeout=3",
        "-o", f"output.run_dir={tmp_path}"], timeout=120)
    assert result.returncode == 4, result.stderr
    assert "Root cause: rank 1 silent for" in result.stderr and "at step 5" in result.stderr
    hung = rank_status(tmp_path, 1)
    assert hung["state"] == "hung" and "_inject" in hung["traceback"]   # where it was stuck
    for rank in (0, 1):               # heartbeat and stack files: nothing left behind
        assert not list(Path("/dev/shm").glob(f"paddle_dist-beat-{rank_status(tmp_path, rank)['pid']}-*"))


# ------------------------------------------------------------------ a peer never arrives
@pytest.mark.waits
@pytest.mark.parametrize("rank", [0, 1])
def test_peer_never_arrives(rank, tmp_path):
    """One rank of a 2-rank job started by hand, alone: rank 0 waits for a worker, rank 1
    for a master. Paddle would wait forever; the rank's watchdog stops it with a message
    and exit code 3, as under paddle_dist's launchers (Paddle holds the GIL while it
    waits: SIGQUIT runs libc's _exit(3) without it)."""
    ports = [free_port(), free_port()]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    env = {"PADDLE_TRAINER_ID": str(rank), "PADDLE_TRAINERS_NUM": "2",
           "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
           "PADDLE_MASTER": endpoints[0], "PADDLE_LOCAL_RANK": "0", "PADDLE_NNODES": "2"}
    started = time.monotonic()
    result = run(["train.py"] + JOB + ["-o", "dist.rendezvous_timeout=5",
                                       "-o", f"output.run_dir={tmp_path}"], env=env, timeout=120)
    assert result.returncode == 3, result.stderr
    assert f"rank {rank}: not all 2 ranks arrived within 5 s" in result.stderr
    assert time.monotonic() - started < 60



# ------------------------------------------------------------------ stopping the launcher
def _start_and_wait_for_training(args):
    proc, killer = start(args, limit=120)
    lines = []
    for line in proc.stdout:            # a progress line means every rank is training
        lines.append(line)
        if line.startswith("epoch 1/"):
            break
    return proc, killer, lines


def _finish(proc, killer, lines):
    out, err = finish(proc, killer)
    return "".join(lines) + (out or ""), err


# The stop flag: with the gradients (fused: the one exchange; overlap: the first bucket,
# on the communication thread) / in an all-reduce of its own about once a second.
@pytest.mark.parametrize("mode", ["fused", "overlap", "dataparallel"])
def test_sigterm_saves_a_checkpoint_and_exits_75(mode, tmp_path):
    proc, killer, lines = _start_and_wait_for_training(
        TWO_RANKS["launch"] + JOB + ["-o", "train.epochs=50", "-o", "train.log_every=1",
                                     "-o", f"sync.mode={mode}", "-o", f"output.run_dir={tmp_path}"])
    proc.send_signal(signal.SIGTERM)
    out, err = _finish(proc, killer, lines)
    assert proc.returncode == 75, err
    assert "stopped on request after saving a checkpoint" in err
    assert err.strip().splitlines()[-1].endswith(shlex.join(proc.args[1:])), err   # run it again
    meta = json.loads((latest_checkpoint(tmp_path) / "meta.json").read_text())
    assert meta["global_step"] >= 1
    assert {rank_status(tmp_path, r)["state"] for r in (0, 1)} == {"preempted"}


@pytest.mark.parametrize("launcher", ["launch", "spawn"])
def test_ctrl_c_stops_every_rank(launcher, tmp_path):
    proc, killer, lines = _start_and_wait_for_training(
        TWO_RANKS[launcher] + JOB + ["-o", "train.epochs=50", "-o", "train.log_every=1",
                                     "-o", f"output.run_dir={tmp_path}"])
    proc.send_signal(signal.SIGINT)
    out, err = _finish(proc, killer, lines)
    assert proc.returncode == 130, err
    assert "interrupted" in err


# ------------------------------------------------------------------ resume and restart
# Two epochs of 63 steps, a checkpoint every 10: a kill after the first checkpoint
# leaves over 100 steps to go.
RESUME = JOB + ["-o", "train.epochs=2", "-o", "checkpoint.every_steps=10"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run directories of clean runs, per API level."""
    def make(run_dir: Path, api: str) -> Path:
        check(run(TWO_RANKS["launch"] + RESUME + ["-o", f"train.api={api}",
                                                  "-o", f"output.run_dir={run_dir}"]))
        return run_dir
    return References(tmp_path_factory, "clean", make)


def _kill_rank_1_after_a_checkpoint(args, root):
    """Run `args`; once its first checkpoint exists, SIGKILL rank 1 by pid, from outside.
    Returns the job's (exit code, stderr) and its run directory."""
    proc, killer = start(args, limit=120, stdout=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not list(root.glob("*/checkpoints/latest")):
            time.sleep(0.01)    # polling for a file: the job's own progress is the event
        run_dir = next(root.glob("*/checkpoints/latest")).parent.parent
        os.kill(rank_status(run_dir, 1)["pid"], signal.SIGKILL)
    finally:
        err = _finish(proc, killer, [])[1]
    return proc.returncode, err, run_dir


BARE = {"paddle.distributed.launch": ["-m", "paddle.distributed.launch", "--nproc_per_node", "2",
                                      "train.py"],
        "mpirun": ["mpirun", "-n", "2", "--allow-run-as-root", PY, "train.py"]}


# Each launcher once, each API level under two of them (a fit() script's continuation
# under every launcher: test_own_fit.py).
@pytest.mark.parametrize("launcher, api", [
    pytest.param("launch", "loop", marks=pytest.mark.compat),
    pytest.param("spawn", "hapi", marks=pytest.mark.compat),
    ("paddle.distributed.launch", "loop"), pytest.param("mpirun", "hapi", marks=needs_mpirun)])
def test_the_same_command_continues_a_killed_run(launcher, api, uninterrupted, tmp_path):
    """No run directory named: running the identical command again finds the killed run,
    resumes its latest checkpoint and ends with an uninterrupted run's weights."""
    root = tmp_path / "runs"
    args = (TWO_RANKS.get(launcher) or BARE[launcher]) + RESUME + [
        "-o", f"train.api={api}", "-o", f"output.root={root}"]
    args = [PY] + args if args[0] != "mpirun" else args
    if launcher == "paddle.distributed.launch":
        args[args.index("train.py"):args.index("train.py")] = ["--log_dir", str(tmp_path / "log")]
    code, err, run_dir = _kill_rank_1_after_a_checkpoint(args, root)
    assert code != 0, err
    # The report ends with the command that continues the run: this very command (from a
    # launcher, its first word names this Python: python, python3 or the full path).
    if launcher in TWO_RANKS:
        assert "Root cause: rank 1 killed by SIGKILL" in err
        last = err.strip().splitlines()[-1]
        assert last.startswith("paddle_dist: to continue this run, run: ") and \
            last.endswith(shlex.join(args[1:])), err
    elif launcher == "paddle.distributed.launch":   # rank 0 explains, in its own output
        assert f"to continue this run, run: {shlex.join(args)}" in \
            (tmp_path / "log" / "workerlog.0").read_text() + err
    resumed = check(run(args, timeout=180))
    assert [d.name for d in root.iterdir() if d.is_dir()] == [run_dir.name]
    assert f"continuing the unfinished run {run_dir}" in resumed.stdout + resumed.stderr
    assert "resuming from" in Run(run_dir).rank_log(0).read_text()
    assert max_difference(final_weights(run_dir), final_weights(uninterrupted[api])) <= 1e-6
    assert rank_status(run_dir, 0)["weights_sha256"] == rank_status(run_dir, 1)["weights_sha256"]
    # The saved config records the job as it ran, whoever started it: train.py -c repeats it.
    ran = yaml.safe_load(Run(run_dir).config.read_text())["dist"]
    assert (ran["nprocs"], ran["nnodes"]) == (2, 1) and ran["launcher"] == {
        "launch": "launch", "spawn": "spawn", "paddle.distributed.launch": "launch", "mpirun": "mpirun"}[launcher]
    again = check(run(args + ["-o", "train.max_steps=1"], timeout=180))   # finished: a new run
    assert f"the last run of this config, {run_dir}, had finished" in again.stdout + again.stderr
    assert len([d for d in root.iterdir() if d.is_dir()]) == 2


def test_max_restarts_recovers_from_a_failure(uninterrupted, tmp_path):
    result = check(run(TWO_RANKS["launch"] + RESUME + ["-o", "dist.max_restarts=1",
                                                      "-o", "faults.inject=raise:1:30",
                                                      "-o", f"output.run_dir={tmp_path}"]))
    assert "Root cause: rank 1 raised RuntimeError" in result.stderr
    assert "restart 1/1 from the latest checkpoint" in result.stdout
    assert read_metrics(tmp_path)["test_accuracy"] == read_metrics(uninterrupted["loop"])["test_accuracy"]
    assert max_difference(final_weights(tmp_path), final_weights(uninterrupted["loop"])) <= 1e-6


def test_resume_on_ranks_that_cannot_share_its_steps_says_which_can(uninterrupted, tmp_path):
    """A 2-rank run continues on 1 rank (2 micro-batches a step: test_whole_state.py), not on
    3: one line names the world sizes that keep its steps, and nothing of it is written."""
    clean = uninterrupted["loop"]                     # a 2-rank run's checkpoints
    before = {str(p): p.stat().st_mtime_ns for p in clean.rglob("*")}
    result = run(["train.py"] + JOB + ["-o", "dist.nprocs=3", "-o", f"checkpoint.resume={clean}",
                                       "-o", f"output.run_dir={tmp_path / 'again'}"])
    assert result.returncode == 2
    assert ("the run was planned for 2 ranks x 1 micro-batch(es) per step; 3 ranks cannot share each "
            "step's 2 micro-batches") in result.stderr
    assert "continue it on 1, 2 rank(s) (dist.nprocs), or start afresh with checkpoint.resume=none" in result.stderr
    assert {str(p): p.stat().st_mtime_ns for p in clean.rglob("*")} == before   # read, never written


def test_a_checkpoint_that_would_unpickle_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    check(run(["train.py"] + JOB + ["-o", "train.max_steps=2", "-o", f"output.run_dir={run_dir}"]))
    ckpt = latest_checkpoint(run_dir)
    np.savez(ckpt / "model.npz", payload=np.array([object()], dtype=object))
    result = run(["train.py"] + JOB + ["-o", f"checkpoint.resume={ckpt}",
                                       "-o", f"output.run_dir={tmp_path / 'again'}"])
    assert result.returncode == 2
    assert "refusing to load" in result.stderr and "pickled" in result.stderr


@pytest.mark.waits
def test_a_slow_checkpoint_never_stalls_the_other_ranks(tmp_path):
    """Rank 0 writes every checkpoint 35 s slower than usual, longer than gloo's fixed 30 s
    collective timeout: training must go on meanwhile and the job must succeed."""
    check(run(TWO_RANKS["launch"] + JOB + ["-o", "train.max_steps=40", "-o", "checkpoint.every_steps=10",
                                           "-o", "faults.inject=slowsave:0:10",
                                           "-o", f"output.run_dir={tmp_path}"], timeout=240))
    assert rank_status(tmp_path, 1)["state"] == "done"
    assert read_metrics(tmp_path)["steps"] == 40
