"""Sum arrays across the ranks of one machine through shared memory (CPU training).

gloo moves every gradient through loopback TCP: about 0.5 GB/s per all-reduce between
two local processes here, 3.3 ms for an MLP's 1.6 MB, longer than the step's own compute.
Memory copies run at ~25 GB/s. So ranks that share a machine exchange gradients through a
segment in /dev/shm instead, as a reduce-scatter followed by an all-gather: each rank
copies its array into its own slot; rank q sums slice q of every slot, in rank order, and
publishes that sum; then every rank copies all W summed slices. Each rank reads and writes
about 4 times the array per all-reduce, whatever W (summing every slot on every rank read
W times the array: the machine moved W² arrays, slower than gloo at 8 ranks). Every sum is
computed once, from the same numbers in the same order (slot 0 + slot 1 + ...), and copied
to every rank, so all ranks end bit-identical.

The segment (one file, unlinked as soon as every rank has mapped it, so nothing is left
in /dev/shm even when the job is killed):
    int64 written[W] | reduced[W] | gathered[W] | pid[W]   (each block padded to 64 bytes)
    float32 slots[2][W][chunk rounded up to 16]            two buffers, used by turns
A round of L elements is cut into W slices, slice q = [bounds[q], bounds[q+1]) from
`slice_bounds(L, W)`, the same on every rank. Rank q's sum of slice q goes back over
slice q of its own slot, a place that no other rank reads before the sum is announced:
    slots[b][q] = | q's piece, slice 0 | ... | SUM of slice q | ... | q's piece, slice W-1 |

Round n (one chunk of the array) uses buffer b = n % 2:
  1. wait until every gathered[] >= n-2 (the last round that used buffer b is over
     everywhere; normally true at once, see `_round`);
  2. write scale * this rank's piece into slots[b][rank]; written[rank] = n;
  3. wait until every written[] >= n; sum slice `rank` of slots[b][0], [1], ... into the
     caller's arrays, copy it over slice `rank` of slots[b][rank]; reduced[rank] = n;
  4. wait until every reduced[] >= n; copy slice q of slots[b][q], for every other q, into
     the caller's arrays; gathered[rank] = n.
A small round (world x length <= SMALL_ROUND floats, e.g. LeNet's 62k on 2 or 4 ranks)
skips step 4's wait: at step 3 every rank sums every slot over the whole round (the same
additions, the same bits) and sets reduced[rank] = gathered[rank] = n. Reading W times a
small array costs less than a second wait for every rank, which on a busy machine can
mean waiting for a rank to be scheduled.
A rank that waits spins a little (not at all when ranks outnumber the cores), then yields
the CPU, then sleeps between looks; now and then it checks that its peers are alive, and
raises PeerGone when one has died.

This relies on a core's stores becoming visible to the others in program order (x86-64's
memory model): `supported()` is false elsewhere, and gloo is used there.

Example (in each of 2 processes, after agreeing on `path`):
    r = ShmReducer.create(path, world=2, chunk=1 << 20) if rank == 0 else \
        ShmReducer.attach(path, rank=1, world=2, chunk=1 << 20)
    r.all_reduce([a, b])     # float32 1-D arrays, in place: the sums over both ranks
"""

from __future__ import annotations

import mmap
import os
import platform
import time
from bisect import bisect_right
from pathlib import Path
from typing import Iterator, List, Tuple

import numpy as np

from .. import procfs
from ..security import private
from . import transports

SHM_DIR = Path("/dev/shm")
CHUNK = 1 << 22            # elements per slot and round (16 MiB of float32)
_BLOCK = 8                 # int64 per 64-byte line
_COUNTERS = 4              # header blocks: written, reduced, gathered, pid
_ALIGN = 16                # float32 per 64-byte line: slots and slices start on a line, so
                           # two ranks never write to the same line at once
_CHECK_EVERY = 2000        # waiting iterations between liveness checks of the peers
_SPINS = 200               # waiting iterations on the CPU before yielding it
_YIELDS = 2000             # waiting iterations before sleeping between looks
SMALL_ROUND = 1 << 18      # world x length (floats) up to which every rank sums every slot


