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

from typing import TYPE_CHECKING, List, Optional

import numpy as np
import paddle
import paddle.distributed as dist

from ..compat import BatchNormState, numpy_view
from ..errors import UserError
from .collectives import collective
from .grad_sync import Rider

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv


class _Layer:
    """One BatchNorm layer: its statistics after the last step, and what this step saw.
    `host`: float32 statistics on the CPU, kept and updated in numpy (a few microseconds a
    step instead of a dozen Paddle ops); anything else in Paddle, on the device, where no
    value is read on the host."""

    def __init__(self, state: BatchNormState, host: Optional[bool] = None):
        self.state = state
        self.host = state.mean.dtype == paddle.float32 and state.mean.place.is_cpu_place() \
            if host is None else host
        with paddle.no_grad():
            if self.host:
                self.mean = state.mean.numpy().astype(np.float64)
                self.variance = state.variance.numpy().astype(np.float64)
            else:
                self.mean = state.mean.astype("float64")
                self.variance = state.variance.astype("float64")
        self.shift = self.mean.astype(np.float32 if self.host else "float32")   # a copy (see record)
        self.count, self.sum, self.squares = 0, None, None

    @property
    def channels(self) -> int:
        return int(self.mean.shape[0])

    def record(self, layer, inputs) -> None:
        if not layer.training or self.state.frozen or not inputs:
            return
        x = inputs[0]
        axis = self.state.channel_axis(len(x.shape))
        # Sums of x minus the running mean (the same on every rank), in float32, accumulated
        # in float64: shifted by a value near the batch's mean, the sum of squares keeps the
        # variance's digits (no E[x^2] - E[x]^2 cancellation).
        with paddle.no_grad():
            view = _host_view(x) if self.host else None
            total, squares = _host_sums(view, axis, self.shift) if view is not None \
                else _device_sums(x.detach(), axis, self.shift if not self.host else paddle.to_tensor(self.shift))
        if view is None and self.host:
            total, squares = total.numpy(), squares.numpy()
        self.count += int(x.size) // int(x.shape[axis])
        self.sum = total if self.sum is None else self.sum + total
        self.squares = squares if self.squares is None else self.squares + squares

    def sums(self):
        """[count, sum per channel, sum of squares per channel] (zeros when it saw nothing):
        numpy for a host layer, else a Paddle tensor on the device."""
        if self.host:
            if self.sum is None:
                return np.zeros(1 + 2 * self.channels)
            return np.concatenate([[float(self.count)], self.sum, self.squares])
        if self.sum is None:
            return paddle.zeros([1 + 2 * self.channels], dtype="float64")
        return paddle.concat([paddle.full([1], float(self.count), dtype="float64"),
                              self.sum.reshape([-1]), self.squares.reshape([-1])])

    @paddle.no_grad()
    def apply(self, sums) -> None:
        """Move the statistics by the step's whole batch (`sums` as from `sums()`, summed or
        averaged over the ranks: only their ratios count); a layer no rank ran keeps them."""
        self.count, self.sum, self.squares = 0, None, None
        if self.host:
            self._apply_host(np.asarray(sums, dtype=np.float64))
            return
        channels = self.channels
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

    def _apply_host(self, sums: np.ndarray) -> None:
        count, channels, m = sums[0], self.channels, self.state.momentum
        if count <= 0:
            return
        offset, squares = sums[1:1 + channels] / count, sums[1 + channels:] / count
        mean, variance = self.mean + offset, np.maximum(squares - offset * offset, 0.0)
        self.shift = (self.mean * m + mean * (1.0 - m)).astype(np.float32)
        rounded = (self.variance * m + variance * (1.0 - m)).astype(np.float32)
        self.state.mean.set_value(self.shift)
        self.state.variance.set_value(rounded)
        self.mean, self.variance = self.shift.astype(np.float64), rounded.astype(np.float64)

    @staticmethod
    def _put(buffer: paddle.Tensor, value: paddle.Tensor) -> paddle.Tensor:
        rounded = value.astype(buffer.dtype)
        buffer.set_value(rounded)
        return rounded.astype("float64")


def _on_host(values) -> np.ndarray:
    return values.numpy() if isinstance(values, paddle.Tensor) else np.asarray(values)


def _on_device(values) -> paddle.Tensor:
    return values if isinstance(values, paddle.Tensor) else paddle.to_tensor(np.asarray(values, np.float64))


def _host_view(x) -> Optional[np.ndarray]:
    """A float32 CPU tensor's memory as numpy, without a copy (None for any other)."""
    if x.dtype != paddle.float32 or not x.place.is_cpu_place():
        return None
    try:
        return numpy_view(x.detach()).reshape(x.shape) if x.is_contiguous() else None
    except (TypeError, BufferError, AttributeError, RuntimeError):
        return None


def _host_sums(x: np.ndarray, axis: int, shift: np.ndarray):
    """Per channel: the sums of x - shift and of its square (CPU). numpy's pairwise
    summation along the contiguous axis keeps float32's error near 1e-8; Paddle's CPU
    broadcast subtraction alone would cost more than the BatchNorm forward."""
    channels = x.shape[axis]
    if axis == len(x.shape) - 1:         # channels last: a strided reduction, in float64
        rows = x.reshape(-1, channels) - shift
        return rows.sum(axis=0, dtype=np.float64), np.square(rows).sum(axis=0, dtype=np.float64)
    grid = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), channels, -1) - shift[None, :, None]
    return (grid.sum(axis=2).sum(axis=0, dtype=np.float64),
            np.square(grid).sum(axis=2).sum(axis=0, dtype=np.float64))


