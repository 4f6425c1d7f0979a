"""Gradient averaging as explicit, fused all-reduces once per optimizer step.

`paddle.DataParallel` all-reduces gradients from hooks inside `backward()`. When a peer
dies there, gloo's exception is thrown through C++ and the surviving rank is killed by
SIGABRT: it can neither log nor save. Here the gradients are averaged by a plain Python
call just before the optimizer update (Paddle applies `optimizer._grad_clip` to the
gradients at exactly that point, in `step()` and `minimize()` alike, which serves the
`loop` and the `hapi` path without touching either). A peer failure then surfaces as a
`PeerFailure` exception, and gradient accumulation communicates once per optimizer step
by construction. Few large all-reduces are also faster than DataParallel's many
(docs/benchmarks.md).

The first buffer carries one extra number, the count of ranks asking to stop
(preemption), so every rank learns of a stop request at the same step at no extra cost.

Options (config `sync:`): `bucket_mb` caps the buffers' size; `compress: bf16|fp16` sends
16-bit gradients (approximate); `mode: dataparallel` leaves the averaging to Paddle's
reducer instead.

Example:
    sync = GradSync.from_config(env, cfg.sync, monitor.phase)
    sync.attach(optimizer)          # before the first step
    model = wrap(net, env, sync)    # DataParallel with its reducer off (mode fused)
    ...; optimizer.step(); if sync.stop_requested: ...
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Callable, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.nn.clip import ClipGradBase

from . import shm
from .config import check_compress
from .errors import ConfigError


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, hung, or the connection broke."""


# sync.mode=dataparallel: the stop flag needs an all-reduce of its own, so the ranks
# exchange it about once every STOP_CHECK_S seconds (and at most STOP_CHECK_MAX steps
# apart): an extra collective at every step would cost a small model several percent.
STOP_CHECK_S = 1.0
STOP_CHECK_MAX = 1000
HALF = {"bf16": paddle.bfloat16, "fp16": paddle.float16}


