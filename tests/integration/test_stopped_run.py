"""A test run stopped by SIGTERM or SIGINT leaves nothing running (tests/stopping.py): a
pytest run of tests/integration/scripts/stopped_run.py, which holds a Slurm cluster, two
network namespaces and a process inside one, is stopped once it holds them all; then no
daemon, namespace, process or folder of it is left."""

import json
import os
import signal
import subprocess
import time

import pytest

from paddle_dist import procfs
from tests import stopping

from tools.netns import unavailable_reason

from . import slurm
from .netns import netns_names
from .procs import PY, ROOT, session_members, settled_session

SCRIPT = "tests/integration/scripts/stopped_run.py"
READY_S = 180       # pytest's start (paddle's import), the cluster's and the namespaces'
STOP_S = 150        # the cluster's drain and stop: up to ~60 s; xdist's workers' end


def _inner_run(tmp_path, xdist: bool):
    args = [PY, "-m", "pytest", "-q", "-p", "no:cacheprovider", SCRIPT, *(["-n", "1"] if xdist else ["-p", "no:xdist"])]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTEST_XDIST"))}
    env["STOPPED_RUN_READY"] = str(tmp_path / "ready.json")
    with open(tmp_path / "out.txt", "w") as out:
        return subprocess.Popen(args, cwd=str(ROOT), env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _wait_until_ready(proc, tmp_path) -> dict:
    ready = tmp_path / "ready.json"
    deadline = time.monotonic() + READY_S
    while not ready.exists():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before it held everything:\n" \
                                    + (tmp_path / "out.txt").read_text()[-3000:]
        assert time.monotonic() < deadline, f"the run held nothing after {READY_S} s"
        time.sleep(0.1)
    return json.loads(ready.read_text())


def _left(held: dict) -> dict:
    """What of the run is still there."""
    root = held["slurm_root"]
    return {k: v for k, v in {
        "slurm processes": [pid for pid, *_ in procfs.process_table() if root in " ".join(procfs.cmdline(pid))],
        "slurm folder": os.path.exists(root),
        "namespaces": sorted(set(held["netns"]) & set(netns_names())),
        "the long process": session_members(held["session"]),
        "records": os.path.exists(held["records"]),
    }.items() if v}


def _stop(proc) -> None:
    """Stop the run if it still runs (this test failed, or this test run is stopping
    itself): SIGTERM, which it cleans up after, then SIGKILL after a bound."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("signum, xdist, group", [
    (signal.SIGTERM, True, False),      # `kill PID` of make test's pytest (-n): its workers too
    (signal.SIGINT, True, False),
    (signal.SIGTERM, False, True),      # `timeout make test`: the whole process group
], ids=["sigterm-xdist", "sigint-xdist", "sigterm-group"])
def test_a_stopped_run_leaves_nothing_running(tmp_path, signum, xdist, group):
    try:
        slurm.check_available()
    except slurm.Unavailable as e:
        pytest.skip(str(e))
    if unavailable_reason():
        pytest.skip(unavailable_reason())
    proc, held = _inner_run(tmp_path, xdist), None
    try:
        held = _wait_until_ready(proc, tmp_path)
        (os.killpg if group else os.kill)(proc.pid, signum)
        code = proc.wait(timeout=STOP_S)
        out = (tmp_path / "out.txt").read_text()
        assert code == pytest.ExitCode.INTERRUPTED, f"exit {code}\n{out[-3000:]}"
        assert not settled_session(proc.pid), out[-3000:]        # xdist's workers ended too
        assert not _left(held), f"{_left(held)}\n{out[-3000:]}"
    finally:                             # whatever the run left, this test does not leave
        _stop(proc)
        stopping.undo({"session": proc.pid})
        if held:
            stopping.undo({"session": held["session"], "folder": held["slurm_root"], "netns": held["netns"]})
