"""Gradient averaging across the ranks, at the start of every optimizer step, at both API levels.

`paddle.DataParallel` all-reduces gradients from hooks inside `backward()`. When a peer
dies there, gloo's exception is thrown through C++ and the surviving rank is killed by
SIGABRT: it can neither log nor save. Here every collective is issued from Python (the
main thread, or paddle_dist's communication thread), before the optimizer's update: the
loop's step calls `average_now()` (trainer/engine.py), and `attach` gives the optimizer
object a subclass of its own class whose `step`/`minimize` average first (how a step
that paddle.Model runs, `Model.fit` calling `minimize`, is reached). Whatever the
optimizer does next (parameter groups, clipping, master weights) sees the averaged
gradients. A peer failure is a `PeerFailure`; accumulation communicates once per step.

What every exchange carries, in a layout the ranks agree on before anything starts
(`agree_on_layout`: the trainable parameters' names, shapes and dtypes, compared across
ranks; a difference is an error naming the parameter, never a sum of misaligned buffers):
- every trainable parameter's gradient, a missing one (a branch this rank's batch did
  not reach) as zeros;
- one number per parameter, whether this rank has its gradient: a parameter that some
  rank has a gradient for gets the mean on every rank (a rank without one gets it
  created), as `paddle.DataParallel(find_unused_parameters=True)` does; one that no rank
  has stays without, so no optimizer touches it, as in one process;
- the count of ranks asking to stop (preemption), so every rank learns of a stop
  request at the same step at no extra cost;
- on the CPU reducers, a rider's float32 values (`Rider`: BatchNorm's sums, batchstats.py;
  the loss's count, trainer/weighting.py), averaged like the gradients and handed to its
  `take`: no exchange of their own (elsewhere `take(None)` follows the average).
Sparse tables (gradients as rows) travel before it, as rows, in every mode (sparse.py).

Modes (config `sync.mode`):
- `overlap`: buckets of gradients leave during backward() as they fill, on a
  communication thread (CPU) or NCCL's stream (GPUs): overlap.py.
- `fused`: everything in one exchange (or `bucket_mb`-sized buffers) at the step.
- `auto` (default): on CPUs, fused when every rank is on this machine, overlap otherwise;
  on GPUs, dataparallel (`resolve_mode`).
- `dataparallel`: Paddle's own reducer inside backward() (`sync.find_unused_parameters`,
  default true), given only Paddle's own layers' parameters (sparse.py); on NCCL it is
  what Paddle tests, so GPUs run it unless `sync.mode=overlap` is chosen.

Transports (`sync.transport`, CPU): shared memory on one machine, shared memory within
hosts plus the backend between them (`hierarchical`), or the backend: reducers.py.

Before anything starts, every rank agrees on the layout and the optimizer is checked
(checks.py); the optimizer's class and paddle.DataParallel are wired in wiring.py.

Example:
    sync = GradSync.from_config(env, cfg.sync, monitor.phase)
    agree_on_layout(optimizer, net, env)   # before anything starts; collective (checks.py)
    sync.attach(optimizer, net)     # before the first step; collective
    model = wrap(net, env, sync)    # rank 0's weights broadcast, no reducer (wiring.py)
    ...; optimizer.step(); if sync.stop_requested: ...
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist

from . import reducers, sparse, transports
from .checks import resolve_mode, stop_check_interval, trainable
from .collectives import collective, first_line
from ..errors import ConfigError, PeerFailure
from .overlap import (AsyncExchange, LateFlag, Overlap, ThreadExchange, give_missing, grad_views, set_grad, sixteen_bit_mean_first)
from .wiring import install, uninstall
from ..schema import SyncConfig

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv

__all__ = ["GradSync"]
DEFAULT_BUCKET_MB = 25.0      # overlap: DDP's cap on one bucket
HALF = {"bf16": paddle.bfloat16, "fp16": paddle.float16}


@dataclass(frozen=True)
class Rider:
    """`size` float32 values that travel with the gradients (module docstring): `give()`
    before the exchange, `take(mean)` after it, `take(None)` after an average that could
    not carry them (sync.attach(optimizer, net, rider))."""

    size: int
    give: Callable[[], np.ndarray]
    take: Callable[[np.ndarray], None]


class GradSync:
    """Averages the gradients of an optimizer's parameters over all ranks, at the start of
    its every step (module docstring).

    `attach(optimizer, net)` installs it and sets up the transport (collective). Per step:
    `arm(final)` before each backward() (only needed with accumulation: the last
    micro-batch's is final); the optimizer's `step()`/`minimize()` then average.
    mode "dataparallel": paddle.DataParallel's reducer has averaged those it was given in
    backward(); the rest (sparse.py) and the stop flag travel here, or only the stop flag,
    about once a second (`stop_check_interval`).
    """

    def __init__(self, env: DistEnv, phase: Optional[Callable[[str], contextlib.AbstractContextManager]] = None,
                 want_stop: Callable[[], bool] = lambda: False, mode: str = "auto",
                 bucket_mb: float = 0.0, compress: str = "none", transport: str = "auto",
                 accumulate_steps: int = 1, find_unused: bool = True):
        transports.check(transport, compress, env.backend)
        self.env, self.phase, self.want_stop = env, phase, want_stop
        self.requested, self.mode = mode, resolve_mode(mode, env.device, compress, bucket_mb, transport)
        self.bucket_bytes, self.compress = int(bucket_mb * 2 ** 20), compress
        self.transport = transport if self.mode != "dataparallel" else transports.BACKEND.name
        self.accumulate_steps = accumulate_steps
        self.find_unused = find_unused   # mode dataparallel: Paddle's find_unused_parameters
        self.reducer = None       # CPU float32 transport (reducers.py); None: Paddle tensors
        self.overlap: Optional[Overlap] = None
        self.optimizer, self.names, self.tables = None, {}, sparse.Tables(env, [])
        self.params: list = []    # the exchange's layout: the trainable parameters at attach
        self.stop_requested = self.averaged_early = False
        self.steps = 0          # optimizer steps seen
        self.calls = 0          # exchanges: all-reduce calls, or shared-memory rounds
        self.comm_seconds = 0.0  # time the step waited for the exchanges
        # Values that travel with the gradients where they can (Rider, module docstring).
        self.rider, self.rider_size = None, 0     # Optional[Rider], its size
        self._late_flag = LateFlag()   # GPUs: the stop flag, read late and seldom
        self._next_check, self._checked = 1, (0, time.perf_counter())   # (step, time)

    @classmethod
    def from_config(cls, env: DistEnv, sync_cfg: SyncConfig, phase=None, want_stop=lambda: False,
                    accumulate_steps: int = 1) -> "GradSync":
        return cls(env, phase, want_stop, sync_cfg.mode, sync_cfg.bucket_mb, sync_cfg.compress,
                   sync_cfg.transport, accumulate_steps, sync_cfg.find_unused_parameters)

    def attach(self, optimizer, net=None, rider=None) -> None:
        """Make `optimizer`'s step()/minimize() average first and set up the transport
        (`net` names the parameters in errors). Collective: every rank calls it at the
        same point, after `agree_on_layout` (and `check_optimizer`, before anything starts).
        `rider`: a Rider, whose `size` float32 values travel with the gradients where the
        transport allows (its `take` gets their mean)."""
        if rider is not None:
            self.rider_size, self.rider = rider.size, rider
        self.optimizer, self.params = optimizer, trainable(optimizer)
        self.names = {id(p): name for name, p in net.named_parameters()} if net is not None else {}
        install(optimizer, self)
        self.tables = sparse.Tables(self.env, self.params, net, self.phase, self.name_of)
        if self.env.is_distributed and self.mode != "dataparallel":
            self._setup(self.tables.dense_of(self.params))

    def name_of(self, param) -> str:
        return self.names.get(id(param), param.name)

    def _setup(self, params) -> None:
        cpu = self.env.device == "cpu"
        float32 = all(p.dtype == paddle.float32 for p in params)
        # A CPU job's compress is bf16 or none (transports.check refuses fp16 on gloo);
        # the registry says which transport sends it (transports.carrier).
        if cpu and float32:
            # + the stop flag, one presence number per parameter, the rider's values, room for rows
            count = max(sum(int(p.size) for p in params) + 1 + len(params) + self.rider_size, self.tables.room(self.env.world_size))
            self.reducer = reducers.open_reducer(self.env, self.transport, count, self.phase, self.compress)
        self.mode = self._resolve_mode()
        if self.mode == "fused" and self.reducer is not None and not self.reducer.transport.fused:
            self.reducer = None           # the step's Paddle buffers: bucket_mb, compress
        if self.mode == "overlap":
            scale = 1.0 / self.env.world_size
            exchange = ThreadExchange(self.reducer, scale) if cpu else \
                AsyncExchange(self.env.world_size, wire=HALF.get(self.compress))
            cap = self.bucket_bytes or int(DEFAULT_BUCKET_MB * 2 ** 20)
            self.overlap = Overlap(params, exchange, cap, self._stop_value, self.accumulate_steps,
                                   self.tables.uncertain)

    def _resolve_mode(self) -> str:
        """overlap / fused for mode auto (and fused where overlap cannot run)."""
        if self.env.device == "cpu" and self.reducer is None:
            return "fused"                # no float32 CPU transport: the step's Paddle path
        if self.mode == "auto":
            return self.reducer.transport.auto_mode
        return self.mode

    def arm(self, final: bool) -> None:
        """Before a backward(), with accumulation: whether an optimizer step follows it.
        Only the final micro-batch's backward() sends buckets (mode overlap); unarmed,
        they all go at the step."""
        if self.overlap is not None:
            self.overlap.arm(final)

    def in_backward(self):
        """Around a backward(): in mode dataparallel Paddle's reducer all-reduces inside it,
        unseen, so the backward is marked as this rank's wait in an all-reduce (a hang then
        names the rank that never arrived, not every rank as silent); else nothing."""
        if self.mode == "dataparallel" and self.env.is_distributed and self.phase:
            return self.phase("comm", "all-reduce in backward")
        return contextlib.nullcontext()

    def close(self) -> None:
        """Stop the communication thread, and give the optimizer back its own class."""
        if self.overlap is not None:
            self.overlap.close()
            self.overlap = None
        if self.optimizer is not None:
            uninstall(self.optimizer, self)

    def _stop_value(self) -> float:
        return 1.0 if self.want_stop() else 0.0

    def before_update(self) -> None:
        """What the optimizer's step() and minimize() do first: average the gradients in
        place (unless a loss scaler has had them averaged already, `average_now`)."""
        if not self.averaged_early:
            self.average_now()
        self.averaged_early = False

    def average_now(self, optimizer=None) -> None:
        """Average the gradients now, in place, before the optimizer step (which then
        leaves them alone): for a loss scaler, which must check the averaged gradients."""
        self._check_unchanged()
        with paddle.no_grad():
            self._timed_average()
        self.averaged_early = True

    def _check_unchanged(self) -> None:
        """Parameters frozen later only stop getting gradients (they travel as absent);
        one unfrozen after the start is outside the agreed layout: refused, never left
        unaveraged."""
        if self.optimizer is None or not self.env.is_distributed:
            return
        current = trainable(self.optimizer)
        if len(current) > len(self.params) or any(a is not b for a, b in zip(current, self.params)):
            known = {id(p) for p in self.params}
            new = next((p for p in current if id(p) not in known), current[-1])
            raise ConfigError(f"parameter '{self.name_of(new)}' became trainable after training "
                              "started; paddle_dist averages the parameters that were trainable "
                              "when fit() began: set stop_gradient before calling fit()")

    def _timed_average(self) -> None:
        started = time.perf_counter()
        try:
            self.average()
        finally:
            self.comm_seconds += time.perf_counter() - started

    def average(self) -> None:
        """Average every trainable parameter's gradient over the ranks, in place."""
        self.steps += 1
        self.tables.exchange(self.optimizer, self.overlap, None if self.compress != "none" else self.reducer)
        if not self.env.is_distributed:
            self.stop_requested = bool(self._stop_value())
            if self.rider is not None:          # the mean of one rank: its own values
                self.rider.take(np.asarray(self.rider.give(), dtype=np.float32))
            return
        if self.mode == "dataparallel":
            if self.tables.kept_dense:         # what Paddle's reducer was not given (sparse.py)
                self.stop_requested = self._reduce_buckets(self.tables.kept_dense, self._stop_value()) > 0
            elif self.steps >= self._next_check:
                self._check_stop(self._stop_value())
        elif self.overlap is not None:
            self._finish_overlap()
        elif self.reducer is not None:
            self.stop_requested = self._reduce_cpu(self.tables.dense_of(self.params), self._stop_value()) > 0
            return                # the rider's values rode with the gradients
        else:
            self.stop_requested = self._reduce_buckets(self.tables.dense_of(self.params), self._stop_value()) > 0
        if self.rider is not None:
            self.rider.take(None)

    def _finish_overlap(self) -> None:
        size = self.overlap.nbytes
        guard = self.phase("comm", "all-reduce", size) if self.phase else contextlib.nullcontext()
        with guard:
            self.stop_requested = self.overlap.finish() > 0
        self.calls = self.overlap.exchange.calls

    def _check_stop(self, stop: float) -> None:
        """Exchange the stop flag, with rank 0's choice of the step for the next exchange:
        every rank then checks at the same step (rank 0 alone adds a non-zero interval)."""
        now = time.perf_counter()
        every = 0.0
        if self.env.global_rank == 0:
            step, at = self._checked
            every = float(stop_check_interval((now - at) / max(self.steps - step, 1)))
        flag = paddle.to_tensor([stop, every], dtype="float32")
        stops, every = self._all_reduce(flag, "stop-flag all-reduce", read=flag.numpy).tolist()
        self.stop_requested = stops > 0
        self._next_check, self._checked = self.steps + max(int(every), 1), (self.steps, now)

    def _reduce_buckets(self, params, stop: float) -> float:
        """Flat Paddle buffers through the process group (any device and dtype, optionally
        16-bit on the wire), averaged into the gradients; returns the stop flag's sum."""
        flag = paddle.to_tensor([stop], dtype="float32")
        buckets = self.buckets(params)
        for i, bucket in enumerate(buckets):
            self._reduce(bucket, flag if i == 0 else None)
        if not buckets:
            self._all_reduce(flag, "stop-flag all-reduce")
        return self._read_flag(flag)

    def _read_flag(self, flag) -> float:
        """The stop flag's sum; on GPUs an earlier step's, every LateFlag.EVERY steps, so
        that the host seldom waits for the device here (every rank reads the same step's
        flag at the same step)."""
        if self.env.device == "cpu":
            return float(flag.numpy()[0])
        return self._late_flag.read(flag)

    def buckets(self, params) -> List[list]:
        """Group the parameters by dtype, in order, each group at most bucket_bytes
        (a gradient larger than the cap gets a bucket of its own)."""
        by_dtype: Dict[object, list] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        out = []
        for group in by_dtype.values():
            current, size = [], 0
            for p in group:
                nbytes = int(p.size) * p.element_size()
                if current and self.bucket_bytes and size + nbytes > self.bucket_bytes:
                    out.append(current)
                    current, size = [], 0
                current.append(p)
                size += nbytes
            out.append(current)
        return out

    def _reduce(self, bucket, flag) -> None:
        """All-reduce one flat buffer (presence numbers, gradients, and the stop flag) and
        write the means back into the gradients."""
        dtype = bucket[0].dtype
        grads = [p.grad for p in bucket]
        missing = [i for i, g in enumerate(grads) if g is None]
        present = [0.0 if g is None else 1.0 for g in grads]
        parts: List[paddle.Tensor] = [paddle.to_tensor(present, dtype=dtype)]
        parts += [g.reshape([-1]) if g is not None else paddle.zeros([int(p.size)], dtype)
                  for p, g in zip(bucket, grads)]
        if flag is not None:
            parts.append(flag.astype(dtype))
        wire = HALF.get(self.compress)
        flat, early = sixteen_bit_mean_first(paddle.concat(parts), self.env.world_size, wire)
        if wire is not None and dtype == paddle.float32:
            sent = flat.astype(wire)
            self._all_reduce(sent, "gradient all-reduce")
            flat = sent.astype(dtype)
        else:
            self._all_reduce(flat, "gradient all-reduce")
        if flag is not None:
            flag.set_value(flat[-1:].astype("float32"))
            flat = flat[:-1]
        if not early:
            flat = flat / self.env.world_size
        sizes = [len(bucket)] + [int(p.size) for p in bucket]
        counts, *pieces = paddle.split(flat, sizes)
        if missing:      # (read on the host only when this rank lacks a gradient)
            counts = counts.numpy()
        for i, (p, g, piece) in enumerate(zip(bucket, grads, pieces)):
            if g is not None:
                paddle.assign(piece.reshape(g.shape), g)
            elif counts[i] > 0:
                set_grad(p, piece.reshape(p.shape))

    def describe(self) -> str:
        """For the start-up line, e.g. 'sync overlap (4 buckets) over hierarchical'."""
        if not self.env.is_distributed:
            return "no sync (one process)"
        if self.mode == "dataparallel":
            why = " (sync.mode=auto on GPUs)" if self.requested == "auto" else ""
            unused = ", find_unused_parameters" if self.find_unused else ""
            return f"sync dataparallel{why}: paddle.DataParallel's reducer{unused}"
        buckets = f" ({len(self.overlap.buckets)} buckets)" if self.overlap is not None else ""
        return f"sync {self.mode}{buckets} over {self.used}"

    @property
    def used(self) -> str:
        """How gradients travelled: shm, hierarchical, backend (gloo / NCCL), or none."""
        if not self.env.is_distributed:
            return "none"
        return self.reducer.transport.name if self.reducer is not None else transports.BACKEND.name

    def _reduce_cpu(self, params, stop: float) -> float:
        """The float32 gradients (with the presence numbers and the stop flag) averaged in
        place by the CPU reducer: numpy views of the gradients' own memory
        (compat.numpy_view), no copies but the transport's. Returns the stop flag's sum,
        scaled like the gradients."""
        views = grad_views(params)
        extra = np.asarray(self.rider.give(), dtype=np.float32) if self.rider is not None else np.zeros(0, np.float32)
        head = np.concatenate([np.array([stop] + [0.0 if p.grad is None else 1.0 for p in params],
                                        dtype=np.float32), extra])
        size = sum(v.nbytes for v in views)
        guard = self.phase("comm", "all-reduce", size) if self.phase else contextlib.nullcontext()
        with guard:
            try:
                self.calls += self.reducer.all_reduce([head] + views, scale=1.0 / self.env.world_size)
            except RuntimeError as exc:             # gloo's error, or shm.PeerGone
                raise PeerFailure(f"gradient all-reduce failed: {first_line(exc)}") from exc
        given = len(params) + 1
        give_missing(params, views, head[1:given])
        if self.rider is not None:
            self.rider.take(head[given:].copy())
        return float(head[0])

    def _all_reduce(self, tensor, what: str, read=None):
        self.calls += 1
        return collective(dist.all_reduce, tensor, phase=self.phase, what=what, read=read)