class GradSync(ClipGradBase):
    """Averages gradients over all ranks, then applies the optimizer's own clipping.

    mode "fused", once per optimizer step: through shared memory when every rank is on
    this machine's CPU (transport auto or shm, see shm.py); otherwise in flat buffers (one
    per dtype, or capped at `bucket_mb` MiB each), optionally cast to 16 bits
    (`compress`), by the process group's all-reduce. mode "dataparallel":
    paddle.DataParallel's reducer has already averaged them in backward(); only the stop
    flag is exchanged, about once a second (`stop_check_interval`).
    """

    def __init__(self, env, phase: Optional[Callable[[str], contextlib.AbstractContextManager]] = None,
                 want_stop: Callable[[], bool] = lambda: False, mode: str = "fused",
                 bucket_mb: float = 0.0, compress: str = "none", transport: str = "auto"):
        super().__init__()
        check_compress(compress, env.backend)
        self.env, self.phase, self.want_stop = env, phase, want_stop
        self.mode, self.bucket_bytes, self.compress = mode, int(bucket_mb * 2 ** 20), compress
        self.transport = transport if mode == "fused" else "backend"
        self.shm: Optional[shm.ShmReducer] = None
        self.shm_tried = False
        self.inner = None
        self.stop_requested = False
        self.steps = 0          # optimizer steps seen
        self.calls = 0          # exchanges: all-reduce calls, or shared-memory rounds
        self.comm_seconds = 0.0  # time spent averaging (fused mode; the reducer's is hidden in backward)
        self.averaged_early = False
        self._next_check, self._checked = 1, (0, time.perf_counter())   # (step, time)

    @classmethod
    def from_config(cls, env, sync_cfg, phase=None, want_stop=lambda: False) -> "GradSync":
        return cls(env, phase, want_stop, sync_cfg.mode, sync_cfg.bucket_mb, sync_cfg.compress,
                   sync_cfg.transport)

    def attach(self, optimizer) -> None:
        """Install on `optimizer` (keeping a clip it already has, applied after averaging)."""
        if isinstance(optimizer._grad_clip, GradSync):
            return
        self.inner = optimizer._grad_clip
        optimizer._grad_clip = self

    def _dygraph_clip(self, params_grads):
        if self.averaged_early:
            self.averaged_early = False
        else:
            params_grads = self._timed_average(params_grads)
        return self.inner(params_grads) if self.inner is not None else params_grads

    def average_now(self, optimizer) -> None:
        """Average the gradients now, in place, before the optimizer step (which then
        leaves them alone): for a loss scaler, which must check the averaged gradients."""
        params = optimizer._parameter_list
        if params and isinstance(params[0], dict):          # parameter groups
            params = [p for group in params for p in group["params"]]
        params_grads = [(p, p.grad) for p in params if not p.stop_gradient]
        for (_, grad), (_, mean) in zip(params_grads, self._timed_average(params_grads)):
            if grad is not None and mean is not grad:
                paddle.assign(mean, grad)
        self.averaged_early = True

    def _timed_average(self, params_grads):
        started = time.perf_counter()
        try:
            return self.average(params_grads)
        finally:
            self.comm_seconds += time.perf_counter() - started

    def average(self, params_grads):
        self.steps += 1
        stop = 1.0 if self.want_stop() else 0.0
        if not self.env.is_distributed:
            self.stop_requested = bool(stop)
            return params_grads
        if self.mode == "dataparallel":
            if self.steps >= self._next_check:
                self._check_stop(stop)
            return params_grads
        present = [(p, g) for p, g in params_grads if g is not None]
        if self._use_shm(present):
            fp32 = [(p, g) for p, g in present if g.dtype == paddle.float32]
            averaged, stops = self._reduce_shm(fp32, stop)
            for bucket in self.buckets([(p, g) for p, g in present if g.dtype != paddle.float32]):
                averaged.update(self._reduce(bucket, None))
            self.stop_requested = stops > 0
            return [(p, averaged.get(id(p), g)) for p, g in params_grads]
        flag = paddle.to_tensor([stop], dtype="float32")
        buckets = self.buckets(present)
        averaged = {}
        for i, bucket in enumerate(buckets):
            averaged.update(self._reduce(bucket, flag if i == 0 else None))
        if not buckets:
            self._all_reduce(flag, "stop-flag all-reduce")
        self.stop_requested = float(flag.numpy()[0]) > 0
        return [(p, averaged.get(id(p), g)) for p, g in params_grads]

    def _check_stop(self, stop: float) -> None:
        """Exchange the stop flag, with rank 0's choice of the step for the next exchange:
        every rank then checks at the same step (rank 0 alone adds a non-zero interval)."""
        now = time.perf_counter()
        every = 0.0
        if self.env.global_rank == 0:
            step, at = self._checked
            every = float(stop_check_interval((now - at) / max(self.steps - step, 1)))
        flag = paddle.to_tensor([stop, every], dtype="float32")
        self._all_reduce(flag, "stop-flag all-reduce")
        stops, every = flag.numpy().tolist()
        self.stop_requested = stops > 0
        self._next_check, self._checked = self.steps + max(int(every), 1), (self.steps, now)

    def buckets(self, present) -> List[list]:
        """Group (param, grad) pairs by dtype, in order, each group at most bucket_bytes
        (a gradient larger than the cap gets a bucket of its own)."""
        by_dtype = {}
        for p, g in present:
            by_dtype.setdefault(g.dtype, []).append((p, g))
        out = []
        for group in by_dtype.values():
            current, size = [], 0
            for p, g in group:
                nbytes = int(g.size) * g.element_size()
                if current and self.bucket_bytes and size + nbytes > self.bucket_bytes:
                    out.append(current)
                    current, size = [], 0
                current.append((p, g))
                size += nbytes
            out.append(current)
        return out

    def _reduce(self, bucket, flag):
        """All-reduce one flat buffer (plus the stop flag); return {id(param): mean grad}."""
        dtype = bucket[0][1].dtype
        parts: List[paddle.Tensor] = [g.reshape([-1]) for _, g in bucket]
        if flag is not None:
            parts.append(flag.astype(dtype))
        flat = paddle.concat(parts)
        wire = HALF.get(self.compress)
        if wire is not None and dtype == paddle.float32:
            sent = flat.astype(wire)
            self._all_reduce(sent, "gradient all-reduce")
            flat = sent.astype(dtype)
        else:
            self._all_reduce(flat, "gradient all-reduce")
        if flag is not None:
            flag.set_value(flat[-1:].astype("float32"))
            flat = flat[:-1]
        flat = flat / self.env.world_size
        sizes = [int(g.size) for _, g in bucket]
        pieces = paddle.split(flat, sizes) if len(sizes) > 1 else [flat]
        return {id(p): piece.reshape(g.shape) for (p, g), piece in zip(bucket, pieces)}

    @property
    def used(self) -> str:
        """How gradients travelled: shm, backend (gloo / NCCL), or none (one process)."""
        if not self.env.is_distributed:
            return "none"
        return "shm" if self.shm is not None else "backend"

    def _use_shm(self, present) -> bool:
        """Whether this step goes through shared memory; the first call sets it up (every
        rank calls it at the same step, so its collectives line up)."""
        if self.transport == "backend" or self.compress != "none" or self.env.device != "cpu":
            return False
        if not self.shm_tried:
            self.shm_tried = True
            count = sum(int(g.size) for _, g in present if g.dtype == paddle.float32) + 1
            self.shm = open_shm(self.env, min(count, shm.CHUNK), self.phase)
            if self.shm is None and self.transport == "shm":
                raise ConfigError("sync.transport=shm needs every rank on this machine (same "
                                  "/dev/shm, x86-64); use sync.transport=auto")
        return self.shm is not None

    def _reduce_shm(self, group, stop: float):
        """The float32 gradients (and the stop flag) summed through shared memory, in place:
        numpy views of the gradients' own memory (dlpack), no copies but the slot's.
        Returns ({id(param): grad}, the stop flag's sum)."""
        views = [np.from_dlpack(g.detach()).reshape(-1) for _, g in group]
        flag = np.array([stop], dtype=np.float32)
        guard = self.phase("comm") if self.phase else contextlib.nullcontext()
        with guard:
            try:
                self.calls += self.shm.all_reduce(views + [flag], scale=1.0 / self.env.world_size)
            except shm.PeerGone as exc:
                raise PeerFailure(f"gradient all-reduce failed: {exc}") from exc
        return {id(p): g for p, g in group}, float(flag[0])

    def _all_reduce(self, tensor, what: str) -> None:
        self.calls += 1
        collective(dist.all_reduce, tensor, phase=self.phase, what=what)


