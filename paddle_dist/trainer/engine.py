"""One object makes the distributed step: the wrap, the gradients' average, BatchNorm's
statistics, the loss scaler and autocast, for both API levels and the doctor's self-test.

A step of the loop (`Engine.step`) reads top to bottom: for each of this rank's
micro-batches, seed the generators (randomness.py), forward and loss under autocast,
backward of the loss over the group's size, or of its sum for a loss with a count
(weighting.py; scaled, with a loss scaler); then the average of the gradients over the
ranks (`GradSync.average_now`, whose exchange also carries BatchNorm's sums and the loss's
count, by which the counted gradients are then divided), the optimizer's update, and
BatchNorm's statistics from every rank's samples (`after_update`). What the step produced
comes back as a `StepResult`: the step's loss over every rank.

hapi's paddle.Model drives its own step: hapi.prepared_model(engine, ...) gives it the
network with the same parts (its optimizer averages first, through the class GradSync.attach gives it, the
only road into a step paddle.Model runs), and the Session calls `after_update` after every
optimizer step at both levels.

Example:
    engine = Engine(net, optimizer, env, GradSync.from_config(env, cfg.sync), precision)
    result = engine.step(engine.wrapped(), group, feed, loss_fn)    # StepResult(loss, parts, count)
    engine.after_update()
    engine.close()
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import paddle

from . import amp
from .amp import AmpPlan, autocast
from .feed import Feed
from ..runtime.env import DistEnv
from ..sync import GradSync, wrap
from ..sync.batchstats import BatchStats
from ..sync.checks import trainable
from ..sync.grad_sync import Rider
from .weighting import Weighting


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step produced: its loss over every rank and micro-batch (a number,
    or a detached float64 device tensor, read on the host only when needed: on a GPU every
    read waits for the queued work; weighting.py), the means of the loss's parts by name
    (this rank's), and the step's count over every rank (None for a plain loss). `local`:
    the loss is this rank's alone (a plain loss whose exchange carried no rider)."""

    loss: Any
    parts: Dict[str, Any] = field(default_factory=dict)
    count: Any = None
    local: bool = False


def no_seed(index: int, share: int) -> None:
    """The default of `step`'s `seed`: the generators are left as they are."""


def step(model, loss_fn, group, optimizer, precision: AmpPlan = AmpPlan(), scaler=None,
         arm: Callable[[bool], None] = lambda final: None, feed: Optional[Feed] = None,
         in_backward: Callable = contextlib.nullcontext, seed: Callable[[int, int], None] = no_seed,
         average: Callable[[], None] = lambda: None, weighting: Optional[Weighting] = None) -> StepResult:
    """One optimizer step over the micro-batches in `group` ((inputs, labels) lists, split
    by `feed`; default: one input, the rest labels).

    Each micro-batch's mean loss is divided by the group's size, so the summed gradient
    is that of the mean loss over all the group's samples (equal micro-batch sizes); a
    loss with a count backward()s its sum, and `weighting` (weighting.py, whose rider the
    average hands the ranks' counts) divides the gradients by the step's count.
    `precision` and `scaler`: mixed precision and its loss scaling (amp.py, whose scaler
    averages the gradients itself before it checks them); `arm(final)` tells the gradient
    sync whether an optimizer step follows the coming backward(); `seed(index, share)`
    seeds the generators before micro-batch `index` of the `share` (randomness.py);
    `average()` averages the gradients over the ranks before the optimizer's update.
    Without a `weighting` (no Engine), this process's counts alone weigh the gradients."""
    feed = feed or Feed(model, inputs=1)
    own = weighting is None
    weighting = weighting or Weighting(DistEnv())
    named = {}
    for i, (inputs, labels) in enumerate(group):
        if len(group) > 1:
            arm(i == len(group) - 1)
        seed(i, len(group))
        with autocast(precision):
            outputs = feed.outputs(model, inputs, labels)
            loss, parts, count = feed.counted_loss(loss_fn, outputs, labels, weighting.ignore_index, inputs)
        part = weighting.add(loss, count, len(group))
        with in_backward():       # mode dataparallel: Paddle's all-reduces run inside it
            (scaler.scale(part) if scaler is not None else part).backward()
        for name, value in parts.items():
            named[name] = value if name not in named else named[name] + value
    if own:            # no exchange hands the counts over: this process's alone
        weighting.params = trainable(optimizer)
        weighting.take(None)
    if scaler is not None:
        scaler.step(optimizer)      # averages, then skips the step on inf/nan
        scaler.update()
    else:
        average()
        optimizer.step()
    optimizer.clear_grad()
    return StepResult(weighting.loss, {name: value / len(group) for name, value in named.items()}, weighting.count,
                      weighting.local)


class Engine:
    """The distributed step of one rank (module docstring). Collective when built: every
    rank builds it at the same point."""

    def __init__(self, net: paddle.nn.Layer, optimizer, env: DistEnv, sync: GradSync,
                 precision: AmpPlan = AmpPlan(), scaler_state: Optional[Dict[str, Any]] = None,
                 ignore_index: Optional[int] = None):
        self.net, self.optimizer, self.env, self.sync, self.precision = net, optimizer, env, sync, precision
        # BatchNorm's per-channel sums and the loss's count travel with the gradients where
        # the transport can; `ignore_index`: train.loss_count=labels (weighting.py).
        self.batch_stats = BatchStats(net, env, sync.phase)
        self.weighting = Weighting(env, ignore_index, sync.phase)
        sync.attach(optimizer, net, joined([self.batch_stats.rider(), self.weighting.rider(trainable(optimizer))]))
        self.scaler = amp.scaler(precision, sync)
        if self.scaler is not None and scaler_state:     # a resumed run: the scale it had reached
            amp.load_scaler_state(self.scaler, scaler_state)

    def wrapped(self):
        """The network as the loop trains it: paddle.DataParallel with its reducer on only
        for sync.mode=dataparallel (sync.wrap)."""
        return wrap(self.net, self.env, self.sync)

    def step(self, model, group, feed: Feed, loss_fn, seed: Callable[[int, int], None] = no_seed) -> StepResult:
        """One optimizer step of the loop over this rank's micro-batches `group`."""
        return step(model, loss_fn, group, self.optimizer, self.precision, self.scaler, self.sync.arm,
                    feed, self.sync.in_backward, seed, self.sync.average_now, self.weighting)

    def after_update(self) -> None:
        """After an optimizer step, at both levels: BatchNorm's running statistics move once,
        from every rank's samples of the step (sync/batchstats.py)."""
        self.batch_stats.step()

    def close(self) -> None:
        self.batch_stats.close()
        self.sync.close()


def joined(riders: Sequence[Optional[Rider]]) -> Optional[Rider]:
    """One Rider carrying the values of `riders` (None ones left out) one after another.

    Example:
        joined([stats.rider(), weighting.rider(params)])     # Rider(size=stats' + 2, ...)
    """
    riders = [r for r in riders if r is not None]
    if len(riders) <= 1:
        return riders[0] if riders else None
    ends = np.cumsum([r.size for r in riders])

    def take(mean):
        for rider, end in zip(riders, ends):
            rider.take(None if mean is None else mean[end - rider.size:end])

    return Rider(int(ends[-1]), lambda: np.concatenate([np.asarray(r.give(), np.float32) for r in riders]), take)
