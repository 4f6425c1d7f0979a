"""A test run stopped by SIGTERM or SIGINT (`timeout ... make test`, `kill`, Ctrl+C) cleans up
what its tests started: the Slurm cluster (tests/integration/slurm.py), the network
namespaces (netns.py) and the processes (procs.py). A pytest plugin (tests/conftest.py).

How:
- every pytest process, the main one and each pytest-xdist worker, turns the first SIGTERM
  or SIGINT into KeyboardInterrupt, so that pytest tears the fixtures down as it does after
  Ctrl+C; it ignores the signals after that, which would cut that clean-up short. xdist's
  main process first passes the signal on to its workers: a `kill` of it alone would leave
  them to execnet, which interrupts them 5 s later and SIGKILLs them 10 s later, in the
  middle of stopping a cluster (xdist: workermanage.teardown_nodes);
- what the tests hold is written down while they hold it (`held`), one file each, in a
  folder of the run (xdist's workers are told it). At its end each process undoes what is
  left of its own (a fixture's clean-up that the signal cut short); the main process first
  waits, bounded, for its workers' clean-up, then undoes what any of them left (a worker
  SIGKILLed) and removes the folder.

Example:
    with stopping.held(folder=str(root)):   # its processes killed, it removed, if the run stops
        start_daemons(root)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

from paddle_dist import procfs

WORKER_KEY = "paddle_dist_held"     # xdist's workerinput: the folder of the run's records
WORKERS_WAIT_S = 120                # the Slurm cluster's drain and stop take up to ~60 s
_folder: Optional[Path] = None      # this run's records; None outside a test run: nothing recorded
_owner: Optional[pytest.Config] = None   # the config that set this up (not a pytester run inside)
_serial = itertools.count()
_stopped_by = 0                     # the signal that stopped the run (0: none yet)
_previous: dict = {}                # the handlers before ours, put back at the end


# ---------------------------------------------------------------- what the tests hold
def hold(**what) -> Optional[Path]:
    """Write down that this process holds `what` until release(); returns the record (None
    outside a test run). `session=SID`: the processes of session SID; `folder=PATH`: the
    processes whose command line names PATH, and PATH itself; `netns=[NAME, ...]`:
    network namespaces and the processes inside them.

    Example:
        record = hold(session=proc.pid); ...; release(record)
    """
    if _folder is None:
        return None
    path = _folder / f"{os.getpid()}.{next(_serial)}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(what))
    tmp.rename(path)          # a reader never sees half a record
    return path


def release(record: Optional[Path]) -> None:
    """The thing is cleaned up: forget it."""
    if record is not None:
        record.unlink(missing_ok=True)


@contextlib.contextmanager
def held(**what) -> Iterator[None]:
    """hold(**what) for the block."""
    record = hold(**what)
    try:
        yield
    finally:
        release(record)


def undo(what: dict) -> None:
    """Clean up one record's things by force: SIGKILL their processes, delete the rest."""
    if "session" in what:
        _kill(pid for pid, state, _, sid in procfs.process_table() if sid == what["session"] and state != "Z")
    if "folder" in what:
        _kill(pid for pid, *_ in procfs.process_table() if what["folder"] in " ".join(procfs.cmdline(pid)))
        shutil.rmtree(what["folder"], ignore_errors=True)
    for ns in what.get("netns", ()):
        pids = _ip("netns", "pids", ns).split()
        _kill(int(pid) for pid in pids if pid.isdigit())
        _ip("netns", "del", ns)


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ip(*args: str) -> str:
    try:
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def records(owner: Optional[int] = None) -> List[Path]:
    """The run's records, of one process (`owner`) or all."""
    if _folder is None:
        return []
    return sorted(p for p in _folder.glob("*.json") if owner is None or p.name.split(".")[0] == str(owner))


def undo_left(owner: Optional[int] = None) -> None:
    """Undo every record still there (of process `owner`, or all), sessions first: their
    processes may run in a namespace or talk to a cluster that goes next."""
    found = []
    for path in records(owner):
        with contextlib.suppress(OSError, ValueError):
            found.append((path, json.loads(path.read_text())))
    for path, what in sorted(found, key=lambda item: "session" not in item[1]):
        undo(what)
        path.unlink(missing_ok=True)


# ---------------------------------------------------------------- the signals
def _on_signal(signum, frame) -> None:
    """The first SIGTERM or SIGINT: KeyboardInterrupt, after passing it on to xdist's
    workers (this process's children in xdist's main process); later ones: nothing."""
    global _stopped_by
    if _stopped_by:
        return
    _stopped_by = signum
    if _is_xdist_main(_owner):
        for pid in procfs.children_of(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")


def _is_xdist_main(config: Optional[pytest.Config]) -> bool:
    return (config is not None and not hasattr(config, "workerinput")
            and config.pluginmanager.has_plugin("dsession"))


def pytest_configure(config: pytest.Config) -> None:
    global _folder, _owner, _stopped_by
    if _owner is not None:          # a pytester run inside a test: the outer run keeps it all
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        _folder = Path(tempfile.mkdtemp(prefix="paddle_dist-tests-held-"))
    elif WORKER_KEY in workerinput:
        _folder = Path(workerinput[WORKER_KEY])
    _owner, _stopped_by = config, 0
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):      # not the main thread: leave it as it is
            _previous[signum] = signal.signal(signum, _on_signal)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist's main process: a worker records into this run's folder."""
    if _folder is not None:
        node.workerinput[WORKER_KEY] = str(_folder)


@pytest.hookimpl(tryfirst=True)     # before xdist tears its workers down
def pytest_sessionfinish(session: pytest.Session) -> None:
    """xdist's main process, stopped: wait (bounded) until no worker holds anything: a
    stopped worker is cleaning up, which xdist would cut short. (A run that was not stopped
    does not wait: what a worker still holds at its end, pytest_unconfigure undoes.)"""
    if not _stopped_by or session.config is not _owner or not _is_xdist_main(_owner):
        return
    deadline = time.monotonic() + WORKERS_WAIT_S
    while time.monotonic() < deadline and any(procfs.pid_alive(int(p.name.split(".")[0]))
                                              for p in records()):
        time.sleep(0.1)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Undo what this process left; the main process also what its workers left."""
    global _folder, _owner
    if config is not _owner:
        return
    main = not hasattr(config, "workerinput")
    undo_left(None if main else os.getpid())
    if main and _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
    for signum, handler in _previous.items():
        signal.signal(signum, handler)
    _previous.clear()
    _folder, _owner = None, None
