"""Processes as Linux's /proc describes them: found by their relations (parent, session),
never matched by name. Each function returns nothing rather than raise when a process is
gone or /proc is missing.

Example:
    [pid for pid, state, parent, session in process_table() if parent == os.getpid()]
    cmdline(parent_of(os.getpid()))      # ['python', '-m', 'paddle.distributed.launch', ...]
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional, Tuple


def _stat(pid) -> Optional[List[str]]:
    """The fields of /proc/<pid>/stat after the command name: state, parent, group, session..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> Iterator[Tuple[int, str, int, int]]:
    """(pid, state, parent pid, session id) of every process."""
    for entry in Path("/proc").iterdir():
        fields = _stat(entry.name) if entry.name.isdigit() else None
        if fields:
            yield int(entry.name), fields[0], int(fields[1]), int(fields[3])


def parent_of(pid: int) -> int:
    """The parent's pid (0 when unknown)."""
    fields = _stat(pid)
    return int(fields[1]) if fields else 0


def cmdline(pid: int) -> List[str]:
    """The command line `pid` was started with ([] when unknown)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [word.decode(errors="replace") for word in raw.split(b"\0") if word]
