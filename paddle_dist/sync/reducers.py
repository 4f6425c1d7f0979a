"""Sums of float32 arrays over the ranks, in place: the transports of the CPU gradient sync.

Every reducer has one method, `all_reduce(arrays, scale) -> exchanges`: each 1-D float32
numpy array (a view of a gradient's own memory, or the stop flag) is replaced by the sum
over all ranks of `scale` times it, the same bits on every rank.

- `shm.ShmReducer`: every rank on this machine, through one /dev/shm segment.
- `BackendReducer`: the process group's all-reduce (gloo) of one flat buffer.
- `HierReducer`: several machines with several ranks each. The ranks of a host sum
  through their shared-memory segment, one leader per host all-reduces those sums with
  the other leaders over the backend, and each leader hands the result back to its
  host's ranks through the segment. Only the leaders' traffic crosses the network.

`open_reducer(env, transport, count)` picks one; every rank calls it at the same point
(it is collective) and every rank gets the same kind.

Example:
    reducer = open_reducer(env, "auto", count=n_floats)
    reducer.all_reduce([grad_view, flag], scale=1.0 / env.world_size)   # the mean, in place
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from .. import compat
from . import shm, transports
from .collectives import collective
from ..errors import ConfigError

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv


class BackendReducer:
    """The process group's all-reduce (or a subgroup's) of the arrays packed into one flat
    buffer: float32, or bfloat16 with `compress="bf16"` (half the bytes on the wire, 8 bits
    of mantissa). The buffer is a Paddle tensor with a numpy view of its memory, made once
    per size (`reserve` makes them ahead, outside the communication thread)."""

    transport = transports.BACKEND

    def __init__(self, group=None, compress: str = "none"):
        self.group, self.bf16 = group, compress == "bf16"
        self.buffers: Dict[int, Tuple[paddle.Tensor, np.ndarray]] = {}

    def reserve(self, size: int) -> Tuple[paddle.Tensor, np.ndarray]:
        if size not in self.buffers:
            # bf16: numpy has no bfloat16, its view holds the bits as uint16
            tensor = paddle.zeros([size], dtype="bfloat16" if self.bf16 else "float32")
            self.buffers[size] = (tensor, compat.numpy_view(tensor))
        return self.buffers[size]

    def all_reduce(self, arrays: List[np.ndarray], scale: float = 1.0) -> int:
        tensor, flat = self.reserve(sum(len(a) for a in arrays))
        at = 0
        for a in arrays:
            if self.bf16:
                flat[at:at + len(a)] = to_bf16_bits(a * np.float32(scale))
            else:
                np.multiply(a, np.float32(scale), out=flat[at:at + len(a)])
            at += len(a)
        dist.all_reduce(tensor, group=self.group)        # gloo: in place, releases the GIL
        at = 0
        for a in arrays:
            if self.bf16:
                a.view(np.uint32)[:] = flat[at:at + len(a)].astype(np.uint32) << 16
            else:
                a[:] = flat[at:at + len(a)]
            at += len(a)
        return 1


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> the bits of the nearest bfloat16 (ties to even), as uint16.

    Example:
        to_bf16_bits(np.array([1.0, 1.00390625], np.float32))   # [0x3f80, 0x3f80]
    """
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)


class HierReducer:
    """Shared memory within a host, the backend between hosts' leaders (module docstring).

    `local` is None for a rank alone on its host; `leaders` is None except on leaders."""

    transport = transports.HIERARCHICAL

    def __init__(self, local: Optional[shm.ShmReducer], leaders: Optional[BackendReducer]):
        self.local, self.leaders = local, leaders

    def reserve(self, size: int) -> None:
        if self.leaders is not None:
            self.leaders.reserve(size)

    def all_reduce(self, arrays: List[np.ndarray], scale: float = 1.0) -> int:
        if self.local is None:
            return self.leaders.all_reduce(arrays, scale)
        rounds = self.local.all_reduce(arrays, scale)      # the host's sum, on each of its ranks
        if self.leaders is not None:
            self.leaders.all_reduce(arrays)                # the hosts' sums, on the leaders
        # Back to the host: the leader's values plus zeros from the others, exactly.
        self.local.all_reduce(arrays, 1.0 if self.leaders is not None else 0.0)
        return rounds


def open_reducer(env: DistEnv, transport: str, count: int, phase=None, compress: str = "none"):
    """The reducer of float32 CPU gradients for `transport` (auto, or an entry of
    transports.py) sending sync.compress's `compress`; `count` floats per exchange at most
    (it sizes the segments). Collective.

    A named transport, or auto with compress: the entry's opener (transports.carrier).
    auto: shared memory when every rank is on this machine, hierarchical when some
    machine has several ranks, else the backend."""
    entry = transports.carrier(transport, compress)
    if entry is not None:
        return entry.open(env, count, phase, compress)
    return _by_hosts(env, count, phase, transport)


