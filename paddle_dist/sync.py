"""Gradient averaging as one explicit, fused all-reduce per optimizer step.

`paddle.DataParallel` all-reduces gradients from hooks inside `backward()`. When a peer
dies there, gloo's exception is thrown through C++ and the surviving rank is killed by
SIGABRT: it can neither log nor save. Here the gradients are averaged by a plain Python
call just before the optimizer update (Paddle applies `optimizer._grad_clip` to the
gradients at exactly that point, in `step()` and `minimize()` alike, which serves the
`loop` and the `hapi` path without touching either). A peer failure then surfaces as a
`PeerFailure` exception. One fused buffer is also faster than DataParallel's buckets on
CPU (PADDLE_NOTES.md: 1.24x for an MLP).

The same all-reduce carries one extra number, the count of ranks asking to stop
(preemption), so every rank learns of a stop request at the same step at no extra cost.

Example:
    sync = GradSync(env, heartbeat)
    sync.attach(optimizer)          # before the first step
    ...; optimizer.step(); if sync.stop_requested: ...
"""

from __future__ import annotations

import contextlib
from typing import Callable, List, Optional

import paddle
import paddle.distributed as dist
from paddle.nn.clip import ClipGradBase


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, hung, or the connection broke."""


class GradSync(ClipGradBase):
    """Averages gradients over all ranks, then applies the optimizer's own clipping."""

    def __init__(self, env, phase: Optional[Callable[[str], contextlib.AbstractContextManager]] = None,
                 want_stop: Callable[[], bool] = lambda: False):
        super().__init__()
        self.env, self.phase, self.want_stop = env, phase, want_stop
        self.inner = None
        self.stop_requested = False

    def attach(self, optimizer) -> None:
        """Install on `optimizer` (keeping a clip it already has, applied after averaging)."""
        if isinstance(optimizer._grad_clip, GradSync):
            return
        self.inner = optimizer._grad_clip
        optimizer._grad_clip = self

    def _dygraph_clip(self, params_grads):
        params_grads = self.average(params_grads)
        return self.inner(params_grads) if self.inner is not None else params_grads

    def average(self, params_grads):
        present = [(p, g) for p, g in params_grads if g is not None]
        stop = 1.0 if self.want_stop() else 0.0
        if not self.env.is_distributed:
            self.stop_requested = bool(stop)
            return params_grads
        by_dtype = {}
        for p, g in present:
            by_dtype.setdefault(g.dtype, []).append((p, g))
        averaged = {}
        flag = paddle.to_tensor([stop], dtype="float32")
        for dtype, group in by_dtype.items():
            averaged.update(self._reduce(group, flag if dtype == paddle.float32 else None))
        if paddle.float32 not in by_dtype:
            self._all_reduce(flag)
        self.stop_requested = float(flag.numpy()[0]) > 0
        return [(p, averaged.get(id(p), g)) for p, g in params_grads]

    def _reduce(self, group, flag):
        """All-reduce one flat buffer (plus the stop flag); return {id(param): mean grad}."""
        parts: List[paddle.Tensor] = [g.reshape([-1]) for _, g in group]
        if flag is not None:
            parts.append(flag)
        flat = paddle.concat(parts)
        self._all_reduce(flat)
        if flag is not None:
            flag.set_value(flat[-1:])
            flat = flat[:-1]
        flat = flat / self.env.world_size
        sizes = [int(g.size) for _, g in group]
        pieces = paddle.split(flat, sizes) if len(sizes) > 1 else [flat]
        return {id(p): piece.reshape(g.shape) for (p, g), piece in zip(group, pieces)}

    def _all_reduce(self, tensor) -> None:
        collective(dist.all_reduce, tensor, phase=self.phase, what="gradient all-reduce")


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


def disable_reducer(data_parallel) -> None:
    """Stop paddle.DataParallel's in-backward all-reduce; GradSync does the averaging.

    (Were this ever ignored by a future Paddle, results stay correct: averaging gradients
    that are already equal on every rank leaves them unchanged.)
    """
    data_parallel.grad_need_sync = False
