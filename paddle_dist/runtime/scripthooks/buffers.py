"""A plain script's `paddle.DataParallel` under `python -m paddle_dist.launch`: its BatchNorm
statistics kept equal on every rank (--sync-buffers, said once by rank 0), or a warning
that they are not.

Paddle's DataParallel never syncs buffers, so each rank's BatchNorm running statistics
follow its own shard: each rank evaluates with its own, rank 0 saves its own, and a
metric summed over the ranks is that of no saved model. With --sync-buffers, a forward
post-hook on the DataParallel calls `BatchStats.step()` (sync/batchstats.py) after every
training forward: one all-reduce of the BatchNorm layers' per-channel count, sum and sum
of squares, after which every rank holds the statistics one process would have on the
union of the ranks' batches (torch DDP instead copies rank 0's, which saw one shard).

pythonpath/sitecustomize.py imports this module when a script makes a DataParallel
(paddle is imported by then) and calls `attach()`. A DataParallel that paddle_dist itself
makes (`fit()`) is left alone: its trainer updates the statistics once per optimizer step.

Example:
    net = paddle.DataParallel(model)      # in a rank: attach(net) has run
"""

from __future__ import annotations

import sys
import types
from typing import Optional

import paddle
import paddle.distributed as dist

from .. import protocol
from ...sync.batchstats import BatchStats, batch_norm_layers
from ..env import DistEnv

OWN = __name__.rpartition(".")[0]      # paddle_dist.runtime.scripthooks: these modules' frames
WARNING = ("paddle_dist: each rank keeps its own BatchNorm statistics ({layers}; paddle.DataParallel "
           "does not sync buffers), so what each rank evaluates and what rank 0 saves differ; add "
           "--sync-buffers to python -m paddle_dist.launch to keep them equal on every rank")
# Said once when the option is on: the all-reduce after each forward costs step rate.
SYNCING = ("paddle_dist: --sync-buffers: the statistics of {layers} are all-reduced after each training "
           "forward, so every rank evaluates and saves the same (the cost grows with the number of "
           "BatchNorm layers: docs/benchmarks.md)")
_warned = False
_said = False


def attach(data_parallel) -> Optional[BatchStats]:
    """Give a new DataParallel its BatchNorm behaviour; the BatchStats syncing it, if any.
    Nothing for one rank, a model without BatchNorm, or a DataParallel made by paddle_dist."""
    world = dist.get_world_size()
    net = wrapped(data_parallel)
    if world < 2 or made_by_paddle_dist() or not batch_norm_layers(net):
        return None
    if not protocol.sync_buffers():
        warn_once(net)
        return None
    group = getattr(data_parallel, "group", None)
    if getattr(group, "nranks", world) != world:    # BatchStats all-reduces over every rank
        _say(f"paddle_dist: --sync-buffers leaves a DataParallel over {group.nranks} of {world} "
             "ranks alone (it syncs DataParallels over all ranks)")
        return None
    say_once(net)
    return sync(data_parallel, types.SimpleNamespace(is_distributed=True))


def sync(data_parallel, env: DistEnv) -> BatchStats:
    """Step `data_parallel`'s BatchNorm statistics after each of its training forwards.

    Example:
        sync(paddle.DataParallel(net), types.SimpleNamespace(is_distributed=True))
    """
    net = wrapped(data_parallel)
    stats = BatchStats(net, env)

    def after_forward(layer, inputs, outputs):
        # A script may switch the wrapped network to eval and call it through the wrapper:
        # such a forward moves no statistics (and the ranks may run unequal numbers of them).
        if layer.training and net.training:
            stats.step()

    stats.handles.append(data_parallel.register_forward_post_hook(after_forward))
    data_parallel._paddle_dist_batch_stats = stats
    return stats


def wrapped(data_parallel):
    """The network a DataParallel wraps: its one sublayer."""
    return next(iter(data_parallel.children()))


def warn_once(net) -> None:
    """One line on global rank 0's stderr, once per process, when `net` has BatchNorm layers
    whose statistics each rank updates from its own batches (SyncBatchNorm's are global)."""
    global _warned
    layers = {name or type(layer).__name__: layer for name, layer in net.named_sublayers(include_self=True)}
    own = [name for name in batch_norm_layers(net)
           if not isinstance(layers.get(name), paddle.nn.SyncBatchNorm)]
    if _warned or not own or dist.get_rank() != 0:
        return
    _warned = True
    _say(WARNING.format(layers=f"{len(own)} BatchNorm layer{'s' * (len(own) != 1)}"))


def say_once(net) -> None:
    """One line on global rank 0's stderr, once per process, that `net`'s statistics are synced."""
    global _said
    if _said or dist.get_rank() != 0:
        return
    _said = True
    count = len(batch_norm_layers(net))
    _say(SYNCING.format(layers=f"{count} BatchNorm layer{'s' * (count != 1)}"))


def made_by_paddle_dist() -> bool:
    """Whether paddle_dist's own code (fit()'s trainer) is making this DataParallel."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("paddle_dist.") and not name.startswith(OWN):
            return True
        frame = frame.f_back
    return False


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