def _by_hosts(env: DistEnv, count: int, phase, transport: str):
    """Shared memory when every rank is on this machine, hierarchical when some machine
    has several ranks, else the backend; `transport` (auto | hierarchical) says what a
    failed shared-memory set-up across hosts does (_open_hier)."""
    keys = _gather(env, _key(env), phase)
    hosts = host_groups(keys)
    chunk = min(count, shm.CHUNK)
    if len(hosts) == 1:
        reducer = open_shm(env, chunk, phase, keys)
        if reducer is not None:
            return reducer
    if len(hosts) == 1 or all(len(ranks) == 1 for ranks in hosts):
        return BackendReducer()                  # nothing for shared memory to save
    return _open_hier(env, hosts, keys, chunk, phase, transport)


def open_backend(env: DistEnv, count: int, phase=None, compress: str = "none") -> BackendReducer:
    return BackendReducer(compress=compress)


def open_shm_only(env: DistEnv, count: int, phase=None):
    """sync.transport=shm: shared memory, or a ConfigError on every rank where the ranks
    are not all on this machine."""
    keys = _gather(env, _key(env), phase)
    reducer = open_shm(env, min(count, shm.CHUNK), phase, keys) if len(host_groups(keys)) == 1 else None
    if reducer is None:
        raise ConfigError("sync.transport=shm needs every rank on this machine (same /dev/shm, "
                          "x86-64); use sync.transport=auto")
    return reducer


def open_hierarchical(env: DistEnv, count: int, phase=None):
    """sync.transport=hierarchical: shared memory within hosts, the backend between them
    (shared memory alone when every rank is on one machine)."""
    return _by_hosts(env, count, phase, "hierarchical")


def host_groups(keys: List[str]) -> List[List[int]]:
    """Global ranks grouped by host key, hosts in order of their lowest rank.

    Example:
        host_groups(["a", "a", "b", "b"])   # [[0, 1], [2, 3]]
    """
    groups: Dict[str, List[int]] = {}
    for rank, key in enumerate(keys):
        groups.setdefault(key, []).append(rank)
    return list(groups.values())


def _open_hier(env: DistEnv, hosts: List[List[int]], keys: List[str], chunk: int, phase, transport: str):
    leaders = [ranks[0] for ranks in hosts]
    group = dist.new_group(leaders)            # every rank takes part in making it
    local, ready = _open_local(env, keys, chunk, phase)
    if not ready:                              # the same answer on every rank
        if transport == "auto":
            return BackendReducer()
        raise ConfigError("sync.transport=hierarchical could not set up shared memory on every "
                          "host (/dev/shm full or missing?); use sync.transport=backend")
    return HierReducer(local, BackendReducer(group) if env.global_rank in leaders else None)


def open_shm(env: DistEnv, chunk: int, phase=None, keys: Optional[List[str]] = None):
    """A shared-memory reducer among the ranks that share this rank's host, or None on
    every rank when some host's ranks cannot share a segment. Collective: every rank
    calls it at the same point.

    Example:
        reducer = open_shm(env, chunk=1 << 20)    # None: use dist.all_reduce instead
    """
    if keys is None:
        keys = _gather(env, _key(env), phase)
    reducer, ready = _open_local(env, keys, chunk, phase)
    return reducer if ready else None


def _open_local(env: DistEnv, keys: List[str], chunk: int, phase):
    """(this host's ShmReducer or None when the rank is alone, whether every host's ranks
    got theirs). Each host's lowest rank creates its segment, the others map it, and it is
    unlinked once everyone has: nothing is left in /dev/shm, even after kill -9."""
    rank = env.global_rank
    mine = [r for r, key in enumerate(keys) if key == keys[rank]]
    leader, local_rank, world = mine[0], mine.index(rank), len(mine)
    reducer, created = None, ""
    if rank == leader and world > 1 and not keys[rank].startswith("unsupported"):
        try:
            path = shm.new_path("grads", env.job_dir)
            reducer, created = shm.ShmReducer.create(path, world, chunk), str(path)
        except OSError:
            pass
    try:
        paths = _gather(env, created, phase)
        if rank != leader and paths[leader]:
            try:
                reducer = shm.ShmReducer.attach(Path(paths[leader]), local_rank, world, chunk)
            except OSError:
                reducer = None
        ready = all(_gather(env, reducer is not None or world == 1, phase))
    finally:            # whatever happens (a peer dies during set-up): nothing left behind
        if created:
            os.unlink(created)
    if not ready and reducer is not None:
        reducer.close()
        reducer = None
    if reducer is not None:
        reducer.ranks = mine         # its errors name peers by their global rank
    return reducer, ready


def _key(env: DistEnv) -> str:
    return shm.host_key() if shm.supported() else f"unsupported-{env.global_rank}"


def _gather(env: DistEnv, value, phase) -> list:
    found: list = []
    collective(dist.all_gather_object, found, value, phase=phase, what="shared-memory set-up")
    return found