def stop_check_interval(seconds_per_step: float) -> int:
    """Steps between two stop-flag exchanges: about STOP_CHECK_S seconds' worth."""
    if seconds_per_step <= 0:
        return STOP_CHECK_MAX
    return max(1, min(STOP_CHECK_MAX, round(STOP_CHECK_S / seconds_per_step)))


def open_shm(env, chunk: int, phase=None) -> Optional[shm.ShmReducer]:
    """A shared-memory reducer for this job's ranks, or None on every rank when they do not
    all share this machine (or the segment cannot be made). Collective: every rank calls
    it at the same point. Rank 0 creates the segment, the others map it, and rank 0
    unlinks it once everyone has.

    Example:
        reducer = open_shm(env, chunk=1 << 20)    # None: use dist.all_reduce instead
    """
    def call(fn, *args):
        collective(fn, *args, phase=phase, what="shared-memory set-up")

    rank, world = env.global_rank, env.world_size
    keys: List[str] = []
    call(dist.all_gather_object, keys, shm.host_key() if shm.supported() else f"unsupported-{rank}")
    if len(set(keys)) != 1:
        return None
    reducer, path = None, [""]
    if rank == 0:
        try:
            created = shm.new_path("grads")
            reducer, path = shm.ShmReducer.create(created, world, chunk), [str(created)]
        except OSError:
            pass
    call(dist.broadcast_object_list, path, 0)
    if path[0] and rank != 0:
        try:
            reducer = shm.ShmReducer.attach(Path(path[0]), rank, world, chunk)
        except OSError:
            reducer = None
    ready: List[bool] = []
    call(dist.all_gather_object, ready, reducer is not None)
    if rank == 0 and path[0]:
        os.unlink(path[0])
    if not all(ready) and reducer is not None:
        reducer.close()
        reducer = None
    return reducer


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def collective(fn, *args, phase=None, what: str = "collective"):
    """Run a collective call, turning a peer's failure into PeerFailure."""
    guard = phase("comm") if phase else contextlib.nullcontext()
    with guard:
        try:
            return fn(*args)
        except RuntimeError as exc:
            raise PeerFailure(f"{what} failed: {_first_line(exc)}") from exc


def wrap(net, env, sync: GradSync):
    """`paddle.DataParallel(net)` (which broadcasts rank 0's weights), with its in-backward
    reducer switched off unless sync.mode=dataparallel; `net` itself on a single process."""
    if not env.is_distributed:
        return net
    model = paddle.DataParallel(net)
    if sync.mode != "dataparallel":
        disable_reducer(model)
    return model


def disable_reducer(data_parallel) -> None:
    """Stop paddle.DataParallel's in-backward all-reduce; GradSync does the averaging.

    (Were this ever ignored by a future Paddle, results stay correct: averaging gradients
    that are already equal on every rank leaves them unchanged.)
    """
    data_parallel.grad_need_sync = False
