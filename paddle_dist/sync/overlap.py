"""Gradient all-reduce overlapped with backward(): buckets launched from backward hooks.

backward() produces the gradients of the last layers first. Each trainable parameter gets
a hook (Paddle's `_register_backward_hook`, called once its gradient is fully accumulated
for this backward()); when every parameter of a bucket is ready, the bucket goes to the
exchange — in bucket order, so every rank issues the same collectives in the same order —
while backward() goes on computing the earlier layers' gradients. The optimizer step
(GradSync) launches whatever is left and waits for the rest.

- CPU: one communication thread runs the exchanges (reducers.py: shared memory, gloo,
  or both). Paddle's backward() and gloo's all-reduce release the GIL, so the thread
  communicates while the main thread computes (measured in docs/sync.md).
- GPUs: NCCL is asynchronous already: a bucket's all-reduce is issued from the hook with
  sync_op=False on NCCL's stream, and the step waits for its task. No thread.

Each bucket carries one presence number per parameter before its gradients (a missing
gradient travels as zeros): after the exchange, a parameter this rank has no gradient
for gets the mean when some rank had one (`give_missing`), as grad_sync.py describes.

With gradient accumulation only the group's last backward() is armed (`arm`): the
micro-batches before it launch nothing, so a group still communicates once. A failed
exchange never raises inside backward() (an exception there would cross C++): the
thread keeps it, launches nothing more, and the step raises it: `PeerFailure` when a
peer failed, `CommThreadError` naming anything else (a bug, MemoryError, ...).

Example:
    ov = Overlap(params, ThreadExchange(reducer, 1 / world), cap_bytes=25 << 20)
    loss.backward()          # buckets leave as they fill
    stops = ov.finish()      # the rest, then wait; gradients are averaged in place
"""

from __future__ import annotations

import functools
import threading
from collections import deque
from typing import Callable, Deque, List, Optional, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from .. import compat
from ..errors import CommThreadError, PeerFailure
from .collectives import first_line
from .sparse import is_rows

MIN_BUCKETS = 4           # a small model is still cut in about this many buckets
THREAD_CHECK_S = 0.5      # how often a waiting step checks that the sync thread still runs