def _device_sums(x: paddle.Tensor, axis: int, shift: paddle.Tensor):
    """The same with Paddle's ops, on the tensor's device (a GPU's broadcast is cheap)."""
    shape = [1] * len(x.shape)
    shape[axis] = -1
    axes = [a for a in range(len(x.shape)) if a != axis]
    centred = x.astype("float32") - shift.reshape(shape)
    return (centred.sum(axis=axes).astype("float64"),
            (centred * centred).sum(axis=axes).astype("float64"))


class BatchStats:
    """The BatchNorm layers of `net`, updated once per optimizer step from every rank's
    micro-batches (see the module's docstring). Every rank must call `step()` after every
    optimizer step (it is a collective when the job has several ranks). `host` False: the
    sums and statistics in Paddle's ops even for float32 CPU buffers, as for a GPU's (the
    tests run the GPU path so on a CPU); None: numpy for those."""

    def __init__(self, net: paddle.nn.Layer, env: DistEnv, phase=None, host: Optional[bool] = None):
        self.env, self.phase = env, phase
        self.received: Optional[np.ndarray] = None   # the sums' mean the gradients' exchange carried
        self.layers: List[_Layer] = []
        self.handles = []
        for layer in net.sublayers(include_self=True):
            state = BatchNormState.of(layer)
            if state is not None:
                found = _Layer(state, host)
                self.layers.append(found)
                self.handles.append(layer.register_forward_pre_hook(found.record))

    def __bool__(self) -> bool:
        return bool(self.layers)

    def rider(self) -> Optional[Rider]:
        """The sums as a GradSync's rider (`attach`): its exchange carries them, where its
        transport can, and hands their mean to this step's update (None without
        BatchNorm layers).

        Example:
            grad_sync.attach(optimizer, net, stats.rider())
        """
        if not self.layers:
            return None
        return Rider(self.size, self._local_sums, self._take)

    def _take(self, mean: np.ndarray) -> None:
        """The exchange's mean of every rank's sums, for this step's update."""
        self.received = mean

    @property
    def size(self) -> int:
        return sum(1 + 2 * layer.channels for layer in self.layers)

    def _local_sums(self) -> np.ndarray:
        return np.concatenate([_on_host(layer.sums()) for layer in self.layers]).astype(np.float32)

    def step(self) -> None:
        if not self.layers:
            return
        for layer, sums in zip(self.layers, self._combined()):
            layer.apply(_on_host(sums) if layer.host else _on_device(sums))

    def _combined(self) -> list:
        """Each layer's sums over every rank: the mean the gradients' exchange carried
        (float32), one all-reduce of their own, or this rank's alone in a job of one (the
        statistics need only the sums' ratios)."""
        received, self.received = self.received, None
        if received is not None and len(received) == self.size:
            flat = received.astype(np.float64)
        elif self.env.is_distributed:
            flat = paddle.concat([_on_device(layer.sums()) for layer in self.layers])
            collective(dist.all_reduce, flat, phase=self.phase, what="all-reduce of BatchNorm statistics")
        else:
            return [layer.sums() for layer in self.layers]
        ends = np.cumsum([1 + 2 * layer.channels for layer in self.layers])
        return [flat[end - 1 - 2 * layer.channels:end] for layer, end in zip(self.layers, ends)]

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


def sync_batch_norm_on_cpu(net: paddle.nn.Layer, device: str, world_size: int) -> List[str]:
    """Paddle has no CPU kernel for SyncBatchNorm, whose forward normalises with the
    statistics of every rank's batch. On one rank that is its own batch, a BatchNorm's
    math: each SyncBatchNorm is replaced by a paddle.nn.BatchNorm holding the same
    parameters and statistics (the optimizer's and the state_dict's own tensors); the
    names of the layers replaced are returned. On several ranks a BatchNorm, whose
    statistics this module keeps those of the whole batch but which normalises with its
    own rank's, is other training math: one line (exit 2), before anything runs."""
    found = [(name, layer) for name, layer in net.named_sublayers(include_self=False)
             if isinstance(layer, paddle.nn.SyncBatchNorm)]
    if device != "cpu" or not found:
        return []
    names = [name for name, _ in found]
    if world_size > 1:
        raise UserError(f"the model has SyncBatchNorm layers ({', '.join(map(repr, names[:3]))}"
                        f"{' and more' * (len(names) > 3)}), and Paddle has no CPU kernel for them; on CPUs "
                        "build it with BatchNorm2D (paddle_dist keeps its running statistics those of the "
                        "whole batch on every rank: docs/own_model.md), or train on GPUs")
    for name, layer in found:
        norm = paddle.nn.BatchNorm(layer._num_features, momentum=layer._momentum, epsilon=layer._epsilon,
                                   data_layout=layer._data_format)
        for key in ("weight", "bias", "_mean", "_variance"):
            setattr(norm, key, getattr(layer, key))
        parent = net
        *path, leaf = name.split(".")
        for part in path:
            parent = getattr(parent, part)
        setattr(parent, leaf, norm)
    return names