class PeerGone(RuntimeError):
    """A rank died while the others waited for its part of an all-reduce."""


def supported() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and SHM_DIR.is_dir()


def host_key() -> str:
    """Equal for two processes exactly when they can share /dev/shm and see each other's
    pids: same boot of the same kernel, same mount, pid and network namespace (ranks in
    different network namespaces count as different machines, as they are meant to)."""
    return "|".join(procfs.boot_and_namespaces())


def _header_len(world: int) -> int:
    return _COUNTERS * _lines(world) * 64


def _lines(world: int) -> int:
    return -(-world // _BLOCK)


def segment_bytes(world: int, chunk: int) -> int:
    """The segment's size: what `create` reserves and every rank maps.

    Example:
        segment_bytes(2, 1 << 20)    # 256 + 2 buffers * 2 slots * 4 MiB
    """
    return _header_len(world) + 2 * world * _slot_len(chunk) * 4


def _slot_len(chunk: int) -> int:
    return -(-chunk // _ALIGN) * _ALIGN


def slice_bounds(length: int, world: int) -> List[int]:
    """Where each rank's slice of a round of `length` elements starts, and the last ends:
    equal parts rounded up to whole 64-byte lines (the last ranks get less, or nothing).

    Example:
        slice_bounds(100, 3)    # [0, 48, 96, 100]
    """
    step = -(-length // (world * _ALIGN)) * _ALIGN
    return [min(q * step, length) for q in range(world + 1)]


def _split(pieces: List[Tuple[np.ndarray, int]], bounds: List[int]
           ) -> Iterator[Tuple[np.ndarray, int, int]]:
    """The pieces (view, offset in the slot) cut at the slice bounds: (part of a view,
    its offset, the rank whose slice holds it)."""
    for view, at in pieces:
        start, end = at, at + len(view)
        while start < end:
            owner = bisect_right(bounds, start) - 1    # the last slice starting at or before
            stop = min(end, bounds[owner + 1])
            yield view[start - at:stop - at], start, owner
            start = stop


class ShmReducer:
    """One rank's view of the shared segment; see the module docstring for the protocol."""

    transport = transports.SHM

    def __init__(self, fd: int, rank: int, world: int, chunk: int, small_round: int = SMALL_ROUND):
        self.rank, self.world, self.chunk, self.small_round = rank, world, chunk, small_round
        self.ranks = list(range(world))    # the job's rank of each of this segment's ranks
        self.map = mmap.mmap(fd, segment_bytes(world, chunk))
        os.close(fd)
        width = _lines(world) * _BLOCK
        header = np.frombuffer(self.map, dtype=np.int64, count=_COUNTERS * width)
        self.written, self.reduced, self.gathered, self.pids = (
            header[k * width:k * width + world] for k in range(_COUNTERS))
        self.slots = np.frombuffer(self.map, dtype=np.float32, offset=_header_len(world),
                                   count=2 * world * _slot_len(chunk)).reshape(2, world, -1)
        self.round = 0
        # More ranks than cores: a rank that spins keeps the one it waits for off the CPU.
        self.spins = _SPINS if world <= len(os.sched_getaffinity(0)) else 0
        self.pids[rank] = os.getpid()

    @classmethod
    def create(cls, path: Path, world: int, chunk: int = CHUNK,
               small_round: int = SMALL_ROUND) -> "ShmReducer":
        """Rank 0: make the segment (its space reserved now: a full /dev/shm raises
        OSError here instead of SIGBUS later)."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, segment_bytes(world, chunk))
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        return cls(fd, 0, world, chunk, small_round)

    @classmethod
    def attach(cls, path: Path, rank: int, world: int, chunk: int = CHUNK,
               small_round: int = SMALL_ROUND) -> "ShmReducer":
        return cls(os.open(path, os.O_RDWR | os.O_NOFOLLOW), rank, world, chunk, small_round)

    def all_reduce(self, arrays: List[np.ndarray], scale: float = 1.0) -> int:
        """Replace each 1-D float32 array by the sum over all ranks of `scale` times it, in
        place (scale 1/W gives the mean, computed as paddle.DataParallel does: scaled,
        then summed). The arrays travel as one concatenation, `chunk` elements per round;
        returns the rounds used."""
        rounds, pieces, fill = 0, [], 0
        for array in arrays:
            start = 0
            while start < len(array):
                take = min(len(array) - start, self.chunk - fill)
                pieces.append((array[start:start + take], fill))
                start, fill = start + take, fill + take
                if fill == self.chunk:
                    self._round(pieces, scale)
                    rounds, pieces, fill = rounds + 1, [], 0
        if pieces or not rounds:
            self._round(pieces, scale)
            rounds += 1
        return rounds

    def _round(self, pieces: List[Tuple[np.ndarray, int]], scale: float) -> None:
        """One round (steps 1-4 of the module docstring): `pieces` are (view, offset in
        the slot). Step 1's wait normally passes at once: this rank got past step 4 of the
        previous round only once every rank had announced step 3 of it, hence finished
        the round before, the last that used this buffer."""
        self.round += 1
        n, slots = self.round, self.slots[self.round % 2]
        length = sum(len(v) for v, _ in pieces)
        self._wait(self.gathered, n - 2)
        for view, at in pieces:
            np.multiply(view, np.float32(scale), out=slots[self.rank, at:at + len(view)])
        self.written[self.rank] = n
        self._wait(self.written, n)
        if length * self.world <= self.small_round:
            # Small: every rank sums everything itself (the same additions in the same
            # order, so the same bits): one wait for all ranks instead of two, which
            # costs more than the extra reading when the round is this small.
            for view, at in pieces:
                self._reduce(slots, view, at, publish=False)
            self.reduced[self.rank] = self.gathered[self.rank] = n
            return
        parts = list(_split(pieces, slice_bounds(length, self.world)))
        for view, at, owner in parts:
            if owner == self.rank:
                self._reduce(slots, view, at)
        self.reduced[self.rank] = n
        self._wait(self.reduced, n)
        for view, at, owner in parts:
            if owner != self.rank:
                np.copyto(view, slots[owner, at:at + len(view)])
        self.gathered[self.rank] = n

    def _reduce(self, slots: np.ndarray, view: np.ndarray, at: int, publish: bool = True) -> None:
        """Sum this part of every slot into `view` (slot 0 + slot 1 + ...: the same
        additions in the same order as a rank summing everything itself), then publish it
        in this rank's own slot."""
        end = at + len(view)
        if self.world == 1:
            np.copyto(view, slots[0, at:end])
        else:
            np.add(slots[0, at:end], slots[1, at:end], out=view)
        for rank in range(2, self.world):
            np.add(view, slots[rank, at:end], out=view)
        if publish:
            np.copyto(slots[self.rank, at:end], view)

    def _wait(self, counters: np.ndarray, target: int) -> None:
        spins = 0
        while counters.min() < target:
            spins += 1
            if spins > _YIELDS:
                time.sleep(0.0001)
            elif spins > self.spins:
                os.sched_yield()
            if spins % _CHECK_EVERY == 0:
                self._check_peers(counters, target)

    def _check_peers(self, counters: np.ndarray, target: int) -> None:
        for rank in np.flatnonzero(counters < target):
            if not _alive(int(self.pids[rank])):
                raise PeerGone(f"rank {self.ranks[rank]} (pid {int(self.pids[rank])}) died during the "
                               "shared-memory all-reduce")

    def close(self) -> None:
        self.slots = self.written = self.reduced = self.gathered = self.pids = None
        self.map.close()


def _alive(pid: int) -> bool:
    """A pid that exists and is not a zombie (a dead child nobody has reaped yet)."""
    if pid <= 0:
        return True          # not registered yet: that rank has not attached
    return not procfs.is_zombie(pid)


def new_path(tag: str, job_dir: str = "") -> Path:
    """Where a new segment goes: the job's private directory (`job_dir`, private.py) where
    its launcher made one, else this user's, else /dev/shm itself (created exclusively all
    the same: never through another user's file or link)."""
    folder = job_dir if job_dir and private.owned(job_dir) else (private.user_dir() or str(SHM_DIR))
    return Path(folder) / f"paddle_dist-{tag}-{os.getpid()}-{time.monotonic_ns()}"
