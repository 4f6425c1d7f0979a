"""`python -m paddle_dist.launch` running a plain DataParallel script (no paddle_dist
import) when a rank or one of its DataLoader workers is killed: the report names the rank
that died first, whatever its number, the job exits with its code, and nothing of the
job is left: no process, no shared memory in /dev/shm.
"""

import json
import os
import re
import signal
import time
from pathlib import Path

import paddle
import pytest

from ..oracles import rank_status
from .procs import ROOT, finish, run, start

SCRIPT = str(ROOT / "tests" / "integration" / "scripts" / "dp_victim.py")
SHM = Path("/dev/shm")
# Its killed ranks and workers leave segments in /dev/shm until the launcher removes them:
# under pytest-xdist (make test) on the worker of test_fit_habits.py's /dev/shm check.
pytestmark = pytest.mark.xdist_group("dev-shm")


def _launch(tmp_path, nprocs, *script_args):
    return ["-m", "paddle_dist.launch", "--nprocs", str(nprocs), "--log_dir", str(tmp_path / "log"),
            SCRIPT, "--out", str(tmp_path), *script_args]


def _job_pids(tmp_path):
    """Every rank's pid and its DataLoader workers' (from the ranks' ready files)."""
    pids = set()
    for ready in tmp_path.glob("ready.*[0-9]"):
        info = json.loads(ready.read_text())
        pids |= {info["pid"], *info["workers"]}
    return pids


def _segments_of(pids):
    """What processes `pids` left in /dev/shm: Paddle's paddle_<pid>_<n>_<random> files and
    paddle_dist's paddle_dist-<what>-<pid>-... files."""
    names = os.listdir(SHM) if SHM.is_dir() else []
    pattern = re.compile(r"^paddle_(\d+)_|^paddle_dist-[A-Za-z]+-(\d+)-")
    return [n for n in names if (m := pattern.match(n)) and int(m.group(1) or m.group(2)) in pids]


@pytest.mark.parametrize("nprocs, victim, workers", [
    (2, 1, 0), (3, 2, 0), (2, 0, 0), (2, 1, 2), (3, 2, 2)])
def test_the_rank_killed_first_is_the_root_cause(nprocs, victim, workers, tmp_path):
    result = run(_launch(tmp_path, nprocs, "--kill-rank", str(victim), "--workers", str(workers)),
                 timeout=120)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert f"Root cause: rank {victim} killed by SIGKILL" in result.stderr
    others = [f"rank {r}" for r in range(nprocs) if r != victim]
    consequences = [line for line in result.stderr.splitlines() if "stopped as a consequence" in line]
    assert len(consequences) == 1 and all(r in consequences[0] for r in others), result.stderr
    assert f"log: {tmp_path / 'log' / f'workerlog.{victim}'}" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("paddle_dist: to run it again, run: ") and \
        last.endswith(f"--kill-rank {victim} --workers {workers}"), result.stderr
    assert f" -m paddle_dist.launch --nprocs {nprocs} " in last       # as it was run
    pids = _job_pids(tmp_path)
    assert len(pids) == nprocs * (1 + workers)
    assert _segments_of(pids) == []


