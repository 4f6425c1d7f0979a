"""Which rank holds a job up: every rank's heartbeat, read together, and the verdict.

Each rank of a fit() job keeps a heartbeat in a few bytes of shared memory (monitor.Heartbeat
writes it): when it last made progress (a step, an evaluation batch, entering or leaving a
collective), its step and epoch, and the collective it is in, if any: its kind
("all-reduce"), its number (the rank's count of collectives so far, the same on every rank
while they agree), its size in bytes and since when. The files are named after the job
(`paddle_dist-beat-<pid>-<job>-rank<N>` in /dev/shm), so each rank's watchdog
(paddle_dist/runtime/_deadline.py) reads its peers' heartbeats on the same machine too.

The rule (judge): a job is hung when no rank it can see has made progress for
`dist.hang_timeout` seconds. One rank waiting in a collective proves nothing: a peer that
is slow but alive still beats, and then nothing is reported. Who is to blame, in order: a
rank whose process is stopped (SIGSTOP, a debugger); a rank silent outside any collective
(stuck in Python or native code); ranks in a different collective from the rest (a
collective mismatch); when every rank here waits in the same collective, the ranks that
are not here (on another machine), or else the collective itself.

This module imports nothing but the standard library and procfs.py (standard library only
too): the watchdog runs it without Paddle.

Example:
    verdict = judge(read_beats(folder), time.monotonic(), seconds=30, world=4)
    verdict.message
    # 'rank 1 silent for 30 s at step 812 (no heartbeat); ranks 0, 2, 3 in all-reduce #1624 (4.2 MB) since 30 s'
"""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

try:
    from .. import procfs
except ImportError:            # run from _deadline.py as a script, which puts paddle_dist/ on sys.path
    import procfs

# last progress (time.monotonic(): one clock for every process of a machine), step, epoch,
# collective kind (UTF-8, empty: none), its number, its size in bytes, since (monotonic)
BEAT_FORMAT = "<dqq24sqqd"
BEAT_SIZE = struct.calcsize(BEAT_FORMAT)
NAME = re.compile(r"beat-(\d+)-rank(\d+)$")
STOPPED_STATES = ("T", "t")        # /proc/<pid>/stat: stopped by a signal, or traced


def beat_path(folder: str, rank: int, pid: int) -> str:
    return os.path.join(folder, f"beat-{pid}-rank{rank}")


def pack(into, progress: float, step: int, epoch: int, kind: str = "", count: int = 0,
         size: int = 0, since: float = 0.0) -> None:
    struct.pack_into(BEAT_FORMAT, into, 0, progress, step, epoch, kind.encode()[:24], count, size, since)


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat as read, with its process's state ('' when it has ended)."""
    rank: int
    pid: int
    progress: float
    step: int
    epoch: int
    kind: str = ""
    count: int = 0
    size: int = 0
    since: float = 0.0
    state: str = "S"

    @classmethod
    def unpack(cls, rank: int, pid: int, data, state: str = "S") -> "Beat":
        progress, step, epoch, kind, count, size, since = struct.unpack_from(BEAT_FORMAT, data)
        return cls(rank, pid, progress, step, epoch, kind.rstrip(b"\0").decode(errors="replace"),
                   count, size, since, state)

    @property
    def in_collective(self) -> bool:
        return bool(self.kind)


def read_beats(folder: str, maps: Optional[Dict[str, mmap.mmap]] = None) -> List[Beat]:
    """The heartbeats in `folder` (the job's directory) of this user's processes still
    there; a file or a process of another user never counts. `maps` keeps the files mapped
    between calls (a dict the caller owns)."""
    maps = {} if maps is None else maps
    found = []
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for gone in set(maps) - {os.path.join(folder, name) for name in names}:
        maps.pop(gone).close()
    for name in names:
        match = NAME.match(name)
        if not match:
            continue
        pid, rank = int(match.group(1)), int(match.group(2))
        state = procfs.state_of(pid)
        path = os.path.join(folder, name)
        if state in ("", "Z") or not procfs.owned_by_me(pid):
            continue
        try:
            if path not in maps:
                maps[path] = _map(path)
            found.append(Beat.unpack(rank, pid, maps[path], state))
        except (OSError, ValueError, struct.error):
            continue
    return sorted(found, key=lambda b: b.rank)


def _map(path: str) -> mmap.mmap:
    """The heartbeat file at `path` mapped for reading: never through a link, and only a
    regular file of this user (ValueError otherwise)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"{path} is not this user's file")
        return mmap.mmap(fd, BEAT_SIZE, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Verdict:
    culprits: List[int]        # the ranks to blame (may be none of those seen here)
    message: str               # one line, every rank seen here in it
    why: str = "stuck"         # stopped | silent | mismatch | elsewhere | stuck

    @property
    def names_a_rank(self) -> bool:
        """The blame falls on particular ranks seen here, not on what is out of sight."""
        return self.why in ("stopped", "silent", "mismatch")


def judge(beats: Sequence[Beat], now: float, seconds: float, world: int) -> Optional[Verdict]:
    """None while some rank made progress within `seconds`; else who holds the job up
    (module docstring). `world`: the job's number of ranks, to name those not seen here."""
    if not beats or any(now - b.progress <= seconds for b in beats):
        return None
    stopped = [b for b in beats if b.state in STOPPED_STATES]
    silent = [b for b in beats if not b.in_collective and b not in stopped]
    waiting = [b for b in beats if b.in_collective and b not in stopped]
    groups: Dict[tuple, List[Beat]] = {}
    for b in waiting:
        groups.setdefault((b.kind, b.count, b.size), []).append(b)
    lines = [f"{_ranks([b])} stopped by a signal (process state {b.state}) at step {b.step}"
             + (f", in {b.kind} #{b.count}" if b.in_collective else "") for b in stopped]
    lines += [f"{_ranks([b])} silent for {now - b.progress:.0f} s at step {b.step} (no heartbeat)"
              for b in silent]
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0].rank))
    mismatch = len(ordered) > 1
    lines += [_waiting(g, now) for g in ordered[::-1 if mismatch else 1]]
    absent = sorted(set(range(world)) - {b.rank for b in beats})
    if stopped or silent:
        why, culprits = ("stopped" if stopped else "silent"), [b.rank for b in stopped or silent]
    elif mismatch:
        odd = [b.rank for g in ordered[1:] for b in g]
        why, culprits = "mismatch", odd if len(ordered[0]) > len(ordered[1]) else [b.rank for b in waiting]
        lines[0] = "collective mismatch: " + lines[0]
    elif absent:
        why, culprits = "elsewhere", []
        lines.append(f"waiting for {_ranks_n(absent)} (not on this machine)")
    else:
        why, culprits = "stuck", [b.rank for b in waiting]
        lines.append("every rank is in it: the communication itself is stuck")
    return Verdict(sorted(culprits), "; ".join(lines), why)


def _waiting(group: List[Beat], now: float) -> str:
    first = group[0]
    size = f" ({_bytes(first.size)})" if first.size else ""
    steps = {b.step for b in group}
    step = f" at step {first.step}" if len(steps) == 1 else ""
    return (f"{_ranks(group)} in {first.kind} #{first.count}{size}{step} "
            f"since {now - min(b.since for b in group):.0f} s")


def _ranks(beats: Sequence[Beat]) -> str:
    return _ranks_n([b.rank for b in beats])


def _ranks_n(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _bytes(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"
