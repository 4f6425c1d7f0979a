"""The locks that keep two jobs out of one run (runs/rundir.py): an flock on `<run>/.lock`,
held by the process that chose the run until it exits, and one on `<output.root>/.lock`
while a job chooses. Lock files are never opened through a link.

Example:
    with locked(root_fd):              # choosing, in output.root
        if hold(run): ...              # the run is this process's until release(run)
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Dict

LOCK = ".lock"
_HELD: Dict[Path, int] = {}      # run directory -> the descriptor holding its lock
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


class locked:
    """Hold an exclusive flock on the lock file of the directory open as `dir_fd` for a
    block (blocking: choosing takes milliseconds)."""

    def __init__(self, dir_fd: int):
        self.dir_fd = dir_fd

    def __enter__(self):
        self.fd = os.open(LOCK, _FLAGS, 0o600, dir_fd=self.dir_fd)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def hold(path: Path) -> bool:
    """Lock run `path` for this process until release() or exit; False if a live process
    holds it. The lock file records the holder's pid and host, for messages."""
    path = Path(path).resolve()
    if path in _HELD:
        return True
    fd = os.open(path / LOCK, _FLAGS, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {os.uname().nodename}\n".encode())
    _HELD[path] = fd
    return True


def holder(path: Path) -> str:
    """Who holds run `path`, for a message: 'pid 4711 on node0'."""
    try:
        with open(Path(path) / LOCK, opener=lambda name, flags: os.open(name, flags | os.O_NOFOLLOW)) as f:
            pid, host = f.read().split()[:2]
        return f"pid {pid} on {host}"
    except (OSError, ValueError):
        return "another process"


def release(path: Path) -> None:
    """Let go of run `path` (a no-op unless this process holds it)."""
    fd = _HELD.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)