def test_a_killed_dataloader_worker_fails_its_rank(tmp_path):
    result = run(_launch(tmp_path, 2, "--kill-rank", "1", "--workers", "2", "--kill", "worker"),
                 timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Root cause: rank 1 exited with code 1" in result.stderr
    assert "DataLoader" in result.stderr          # the rank's last lines, in the report
    assert _segments_of(_job_pids(tmp_path)) == []


def test_a_killed_paddle_dist_rank_leaves_no_shared_memory(tmp_path):
    """train.py's own launcher: the killed rank's heartbeat file (paddle_dist-beat-<pid>-...)."""
    result = run(["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "dist.nprocs=2",
                  "-o", "train.batch_size=32", "-o", "faults.inject=kill:1:5",
                  "-o", f"output.run_dir={tmp_path}"], timeout=120)
    assert result.returncode == 128 + signal.SIGKILL, result.stderr
    assert "Root cause: rank 1 killed by SIGKILL" in result.stderr
    pids = {rank_status(tmp_path, r)["pid"] for r in (0, 1)}
    assert _segments_of(pids) == []


# ------------------------------------------------------------------ the launcher is stopped
def _start_until_ready(args, tmp_path, nprocs):
    """Start `args`; return once every rank has taken a step (its ready file)."""
    proc, killer = start(args, limit=120)
    while proc.poll() is None and len(list(tmp_path.glob("ready.*[0-9]"))) < nprocs:
        time.sleep(0.01)    # polling for files: the ranks' own progress is the event
    return proc, killer


_end = finish


def test_ctrl_c_is_one_line_and_exit_130(tmp_path):
    proc, killer = _start_until_ready(_launch(tmp_path, 2, "--steps", "100000"), tmp_path, 2)
    proc.send_signal(signal.SIGINT)
    out, err = _end(proc, killer)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["paddle_dist: interrupted; every rank was stopped"], err
    assert "Traceback" not in out


def test_sigterm_when_every_rank_ends_with_75_is_a_requested_stop(tmp_path):
    proc, killer = _start_until_ready(_launch(tmp_path, 2, "--steps", "100000", "--on-usr1", "75"),
                                      tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    out, err = _end(proc, killer)
    assert proc.returncode == 75, err
    assert "stopped on request" in err and "Root cause" not in err


# ------------------------------------------------------------------ what the terminal shows
def test_console_start_and_end_lines_without_paddles_noise(tmp_path):
    result = run(_launch(tmp_path, 2, "--steps", "5"), timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"paddle_dist: starting 2 ranks of {SCRIPT} on CPU; logs in {tmp_path / 'log'}/"
    assert re.fullmatch(rf"paddle_dist: 2 ranks finished in [0-9.]+ s; logs in {tmp_path / 'log'}/",
                        lines[-1]), result.stdout
    assert "rank 0: 5 steps" in result.stdout
    assert "Modified FLAGS" not in result.stdout + result.stderr
    # Paddle 3 prints its FLAGS banner in every rank (2.6 does not); the log keeps it.
    banner = "Modified FLAGS" in (tmp_path / "log" / "workerlog.0").read_text()
    assert banner == (not paddle.__version__.startswith("2."))


def test_a_run_directory_written_by_the_script_gives_the_report_its_status(tmp_path):
    """A fit() (rank 0) writes its run directory into PADDLE_DIST_RUN_POINTER; a stale
    pointer from an earlier job in the same log directory is never used."""
    script = tmp_path / "fails.py"
    script.write_text(
        "import json, os, sys, time\n"
        "from pathlib import Path\n"
        "rank, run = int(os.environ['PADDLE_TRAINER_ID']), Path(sys.argv[1])\n"
        "if rank == 1 and sys.argv[2] == 'write':\n"
        "    (run / 'status').mkdir(parents=True)\n"
        "    (run / 'status' / 'rank1.json').write_text(json.dumps({'rank': 1, 'state': 'failed',\n"
        "        'time': time.time(), 'error_type': 'ValueError', 'error': 'bad batch',\n"
        "        'traceback': 'Traceback\\n  in step\\nValueError: bad batch', 'exit_code': 1}))\n"
        "    Path(os.environ['PADDLE_DIST_RUN_POINTER']).write_text(str(run.resolve()) + '\\n')\n"
        "    sys.exit(1)\n"
        "sys.exit(1 if rank == 1 else 0)\n")
    launch = ["-m", "paddle_dist.launch", "--nprocs", "2", "--log_dir", str(tmp_path / "log"), str(script)]
    result = run(launch + [str(tmp_path / "run"), "write"], timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Root cause: rank 1 raised ValueError: bad batch" in result.stderr
    assert "| ValueError: bad batch" in result.stderr
    assert (tmp_path / "log" / "run_dir").read_text().strip() == str((tmp_path / "run").resolve())
    again = run(launch + [str(tmp_path / "run"), "no"], timeout=60)    # the pointer is stale now
    assert again.returncode == 1, again.stderr
    assert "Root cause: rank 1 exited with code 1" in again.stderr
    assert not (tmp_path / "log" / "run_dir").exists()
