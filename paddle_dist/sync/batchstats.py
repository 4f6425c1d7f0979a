"""BatchNorm's running statistics, one update per optimizer step from every sample of it.

Paddle's BatchNorm moves its running mean and variance at every training forward, from
that forward's batch alone. Under data parallelism each rank's statistics then follow
its own shard, the ranks drift apart, and the numbers depend on how the global batch is
split over ranks and micro-batches. Here, while a BatchNorm layer trains, a forward
pre-hook adds up its input per channel (count, and the sums of the input and of its
square, each less the running mean: in float32, accumulated in float64); after the
optimizer step the ranks sum those in one all-reduce and every rank sets

    running = momentum * running + (1 - momentum) * statistic of the step's whole batch

from the values the statistics had after the previous step (the forwards' own updates in
between are overwritten). The variance is the biased one, as Paddle's. So:
- every rank holds the same statistics after every step (one all-reduce gives all the
  same bits), and a checkpoint, an evaluation or the end needs no averaging;
- they equal one process's on the union of the batches, within float rounding (float32
  sums), whatever the number of ranks and micro-batches: a run continued on another
  number of ranks continues them;
- a resumed run continues them bitwise: there is nothing per rank to lose.

A layer that is frozen (`use_global_stats=True`) or in evaluation mode records nothing
and keeps its statistics. A layer called several times in one step counts all its
inputs once, as one batch.

Example:
    stats = BatchStats(net, env, phase=monitor.phase)
    ... forward / backward / optimizer.step() ...
    stats.step()            # every rank, after every optimizer step
"""

from __future__ import annotations

from typing import List, Optional

import paddle
import paddle.distributed as dist

from ..compat import BatchNormState
from .collectives import collective


class _Layer:
    """One BatchNorm layer: its statistics after the last step, and what this step saw."""

    def __init__(self, state: BatchNormState):
        self.state = state
        with paddle.no_grad():
            self.mean = state.mean.astype("float64")
            self.variance = state.variance.astype("float64")
            self.shift = self.mean.astype("float32")      # a copy, the same on every rank (see record)
        self.count, self.sum, self.squares = 0, None, None

    def record(self, layer, inputs) -> None:
        if not layer.training or self.state.frozen or not inputs:
            return
        x = inputs[0]
        axis = self.state.channel_axis(len(x.shape))
        axes = [a for a in range(len(x.shape)) if a != axis]
        # Sums of x minus the running mean, in float32, accumulated in float64: shifted by a
        # value near the batch's mean, the sum of squares keeps the variance's digits (no
        # E[x^2] - E[x]^2 cancellation), at a quarter of the cost of summing in float64.
        shape = [1] * len(x.shape)
        shape[axis] = -1
        with paddle.no_grad():
            centred = x.detach().astype("float32") - self.shift.reshape(shape)
            total = centred.sum(axis=axes).astype("float64")
            squares = (centred * centred).sum(axis=axes).astype("float64")
        self.count += int(x.size) // int(x.shape[axis])
        self.sum = total if self.sum is None else self.sum + total
        self.squares = squares if self.squares is None else self.squares + squares

    def sums(self) -> paddle.Tensor:
        """[count, sum per channel, sum of squares per channel] (zeros when it saw nothing)."""
        channels = int(self.mean.shape[0])
        if self.sum is None:
            return paddle.zeros([1 + 2 * channels], dtype="float64")
        return paddle.concat([paddle.full([1], float(self.count), dtype="float64"),
                              self.sum.reshape([-1]), self.squares.reshape([-1])])

    @paddle.no_grad()
    def apply(self, sums: paddle.Tensor) -> None:
        """Move the statistics by the step's whole batch (`sums` as from `sums()`, summed
        over the ranks); a layer no rank ran keeps them. No value is read on the host."""
        self.count, self.sum, self.squares = 0, None, None
        channels = int(self.mean.shape[0])
        count = sums[0:1]
        seen = count > 0
        offset = sums[1:1 + channels] / paddle.maximum(count, paddle.ones_like(count))
        squares = sums[1 + channels:] / paddle.maximum(count, paddle.ones_like(count))
        mean, variance = self.mean + offset, paddle.clip(squares - offset * offset, min=0.0)
        m = self.state.momentum
        # Rounded to the buffers' dtype at every step: the buffers alone hold the state, so
        # a run resumed from them continues bitwise.
        self.mean = self._put(self.state.mean, paddle.where(seen, self.mean * m + mean * (1.0 - m), self.mean))
        self.variance = self._put(self.state.variance,
                                  paddle.where(seen, self.variance * m + variance * (1.0 - m), self.variance))
        self.shift = self.mean.astype("float32")

    @staticmethod
    def _put(buffer: paddle.Tensor, value: paddle.Tensor) -> paddle.Tensor:
        rounded = value.astype(buffer.dtype)
        buffer.set_value(rounded)
        return rounded.astype("float64")


class BatchStats:
    """The BatchNorm layers of `net`, updated once per optimizer step from every rank's
    micro-batches (see the module's docstring). Every rank must call `step()` after every
    optimizer step (it is a collective when the job has several ranks)."""

    def __init__(self, net: paddle.nn.Layer, env, phase=None):
        self.env, self.phase = env, phase
        self.layers: List[_Layer] = []
        self.handles = []
        for layer in net.sublayers(include_self=True):
            state = BatchNormState.of(layer)
            if state is not None:
                found = _Layer(state)
                self.layers.append(found)
                self.handles.append(layer.register_forward_pre_hook(found.record))

    def __bool__(self) -> bool:
        return bool(self.layers)

    def step(self) -> None:
        if not self.layers:
            return
        flat = paddle.concat([layer.sums() for layer in self.layers])
        if self.env.is_distributed:
            collective(dist.all_reduce, flat, phase=self.phase, what="all-reduce of BatchNorm statistics")
        offset = 0
        for layer in self.layers:
            size = 1 + 2 * int(layer.mean.shape[0])
            layer.apply(flat[offset:offset + size])
            offset += size

    def reload(self) -> None:
        """Take the layers' statistics as they are now (after a checkpoint was loaded into
        the model)."""
        for layer in self.layers:
            layer.__init__(layer.state)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def batch_norm_layers(net: paddle.nn.Layer) -> List[str]:
    """The names of `net`'s BatchNorm layers that update running statistics when training.

    Example:
        batch_norm_layers(paddle.nn.Sequential(paddle.nn.BatchNorm1D(3)))     # ['0']
    """
    found: List[str] = []
    for name, layer in net.named_sublayers(include_self=True):
        state: Optional[BatchNormState] = BatchNormState.of(layer)
        if state is not None and not state.frozen:
            found.append(name or type(layer).__name__)
    return found