def plan_buckets(params, cap_bytes: int) -> List[list]:
    """Trainable parameters in the order backward() produces their gradients (the reverse
    of definition order), cut into buckets of at most `cap_bytes` (a larger parameter
    gets its own), capped further at a MIN_BUCKETS-th of the total so that even a small
    model's first bucket leaves early in backward().

    Example:
        # LeNet (246 KB): a quarter is 61 KB, so the classifier's small tensors share the
        # first bucket, its 192 KB weight goes alone, and the convolutions come last.
        plan_buckets(lenet.parameters(), cap_bytes=25 << 20)   # 3 buckets
    """
    order = [p for p in reversed(list(params)) if not p.stop_gradient]
    sizes = [int(p.size) * p.element_size() for p in order]
    cap = max(1, min(cap_bytes, sum(sizes) // MIN_BUCKETS))
    buckets, current, used = [], [], 0
    for p, nbytes in zip(order, sizes):
        if current and (used + nbytes > cap or p.dtype != current[0].dtype):
            buckets.append(current)
            current, used = [], 0
        current.append(p)
        used += nbytes
    if current:
        buckets.append(current)
    return buckets


class Overlap:
    """Bucket bookkeeping: which parameters are ready, which buckets have left."""

    def __init__(self, params, exchange, cap_bytes: int, stop: Callable[[], float] = lambda: 0.0,
                 accumulate_steps: int = 1, held=()):
        self.buckets = plan_buckets(params, cap_bytes)
        # Parameters that may come as rows (sparse.py): their buckets wait for the step
        # until the first exchange settles which ones do (`drop`).
        self.held = set(held)
        self.nbytes = sum(int(p.size) * p.element_size() for bucket in self.buckets for p in bucket)
        self.exchange = exchange
        self.index = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready: List[set] = [set() for _ in self.buckets]
        self.launched = 0
        # With accumulation a backward() sends nothing unless armed as the group's last
        # (a caller that never arms still gets every bucket sent at the step: correct, late).
        self.default_armed = accumulate_steps == 1
        self.armed, self.closed = self.default_armed, False
        self.stop = stop           # this rank's stop request, sent with the first bucket
        for bucket in self.buckets:
            for p in bucket:
                p._register_backward_hook(functools.partial(self._on_ready, p))
        # each bucket: a presence number per parameter, the gradients, the stop flag (first)
        exchange.reserve([len(b) + sum(int(p.size) for p in b) + (i == 0)
                          for i, b in enumerate(self.buckets)])

    def arm(self, final: bool) -> None:
        """Before a backward(): `final` when an optimizer step follows it (the last
        micro-batch of a group)."""
        self.armed = final

    def _on_ready(self, param) -> None:
        i = self.index.get(id(param))
        if not self.armed or self.closed or i is None or id(param) in self.held or is_rows(param.grad):
            return                    # a table's rows never go into a bucket (sparse.py)
        self.ready[i].add(id(param))
        while self.launched < len(self.buckets) and \
                len(self.ready[self.launched]) == len(self.buckets[self.launched]):
            self._launch()

    def _launch(self) -> None:
        i = self.launched
        self.exchange.submit(self.buckets[i], self.stop() if i == 0 else None)
        self.launched += 1

    def drop(self, params) -> None:
        """Take `params` (found to come as rows, sparse.py) out of the buckets not sent yet,
        which hold every held parameter, and hold nothing more. Every rank drops the same."""
        ids, self.held = {id(p) for p in params}, set()
        if not ids:
            return
        rest = [[p for p in bucket if id(p) not in ids] for bucket in self.buckets[self.launched:]]
        ready = [r - ids for r, bucket in zip(self.ready[self.launched:], rest) if bucket]
        self.buckets = self.buckets[:self.launched] + [bucket for bucket in rest if bucket]
        self.ready = self.ready[:self.launched] + ready
        self.index = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.nbytes = sum(int(p.size) * p.element_size() for bucket in self.buckets for p in bucket)
        self.exchange.reserve([len(b) + sum(int(p.size) for p in b) + (i == 0)
                               for i, b in enumerate(self.buckets) if i >= self.launched])

    def drain(self) -> None:
        """Wait for the buckets sent so far, before the main thread's own collectives over
        the same process group (sparse.py): the thread's and its must not interleave."""
        getattr(self.exchange, "idle", lambda: None)()

    def finish(self) -> float:
        """Launch the buckets backward() has not (all of them when no armed backward ran),
        wait for every exchange, and return the stop flag's sum over the ranks (scaled as
        the gradients are; > 0 when some rank asked to stop)."""
        while self.launched < len(self.buckets):
            self._launch()
        try:
            return self.exchange.wait()
        finally:
            self.ready = [set() for _ in self.buckets]
            self.launched, self.armed = 0, self.default_armed

    def close(self) -> None:
        self.closed = True
        self.exchange.close()


def grad_views(params) -> List[np.ndarray]:
    """numpy views of the parameters' float32 gradients (their own memory,
    compat.numpy_view); a missing gradient travels as zeros, so every rank sends the
    same layout (`give_missing` then hands it its mean)."""
    return [compat.numpy_view(p.grad.detach()) if p.grad is not None
            else np.zeros(int(p.size), dtype=np.float32) for p in params]


def presence(params) -> np.ndarray:
    """1.0 for each parameter with a gradient on this rank, 0.0 for one without: summed
    over the ranks, it says which parameters some rank has a gradient for."""
    return np.array([0.0 if p.grad is None else 1.0 for p in params], dtype=np.float32)


def give_missing(params, means, counts) -> None:
    """After an exchange: a parameter without a gradient here that some rank had one for
    (counts[i] > 0) gets the mean (`means[i]`, its zeros averaged) as its gradient, as
    paddle.DataParallel(find_unused_parameters=True) gives it; one that no rank had
    stays without, so no optimizer touches it."""
    for p, mean, count in zip(params, means, counts):
        if p.grad is None and count > 0:
            set_grad(p, mean if isinstance(mean, paddle.Tensor) else paddle.to_tensor(mean))


def set_grad(param, value) -> None:
    """Give `param` the gradient `value` (it had none)."""
    param.grad = value.reshape(param.shape).astype(param.dtype)


class ThreadExchange:
    """CPU: each bucket's gradients averaged in place by `reducer` on one thread, in the
    order submitted. The first failure is kept; later buckets are skipped (their
    collectives could not line up any more) and `wait` raises it."""

    def __init__(self, reducer, scale: float):
        self.reducer, self.scale = reducer, scale
        self.jobs: Deque = deque()
        self.cond = threading.Condition()
        self.outstanding, self.calls = 0, 0
        self.error: Optional[BaseException] = None
        self.flag = np.zeros(1, dtype=np.float32)
        self.lacking: list = []   # (params, gradient arrays, presence) of buckets missing some
        self.thread = threading.Thread(target=self._serve, name="paddle_dist-grad-sync", daemon=True)
        self.thread.start()

    def reserve(self, sizes: List[int]) -> None:
        if hasattr(self.reducer, "reserve"):
            for size in sizes:
                self.reducer.reserve(size)

    def submit(self, params, stop: Optional[float]) -> None:
        grads = grad_views(params)           # in the caller's thread: Paddle calls stay there
        present = presence(params)
        if not present.all():
            self.lacking.append((params, grads, present))
        arrays = [present] + grads
        if stop is not None:
            self.flag[0] = stop
            arrays.append(self.flag)
        with self.cond:
            self.jobs.append(arrays)
            self.outstanding += 1
            self.cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not self.jobs:
                    self.cond.wait()
                arrays = self.jobs.popleft()
            if arrays is None:
                return
            try:
                if self.error is None:
                    self.calls += self.reducer.all_reduce(arrays, self.scale)
            except BaseException as exc:   # noqa: BLE001 - whatever it is, the step must hear of it
                self.error = exc
            finally:
                with self.cond:
                    self.outstanding -= 1
                    self.cond.notify_all()

    def wait(self) -> float:
        """Wait for the submitted buckets; raise what the thread met: PeerFailure for a
        peer's failure (gloo's RuntimeError, shm.PeerGone), CommThreadError for anything
        else. A thread that is gone with work outstanding is an error, never a wait."""
        with self.cond:
            while self.outstanding and self.thread.is_alive():
                self.cond.wait(THREAD_CHECK_S)
            lost = self.outstanding and self.error is None
        if lost:
            raise CommThreadError("the gradient-sync thread ended with exchanges outstanding")
        if isinstance(self.error, RuntimeError):
            raise PeerFailure(f"gradient all-reduce failed: {first_line(self.error)}") from self.error
        if self.error is not None:
            raise CommThreadError(f"the gradient-sync thread failed: {type(self.error).__name__}: "
                                  f"{first_line(self.error)}") from self.error
        lacking, self.lacking = self.lacking, []
        for params, grads, present in lacking:
            give_missing(params, grads, present)
        return float(self.flag[0])

    def idle(self) -> None:
        """Wait for the submitted buckets (Overlap.drain); a failure is `wait`'s to raise."""
        with self.cond:
            while self.outstanding and self.thread.is_alive():
                self.cond.wait(THREAD_CHECK_S)

    def close(self) -> None:
        """Let the thread end. An idle one ends at once; one still inside a collective (the
        rank is stopping for another reason) is a daemon and is not waited for long."""
        with self.cond:
            self.jobs.append(None)
            self.cond.notify_all()
        self.thread.join(timeout=0.5)


def sixteen_bit_mean_first(flat: paddle.Tensor, world: int, wire=None) -> Tuple[paddle.Tensor, bool]:
    """A buffer about to be summed over `world` ranks in 16 bits (16-bit gradients, or
    float32 sent as `wire`, sync.compress), divided by `world` first, as Paddle's reducer
    does: loss-scaled float16 gradients sum past 65504 to inf where their mean would not.
    Returns (the buffer, whether it was divided); float32 sums are divided after, exactly.
    The stop flag and the presence numbers in it are only compared with 0."""
    half = (paddle.float16, paddle.bfloat16)
    if flat.dtype in half or (wire is not None and wire in half and flat.dtype == paddle.float32):
        return flat / world, True
    return flat, False


class LateFlag:
    """GPUs: the stop flag's sum, read on the host one step late and only every EVERY
    steps. A read waits for all the work queued on the device before it (this step's
    backward included), so reading at every step would keep the host from running ahead.
    A stop request stays until the job stops, so every rank sees it at the same step,
    at most EVERY + 1 steps after it was made; 0.0 at the other steps."""

    EVERY = 16

    def __init__(self):
        self.previous: Optional[paddle.Tensor] = None
        self.steps = 0

    def read(self, flag: Optional[paddle.Tensor]) -> float:
        self.steps += 1
        previous, self.previous = self.previous, flag
        if previous is None or self.steps % self.EVERY:
            return 0.0
        return float(previous.numpy()[0])


class AsyncExchange:
    """GPUs: each bucket packed into one flat tensor and all-reduced with sync_op=False
    (NCCL runs it on its own stream while backward() goes on); `wait` waits for the
    tasks and writes the means back into the gradients.

    The stop flag is read late and seldom (LateFlag): reading it at once would make the
    host wait for the device."""

    def __init__(self, world: int, collective_fn: Callable = dist.all_reduce, wire=None):
        self.world, self.all_reduce, self.wire = world, collective_fn, wire   # wire: 16-bit dtype
        self.pending: list = []
        self.flag = LateFlag()
        self.calls = 0

    def reserve(self, sizes: List[int]) -> None:
        pass

    def submit(self, params, stop: Optional[float]) -> None:
        dtype = params[0].dtype
        grads = [p.grad if p.grad is not None else paddle.zeros(p.shape, dtype) for p in params]
        parts = [paddle.to_tensor(presence(params), dtype=dtype)] + [g.reshape([-1]) for g in grads]
        if stop is not None:
            parts.append(paddle.full([1], stop, dtype=dtype))
        flat, early = sixteen_bit_mean_first(paddle.concat(parts), self.world, self.wire)
        if self.wire is not None and flat.dtype == paddle.float32:
            flat = flat.astype(self.wire)                  # sync.compress: half the bytes
        self.pending.append((self.all_reduce(flat, sync_op=False), flat, params, stop is not None, early))
        self.calls += 1

    def wait(self) -> float:
        """Wait for this step's buckets; returns an earlier step's stop-flag sum (LateFlag)."""
        flag = None
        for task, flat, params, flagged, early in self.pending:
            task.wait()
            if flat.dtype != params[0].dtype:          # sent in 16 bits (sync.compress)
                flat = flat.astype(params[0].dtype)
            if flagged:
                flag, flat = flat[-1:], flat[:-1]
            _write_back(flat if early else flat / self.world, params)
        self.pending = []
        return self.flag.read(flag)

    def close(self) -> None:
        self.pending = []


def _write_back(flat: paddle.Tensor, params) -> None:
    """The means (after one presence number per parameter) into the gradients; the
    presence sums are read on the host only where this rank lacks a gradient."""
    sizes = [len(params)] + [int(p.size) for p in params]
    counts, *pieces = paddle.split(flat, sizes)
    lacking = [i for i, p in enumerate(params) if p.grad is None]
    for p, piece in zip(params, pieces):
        if p.grad is not None:
            paddle.assign(piece.reshape(p.grad.shape), p.grad)
    if lacking:
        give_missing([params[i] for i in lacking], [pieces[i] for i in lacking],
                     counts.numpy()[lacking])
