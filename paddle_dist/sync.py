"""Gradient averaging across the ranks, finished by the optimizer step, at both API levels.

`paddle.DataParallel` all-reduces gradients from hooks inside `backward()`. When a peer
dies there, gloo's exception is thrown through C++ and the surviving rank is killed by
SIGABRT: it can neither log nor save. Here every collective is issued from Python (the
main thread, or paddle_dist's communication thread) and the optimizer waits for them
just before the update (Paddle applies `optimizer._grad_clip` to the gradients at exactly
that point, in `step()` and `minimize()` alike, which serves the `loop` and the `hapi`
path without touching either). A peer failure then surfaces as a `PeerFailure`
exception, and gradient accumulation communicates once per optimizer step.

Modes (config `sync.mode`):
- `overlap`: buckets of gradients leave during backward() as they fill, on a
  communication thread (CPU) or NCCL's stream (GPUs): overlap.py.
- `fused`: everything in one exchange (or `bucket_mb`-sized buffers) at the step.
- `auto` (default): fused when every rank is on this machine's CPUs (shared memory
  is faster than the thread's hand-off); overlap otherwise.
- `dataparallel`: Paddle's own reducer inside backward().

Transports (`sync.transport`, CPU): shared memory on one machine, shared memory within
hosts plus the backend between them (`hierarchical`), or the backend: reducers.py.

The first exchange carries one extra number, the count of ranks asking to stop
(preemption), so every rank learns of a stop request at the same step at no extra cost.

Example:
    sync = GradSync.from_config(env, cfg.sync, monitor.phase)
    sync.attach(optimizer)          # before the first step; collective
    model = wrap(net, env, sync)    # DataParallel with its reducer off
    ...; optimizer.step(); if sync.stop_requested: ...
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.nn.clip import ClipGradBase

from . import compat, reducers, shm
from .comm import PeerFailure, collective, first_line
from .config import check_compress
from .overlap import AsyncExchange, Overlap, ThreadExchange

__all__ = ["GradSync", "PeerFailure", "collective", "wrap", "disable_reducer", "stop_check_interval"]
DEFAULT_BUCKET_MB = 25.0      # overlap: DDP's cap on one bucket

# sync.mode=dataparallel: the stop flag needs an all-reduce of its own, so the ranks
# exchange it about once every STOP_CHECK_S seconds (and at most STOP_CHECK_MAX steps
# apart): an extra collective at every step would cost a small model several percent.
STOP_CHECK_S = 1.0
STOP_CHECK_MAX = 1000
HALF = {"bf16": paddle.bfloat16, "fp16": paddle.float16}


class GradSync(ClipGradBase):
    """Averages gradients over all ranks, then applies the optimizer's own clipping.

    `attach(optimizer)` installs it and sets up the transport (collective). Per step:
    `arm(final)` before each backward() (only needed with accumulation: the last
    micro-batch's is final), then the optimizer step calls it with the gradients.
    mode "dataparallel": paddle.DataParallel's reducer has already averaged them in
    backward(); only the stop flag is exchanged, about once a second
    (`stop_check_interval`).
    """

    def __init__(self, env, phase: Optional[Callable[[str], contextlib.AbstractContextManager]] = None,
                 want_stop: Callable[[], bool] = lambda: False, mode: str = "auto",
                 bucket_mb: float = 0.0, compress: str = "none", transport: str = "auto",
                 accumulate_steps: int = 1):
        super().__init__()
        check_compress(compress, env.backend)
        self.env, self.phase, self.want_stop = env, phase, want_stop
        self.mode, self.bucket_bytes, self.compress = mode, int(bucket_mb * 2 ** 20), compress
        self.transport = transport if mode != "dataparallel" else "backend"
        self.accumulate_steps = accumulate_steps
        self.reducer = None       # CPU float32 transport (reducers.py); None: Paddle tensors
        self.overlap: Optional[Overlap] = None
        self.inner = None
        self.stop_requested = False
        self.steps = 0          # optimizer steps seen
        self.calls = 0          # exchanges: all-reduce calls, or shared-memory rounds
        self.comm_seconds = 0.0  # time the step waited for the exchanges
        self.averaged_early = False
        self._late_flag = None   # GPUs: last step's stop flag, read one step late
        self._next_check, self._checked = 1, (0, time.perf_counter())   # (step, time)

    @classmethod
    def from_config(cls, env, sync_cfg, phase=None, want_stop=lambda: False,
                    accumulate_steps: int = 1) -> "GradSync":
        return cls(env, phase, want_stop, sync_cfg.mode, sync_cfg.bucket_mb, sync_cfg.compress,
                   sync_cfg.transport, accumulate_steps)

    def attach(self, optimizer) -> None:
        """Install on `optimizer` (keeping a clip it already has, applied after averaging)
        and set up the transport. Collective: every rank calls it at the same point."""
        if isinstance(optimizer._grad_clip, GradSync):
            return
        self.inner = optimizer._grad_clip
        optimizer._grad_clip = self
        if self.env.is_distributed and self.mode != "dataparallel":
            self._setup(_trainable(optimizer))

    def _setup(self, params) -> None:
        cpu = self.env.device == "cpu"
        float32 = all(p.dtype == paddle.float32 for p in params)
        if cpu and float32 and self.compress == "bf16":
            self.reducer = reducers.BackendReducer(compress="bf16")  # compressed: the backend
        elif cpu and float32 and self.compress == "none":
            count = sum(int(p.size) for p in params) + 1          # + the stop flag
            self.reducer = reducers.open_reducer(self.env, self.transport, count, self.phase)
        self.mode = self._resolve_mode()
        if self.mode == "fused" and isinstance(self.reducer, reducers.BackendReducer):
            self.reducer = None           # the step's Paddle buffers: bucket_mb, compress
        if self.mode == "overlap":
            scale = 1.0 / self.env.world_size
            exchange = ThreadExchange(self.reducer, scale) if cpu else \
                AsyncExchange(self.env.world_size, wire=HALF.get(self.compress))
            cap = self.bucket_bytes or int(DEFAULT_BUCKET_MB * 2 ** 20)
            self.overlap = Overlap(params, exchange, cap, self._stop_value, self.accumulate_steps)

    def _resolve_mode(self) -> str:
        """overlap / fused for mode auto (and fused where overlap cannot run)."""
        if self.env.device == "cpu" and self.reducer is None:
            return "fused"                # no float32 CPU transport: the step's Paddle path
        if self.mode == "auto":
            return "fused" if isinstance(self.reducer, shm.ShmReducer) else "overlap"
        return self.mode

    def arm(self, final: bool) -> None:
        """Before a backward(), with accumulation: whether an optimizer step follows it.
        Only the final micro-batch's backward() sends buckets (mode overlap); unarmed,
        they all go at the step."""
        if self.overlap is not None:
            self.overlap.arm(final)

    def close(self) -> None:
        if self.overlap is not None:
            self.overlap.close()
            self.overlap = None

    def _stop_value(self) -> float:
        return 1.0 if self.want_stop() else 0.0

    def _dygraph_clip(self, params_grads):
        if self.averaged_early:
            self.averaged_early = False
        else:
            params_grads = self._timed_average(params_grads)
        return self.inner(params_grads) if self.inner is not None else params_grads

    def average_now(self, optimizer) -> None:
        """Average the gradients now, in place, before the optimizer step (which then
        leaves them alone): for a loss scaler, which must check the averaged gradients."""
        params_grads = [(p, p.grad) for p in _trainable(optimizer)]
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
        if not self.env.is_distributed:
            self.stop_requested = bool(self._stop_value())
            return params_grads
        if self.mode == "dataparallel":
            if self.steps >= self._next_check:
                self._check_stop(self._stop_value())
            return params_grads
        if self.overlap is not None:
            return self._finish_overlap(params_grads)
        present = [(p, g) for p, g in params_grads if g is not None]
        if self.reducer is not None:
            averaged, stops = self._reduce_cpu(present, self._stop_value())
        else:
            averaged, stops = self._reduce_buckets(present, self._stop_value())
        self.stop_requested = stops > 0
        return [(p, averaged.get(id(p), g)) for p, g in params_grads]

    def _finish_overlap(self, params_grads):
        size = self.overlap.nbytes
        guard = self.phase("comm", "all-reduce", size) if self.phase else contextlib.nullcontext()
        with guard:
            self.stop_requested = self.overlap.finish() > 0
        self.calls = self.overlap.exchange.calls
        return params_grads              # averaged in place

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

    def _reduce_buckets(self, present, stop: float):
        """Flat Paddle buffers through the process group (any device and dtype, optionally
        16-bit on the wire); returns ({id(param): mean grad}, the stop flag's sum)."""
        flag = paddle.to_tensor([stop], dtype="float32")
        buckets = self.buckets(present)
        averaged = {}
        for i, bucket in enumerate(buckets):
            averaged.update(self._reduce(bucket, flag if i == 0 else None))
        if not buckets:
            self._all_reduce(flag, "stop-flag all-reduce")
        return averaged, self._read_flag(flag)

    def _read_flag(self, flag) -> float:
        """The stop flag's sum; on GPUs the previous step's, so that the host never waits
        for the device here (every rank reads the same step's flag at the same step)."""
        if self.env.device == "cpu":
            return float(flag.numpy()[0])
        previous, self._late_flag = self._late_flag, flag
        return float(previous.numpy()[0]) if previous is not None else 0.0

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

    def describe(self) -> str:
        """For the start-up line, e.g. 'sync overlap (4 buckets) over hierarchical'."""
        if not self.env.is_distributed:
            return "no sync (one process)"
        if self.mode == "dataparallel":
            return "sync by paddle.DataParallel"
        buckets = f" ({len(self.overlap.buckets)} buckets)" if self.overlap is not None else ""
        return f"sync {self.mode}{buckets} over {self.used}"

    @property
    def used(self) -> str:
        """How gradients travelled: shm, hierarchical, backend (gloo / NCCL), or none."""
        if not self.env.is_distributed:
            return "none"
        if isinstance(self.reducer, shm.ShmReducer):
            return "shm"
        return "hierarchical" if isinstance(self.reducer, reducers.HierReducer) else "backend"

    def _reduce_cpu(self, present, stop: float):
        """The float32 gradients (and the stop flag) averaged in place by the CPU reducer:
        numpy views of the gradients' own memory (compat.numpy_view), no copies but the transport's.
        Returns ({id(param): grad}, the stop flag's sum, scaled like the gradients)."""
        views = [compat.numpy_view(g.detach()) for _, g in present]
        flag = np.array([stop], dtype=np.float32)
        size = sum(v.nbytes for v in views)
        guard = self.phase("comm", "all-reduce", size) if self.phase else contextlib.nullcontext()
        with guard:
            try:
                self.calls += self.reducer.all_reduce(views + [flag], scale=1.0 / self.env.world_size)
            except RuntimeError as exc:             # gloo's error, or shm.PeerGone
                raise PeerFailure(f"gradient all-reduce failed: {first_line(exc)}") from exc
        return {id(p): g for p, g in present}, float(flag[0])

    def _all_reduce(self, tensor, what: str) -> None:
        self.calls += 1
        collective(dist.all_reduce, tensor, phase=self.phase, what=what)


def _trainable(optimizer) -> list:
    """The optimizer's trainable parameters (flattening parameter groups)."""
    params = optimizer._parameter_list
    if params and isinstance(params[0], dict):
        params = [p for group in params for p in group["params"]]
    return [p for p in params if not p.stop_gradient]


def stop_check_interval(seconds_per_step: float) -> int:
    """Steps between two stop-flag exchanges: about STOP_CHECK_S seconds' worth."""
    if seconds_per_step <= 0:
        return STOP_CHECK_MAX
    return max(1, min(STOP_CHECK_MAX, round(STOP_CHECK_S / seconds_per_step)))


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
