"""The processes of a job, as its launcher sees them: when each rank's exit was seen, which
ranks the launcher signalled itself, every process below the ranks (DataLoader workers,
watchdogs), and the shared memory those processes leave in /dev/shm.

Example:
    ranks = Ranks([p.pid for p in procs], [p.wait for p in procs], sessions=True)
    ranks.collect(0.2)              # the ranks whose exit was seen meanwhile
    remove_segments(ranks.members)  # after the job
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ..procfs import environ_of, is_zombie, process_table, start_time
from ..runs.report import Exit

SHM = Path("/dev/shm")
# Shared memory named after the process that made it: Paddle's DataLoader workers'
# tensors (paddle_<pid>_<count>_<random>, memory/allocation/mmap_allocator.cc) and
# paddle_dist's transport files where a rank had no private directory
# (paddle_dist-<what>-<pid>-...; heartbeats and the rest are in the job's directory,
# private.py, which the launcher removes as a whole).
SEGMENT = re.compile(r"^paddle_(\d+)_\d+_\d+$|^paddle_dist-[A-Za-z]+-(\d+)-")

def signal_pids(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def place_of(pid: int) -> Optional[Tuple[int, int, int]]:
    """(local rank, global rank, number of nodes) of a rank that Paddle's launcher started,
    from the variables it gave the process (PADDLE_LOCAL_RANK, PADDLE_TRAINER_ID,
    PADDLE_NNODES in /proc/<pid>/environ); None when they cannot be read. Its launcher
    numbers the ranks it started (its log files, its exit messages) 0, 1, ... on each
    machine: this says which rank of the job each one is.

    Example:
        place_of(4711)        # (0, 2, 2): the first rank here is rank 2 of a job on 2 nodes
    """
    found = environ_of(pid)
    if found is None:
        return None
    try:
        return (int(found[b"PADDLE_LOCAL_RANK"]), int(found[b"PADDLE_TRAINER_ID"]),
                int(found.get(b"PADDLE_NNODES", b"1")))
    except (KeyError, ValueError):
        return None


def _has_exited(pid: int) -> bool:
    """Whether our child `pid` has ended (a zombie, or reaped already); leaves it unreaped."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class Ranks:
    """The ranks' processes: when each exit was seen, which ones the launcher signalled,
    and every process that belonged to them (their DataLoader workers, watchdogs)."""

    def __init__(self, pids: Sequence[int], waits: Sequence[Callable[[], int]], sessions: bool):
        self.pids = list(pids)
        self.sessions = sessions            # each rank leads a session (and group) of its own
        self.exits: Dict[int, Exit] = {}
        self.signalled: Dict[int, float] = {}
        self.members: Dict[int, Tuple[int, str]] = {}   # pid: (rank, start time)
        self._seen: "queue.Queue[Tuple[int, int, float]]" = queue.Queue()
        for rank, wait in enumerate(waits):
            threading.Thread(target=self._wait, args=(rank, wait), daemon=True,
                             name=f"paddle_dist-wait-{rank}").start()

    def _wait(self, rank: int, wait: Callable[[], int]) -> None:
        code = wait()
        self._seen.put((rank, code, time.monotonic()))

    def collect(self, timeout: float) -> List[int]:
        """Wait up to `timeout` for exits; the ranks whose exit was seen meanwhile."""
        ended = []
        try:
            item = self._seen.get(timeout=timeout)
            while True:
                rank, code, at = item
                self.exits[rank] = Exit(rank, code, at, self.signalled.get(rank))
                ended.append(rank)
                item = self._seen.get_nowait()
        except queue.Empty:
            return ended

    def done(self) -> bool:
        return len(self.exits) == len(self.pids)

    def running(self) -> List[int]:
        return [rank for rank in range(len(self.pids)) if rank not in self.exits]

    def scan(self) -> None:
        """Note every process of the job alive now (in a rank's session, or below a rank)."""
        table = list(process_table())
        ranks = {pid: rank for rank, pid in enumerate(self.pids)}
        known = {pid: rank for pid, (rank, _) in self.members.items()}
        known.update(ranks)
        for _ in range(3):      # a worker's parent may come later in the table
            for pid, state, parent, session in table:
                rank = ranks.get(session) if self.sessions else None
                rank = rank if rank is not None else known.get(parent)
                if rank is not None and pid not in self.members:
                    self.members[pid] = (rank, start_time(pid))
                    known[pid] = rank

    def signal(self, sig: int, ranks: Optional[Iterable[int]] = None, group: bool = True) -> None:
        """Send `sig` to the running ranks (all, or `ranks`), with their process groups
        when `group`; each is remembered as signalled by the launcher from now on."""
        now = time.monotonic()
        for rank in self.running() if ranks is None else ranks:
            pid = self.pids[rank]
            if rank in self.exits or _has_exited(pid):
                continue            # ended by itself: not the launcher's doing
            self.signalled.setdefault(rank, now)
            self._kill(rank, sig, group)

    def kill_leftovers(self, rank: int) -> None:
        """SIGKILL what is left of ended rank `rank`: orphaned workers hold its sockets open,
        so the other ranks would wait on a dead peer. (A group outlives its leader, and its
        id is not reused while it has members.)"""
        self._kill(rank, signal.SIGKILL, group=True)

    def _kill(self, rank: int, sig: int, group: bool) -> None:
        pid = self.pids[rank]
        try:
            if group and self.sessions:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if group and not self.sessions:       # spawn: the rank's own children, by pid
            for member, (owner, started) in list(self.members.items()):
                if owner == rank and member != pid and started and start_time(member) == started:
                    signal_pids([member], sig)

    def kill_everything(self) -> None:
        for rank in range(len(self.pids)):
            self._kill(rank, signal.SIGKILL, group=True)

    def alive_members(self) -> List[int]:
        return [pid for pid, (_, started) in self.members.items()
                if started and start_time(pid) == started and not is_zombie(pid)]


def remove_segments(pids: Iterable[int], folder: Path = SHM) -> List[str]:
    """Remove the shared-memory files in `folder` that processes `pids` made and left
    behind (names carry the maker's pid, see SEGMENT); other processes' files stay.
    Returns the names removed.

    Example:
        remove_segments([4711])     # ['paddle_4711_3_2844767769', 'paddle_dist-grads-4711-93847']
    """
    pids, removed = set(pids), []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        match = SEGMENT.match(name)
        if match and int(match.group(1) or match.group(2)) in pids:
            try:
                os.unlink(folder / name)
                removed.append(name)
            except OSError:
                pass
    return removed
