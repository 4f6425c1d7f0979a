"""The loss's own weighting, exact across micro-batches and ranks, and the step's global loss.

A loss that averages over items of its own (the tokens of a language model, the pixels of
a segmentation, the boxes of a detector) says how many: it returns `{"loss": mean,
"count": n}` (a loss function's result, or a `loss="model"` model's), or, for a model that
returns only its mean over the labels that are not an ignore index (PaddleFormers'),
`train.loss_count=labels` counts those labels (`!= train.ignore_index`) before the forward.
Then every optimizer step's gradient is that of

    Σ sums / Σ counts     over every micro-batch of every rank of the step,

what one process computes on the union of the step's batches, whatever the counts of the
micro-batches (a mean of their means weighs a short sequence's tokens more). Each
micro-batch backward()s its sum, mean × count (scaled by the loss scaler, if any); the
step's counts and sums travel with the gradients' exchange (a `Rider` of GradSync, two
float32 values per rank) where the transport carries riders, else in one all-reduce per
step (float64, on the device: modes overlap and dataparallel, the backend's buckets,
GPUs); after the gradients' average over the W ranks (Σ / W), they are multiplied by
W / Σ counts, before clipping and the optimizer's update.

A plain loss (a per-sample mean, no count) trains as before, bitwise: each micro-batch's
mean over the group's size. Its step's loss, as reported, is the mean over the ranks of
each rank's mean over its micro-batches (each rank sends count 1 and that mean).

Example:
    weighting = Weighting(env, ignore_index=None)   # train.loss_count=none
    sync.attach(optimizer, net, weighting.rider(trainable(optimizer)))
    part = weighting.add(loss, count, len(group))    # per micro-batch: what to backward()
    ... optimizer.step() ...                         # GradSync's average hands over the counts
    weighting.loss, weighting.count                  # the step's global loss and count
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

import numpy as np
import paddle
import paddle.distributed as dist

from ..errors import DataError
from ..runtime.env import DistEnv
from ..sync.collectives import collective
from ..sync.grad_sync import Rider
from ..sync.sparse import scale

NONE, LABELS = "none", "labels"        # train.loss_count


def ignore_index_of(train) -> Optional[int]:
    """The ignore index whose labels are not counted (train.loss_count=labels), or None:
    the loss counts itself, or is a plain mean (train.loss_count=none)."""
    return train.ignore_index if train.loss_count == LABELS else None


def counted_labels(inputs: Sequence, labels: Sequence, ignore_index: int):
    """The number of a batch's label entries that are not `ignore_index` (an int64 tensor,
    never read on the host): of the field named `labels`, among the labels or the inputs
    (a model with its own loss that takes `labels` by name), else of the first label.

    Example:
        counted_labels([ids], [paddle.to_tensor([[5, 7, -100]])], -100)     # Tensor(2)
    """
    for fields in (labels, inputs):
        names = getattr(fields, "names", ())
        if "labels" in names:
            return _kept(fields[names.index("labels")], ignore_index)
    if not len(labels):
        raise DataError("train.loss_count=labels, but the batches have no labels to count; give "
                        "fit() labels= (or dict samples with a 'labels' key), or return "
                        "{'loss': mean, 'count': n} from the loss")
    return _kept(labels[0], ignore_index)


def _kept(label, ignore_index: int):
    return (label != ignore_index).astype("int64").sum()


def perplexity(loss: float) -> float:
    """exp(loss), a token loss's perplexity (inf past float64's range)."""
    return math.exp(loss) if loss < 709.0 else math.inf


class Weighting:
    """One rank's share of each step's loss weighting (module docstring). `add` per
    micro-batch; the rider's `take`, inside GradSync's average, completes the step:
    the counted gradients scaled, `loss` and `count` set (the step's global loss, a float
    or a float64 device tensor; its count, None for a plain loss)."""

    def __init__(self, env: DistEnv, ignore_index: Optional[int] = None, phase=None):
        self.env, self.ignore_index, self.phase = env, ignore_index, phase
        self.params: List[Any] = []
        self.counted: Optional[bool] = None     # whether the losses of this step had counts
        self._sums: List[Any] = []              # per micro-batch: mean x count, or the mean
        self._counts: List[Any] = []
        self.loss: Any = None
        self.count: Any = None
        self.local = False                      # `loss` is this rank's alone (a plain loss, no rider)

    def add(self, loss, count, group: int = 1):
        """Record a micro-batch's mean `loss` and its `count` (None: a plain loss), one of
        `group` micro-batches of this rank's step; returns what to backward(): the sum for
        a counted loss, else the mean over the group's size (as before, bitwise)."""
        counted = count is not None
        if self._sums and counted != self.counted:
            raise DataError("the loss returned a count for some batches and not for others; "
                            "return {'loss': mean, 'count': n} for every batch, or never")
        self.counted = counted
        mean = loss.detach().astype("float64")
        if not counted:
            self._sums.append(mean)
            return loss / group if group > 1 else loss
        count = count if isinstance(count, paddle.Tensor) else paddle.to_tensor(count)
        count = count.detach().astype("float64").reshape([])
        self._sums.append(mean * count)
        self._counts.append(count)
        return loss * count.astype(loss.dtype)

    def rider(self, params: Sequence) -> Rider:
        """The step's (count, sum) as a GradSync rider; `params`: the gradients to scale."""
        self.params = list(params)
        return Rider(2, self._give, self.take)

    def _local(self):
        """[count, sum] of this rank's step (float64, on the device): a plain loss counts
        1 and sends its mean over its micro-batches."""
        total = paddle.add_n(self._sums) if len(self._sums) > 1 else self._sums[0]
        if not self.counted:
            return paddle.stack([paddle.ones([], "float64"), total / len(self._sums)])
        count = paddle.add_n(self._counts) if len(self._counts) > 1 else self._counts[0]
        return paddle.stack([count, total])

    def _give(self) -> np.ndarray:
        """What the exchange carries: read on the host only on the CPU reducers' path (a job
        of one process computes on the device, in `take`)."""
        if not self.env.is_distributed or not self._sums:
            return np.zeros(2, np.float32)
        return self._local().numpy().astype(np.float32)

    def take(self, mean: Optional[np.ndarray]) -> None:
        """After the gradients' average: the ranks' mean (count, sum) the exchange carried,
        or None (then one all-reduce of them here for a loss with a count; none in a job of one
        process, nor for a plain loss, whose step loss is then this rank's: `local`)."""
        if not self._sums:          # no micro-batch recorded (a step of the self-test)
            self.loss = self.count = None
            return
        self.local = False
        if mean is not None and self.env.is_distributed:
            count, total = float(mean[0]), float(mean[1])
            # The ranks' mean count x W is an integer: rounded back from float32.
            self.count = round(count * self.env.world_size) if self.counted else None
            self.loss = total / count
            factor = paddle.to_tensor(1.0 / count, dtype="float32") if self.counted else None
        elif not self.counted:
            # A plain loss needs no count to train: its step's loss stays this rank's here
            # (the mean over its micro-batches), and the progress line takes the ranks' mean
            # at its reports (Progress.over_ranks), not one all-reduce per step (one costs
            # 1.6-2.7 ms on 2 CPU ranks: benchmarks.md).
            self.local = self.env.is_distributed
            many = len(self._sums) > 1
            self.loss = paddle.add_n(self._sums) / len(self._sums) if many else self._sums[0]
            self.count, factor = None, None
        else:
            summed = self._local()
            if self.env.is_distributed:
                collective(dist.all_reduce, summed, phase=self.phase, what="all-reduce of the loss's count")
            self.count = summed[0]
            self.loss = summed[1] / summed[0]
            factor = self.env.world_size / summed[0]
        if factor is not None:
            with paddle.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        scale(p.grad, factor)          # a sparse table's rows too
        self._sums, self._counts = [], []
