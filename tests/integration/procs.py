"""Run real processes for integration tests: bounded by a timeout, never leaving orphans.

Each command starts in its own session; afterwards every process still in that session
(a rank that outlived its launcher) is killed and the test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from paddle_dist.procfs import process_table

from .. import stopping

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None,
                                  reason="needs OpenMPI's mpirun (apt-get install openmpi-bin; "
                                         "make test installs it when run as root)")


def session_members(sid: int) -> List[int]:
    """Live PIDs whose session id is `sid`."""
    return [pid for pid, state, _, session in process_table() if session == sid and state != "Z"]


def settled_session(sid: int, grace_s: float = 10.0) -> List[int]:
    """Members of session `sid` still alive after `grace_s` seconds. A helper process that
    is exiting at the moment its parent ended (multiprocessing's resource tracker, say) is
    given that long to go; one that stays is an orphan."""
    deadline = time.monotonic() + grace_s
    while True:
        left = session_members(sid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def run(args: List[str], timeout: float = 240, env: Optional[Dict[str, str]] = None,
        cwd: Optional[Path] = None, base_env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run `args` (python is prepended when the first item is a .py file or -m) in its own
    session, bounded by `timeout`, with this process's environment (or `base_env`) plus
    `env`; fails when it leaves processes behind."""
    if args[0].endswith(".py") or args[0] == "-m":
        args = [PY] + args
    child_env = dict(os.environ if base_env is None else base_env)
    child_env.pop("PYTEST_CURRENT_TEST", None)
    child_env.update(env or {})
    proc = subprocess.Popen(args, cwd=str(cwd or ROOT), env=child_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    record = stopping.hold(session=proc.pid)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(args)}\n{out[-3000:]}\n{err[-3000:]}")
    except KeyboardInterrupt:       # the test run is stopping (tests/stopping.py): no grace
        stopping.undo({"session": proc.pid})
        raise
    finally:
        left = settled_session(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        stopping.release(record)
    assert not left, f"processes left behind by {' '.join(args)}: {left}"
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def start(args: List[str], limit: float = 180, stdout=subprocess.PIPE) -> tuple:
    """Start `args` (python prepended as in run()) in its own session from the repository
    root, its output piped as text, for a test that acts on it while it runs (signals it,
    kills a rank). Returns (process, killer): the killer SIGKILLs the whole session after
    `limit` seconds; end with finish()."""
    if args[0].endswith(".py") or args[0] == "-m":
        args = [PY] + args
    proc = subprocess.Popen(args, cwd=str(ROOT), stdout=stdout, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_as_from_a_terminal)
    record = stopping.hold(session=proc.pid)      # until finish(), or the test run's end
    killer = threading.Timer(limit, lambda: stopping.undo({"session": proc.pid}))
    killer.daemon = True        # a stopped test run that never calls finish() need not wait for it
    killer.record = record
    killer.start()
    return proc, killer


def _as_from_a_terminal() -> None:
    """Ctrl+C as a terminal gives it: a test run started in the background by a shell
    without job control (CI) inherits SIGINT ignored, and Python then keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def finish(proc: subprocess.Popen, killer: threading.Timer, timeout: float = 120) -> tuple:
    """Wait for a process from start(); returns its (stdout, stderr). Fails when it leaves
    processes behind (they are killed)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        killer.cancel()
        left = settled_session(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        stopping.release(killer.record)
    assert not left, f"processes left behind: {left}"
    return out, err


def check(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (f"exit {result.returncode}: {' '.join(result.args)}\n"
                                    f"--- stdout\n{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}")
    return result
