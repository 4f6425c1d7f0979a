"""Exact evaluation over all ranks: every sample once, no padding duplicates, and the
same numbers on every rank as one process evaluating the whole set.

The set is cut into the batches one process would evaluate, dealt round-robin to the
ranks (rank r evaluates batches r, r+W, ...), so each batch holds the same samples at any
number of ranks and its numbers are the same bits. The loss (and the built-in accuracy)
are sums, all-reduced: each batch's mean loss weighs by its count for a loss with one
(weighting.py: Σ sums / Σ counts over the whole set, and its perplexity, exp(loss)), else
by its samples. A `paddle.metric.Metric` of the user's is not a sum paddle_dist can add up
(mIoU, F1, AUC): each rank computes `metric.compute(*outputs, *labels)` on its batch, the
ranks exchange those results batch by batch, and every rank feeds every rank's results to
its own metric in rank order (`update()` gets numpy, as under paddle.Model): the batches'
order in one process. So each metric sees each sample once, whatever it accumulates, and
never an average of per-rank values. A stream (an IterableDataset) is cut and dealt by
evalstream.py's rule, and the exchange goes on while any rank has a batch; with shards the
metrics see the batches round by round, in rank order, rather than in one process's order.

Example:
    found = evaluate(EvalSetup(net, source, feed, loss_fn, [paddle.metric.Accuracy()], batch_size=500), env)
    found["acc"], found["loss"], found["count"]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import paddle
import paddle.distributed as dist

from ..compat import state_tensors
from ..errors import DataError
from ..sync.grad_sync import collective
from . import evalstream
from .badsample import name_of
from .feed import Feed, batch_size_of, describe
from .parts import Result
from .progress import read_values
from .weighting import ignore_index_of, perplexity
from ..runtime.env import DistEnv
from ..schema import Config

if TYPE_CHECKING:
    from .amp import AmpPlan
    from .state import Resumed
    from .callbacks import Events
    from .loading import Source


class ExactShardSampler(paddle.io.BatchSampler):
    """Evaluation batches of rank r: batches r, r+W, r+2W, ... of the set cut in order into
    batches of `batch_size` (the last one shorter), as one process evaluates them. No
    padding, so with the counts summed across ranks every sample is counted exactly once
    (Paddle's DistributedBatchSampler pads with duplicates to even out the shards)."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int):
        starts = range(0, num_samples, batch_size)
        self.batches = [list(range(start, min(start + batch_size, num_samples))) for start in starts[rank::world_size]]
        self.rounds = exchange_rounds(num_samples, batch_size, world_size)

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def exchange_rounds(num_samples: int, batch_size: int, world_size: int) -> int:
    """Evaluation batches of rank 0, which holds the most: every rank takes part in that
    many exchanges of metric results (one with no batch of its own sends none)."""
    return -(-(-(-num_samples // batch_size)) // world_size)


def all_reduce_sum(values: List[float], env: DistEnv, phase=None) -> np.ndarray:
    """Sum a few numbers over all ranks (float64; every rank gets the same result)."""
    tensor = paddle.to_tensor(np.asarray(values, dtype="float64"))
    if not env.is_distributed:
        return tensor.numpy()
    return collective(dist.all_reduce, tensor, phase=phase, what="all-reduce of metrics", read=tensor.numpy)


def gather(obj: Any, env: DistEnv, phase=None) -> List[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank."""
    if not env.is_distributed:
        return [obj]
    found: List[Any] = []
    collective(dist.all_gather_object, found, obj, phase=phase, what="gather of metric results")
    return found


def buffers(net) -> List[paddle.Tensor]:
    """The model's floating-point state that no gradient moves (BatchNorm's statistics)."""
    trained = {id(p) for p in net.parameters() if not p.stop_gradient}
    return [t for t in state_tensors(net).values() if id(t) not in trained and t.dtype in
            (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)]


def metric_names(metrics: Sequence) -> List[str]:
    """The names the metrics log under (a metric may log several, e.g. acc_top1, acc_top5)."""
    return [name for metric in metrics for name in _as_list(metric.name())]


def builtin_accuracy(outputs: Sequence, labels: Sequence) -> Optional[paddle.Tensor]:
    """Correct predictions of a classifier ([N, C] scores with C >= 2, N labels), else None.
    One column (a binary classifier's logit, BCEWithLogitsLoss) is left out: its argmax is
    class 0 for every sample, a constant that says nothing of the model (accuracy_left_out)."""
    scores = _scores(outputs, labels)
    if scores is None or scores.shape[1] < 2:
        return None
    return (scores.argmax(axis=-1) == labels[0].reshape([-1]).astype("int64")).astype("float64").sum()


def accuracy_left_out(outputs: Sequence, labels: Sequence) -> str:
    """The line that says why a classifier whose scores have one column gets no built-in
    accuracy, and how to get one; "" for any other outputs.

    Example:
        accuracy_left_out([logits], [labels])     # logits [8, 1]: 'no built-in accuracy: ...'
    """
    scores = _scores(outputs, labels)
    if scores is None or scores.shape[1] != 1:
        return ""
    return (f"no built-in accuracy: the model's scores have one column ({describe([scores])}), and an "
            "argmax over one column names class 0 for every sample; give fit() metrics=[...] with a "
            "paddle.metric.Metric whose compute() thresholds the logit (logged as eval_<name>, usable "
            "as checkpoint.monitor), or a model with one column per class")


def _scores(outputs: Sequence, labels: Sequence) -> Optional[paddle.Tensor]:
    """The one output when it is [N, C] scores for N labels, else None."""
    if len(outputs) != 1 or len(labels) != 1 or not isinstance(outputs[0], paddle.Tensor):
        return None
    out, label = outputs[0], labels[0]
    if len(out.shape) != 2 or int(np.prod(label.shape)) != out.shape[0]:
        return None
    return out


def _no_beat() -> None:
    pass


@dataclass(frozen=True)
class EvalSetup:
    """What evaluate() evaluates and how: the model, its test set (a loading.Source), the
    feed, loss and metrics (the job's Parts), the job's settings, and its hooks: `beat`
    after each batch (the hang monitor), `phase` (collectives.phase's marker), `events`
    (callbacks.Events: the eval batch begin/end), `amp` (the job's precision plan: the
    forward runs under its autocast at O2, as 16-bit weights need 16-bit inputs; O1
    evaluates in float32). No loss without `with_loss` (train.eval_loss); `ignore_index`:
    train.loss_count=labels, the loss's count is its labels that are not it (weighting.py).

    Example:
        EvalSetup(net, Source.of(data, "eval_data"), Feed(net), paddle.nn.CrossEntropyLoss(), batch_size=2)
    """

    net: paddle.nn.Layer
    source: Source
    feed: Feed
    loss_fn: Any
    metrics: Sequence = ()
    batch_size: int = 500
    task: str = "classification"
    batched: bool = True           # data.batched
    workers: int = 0               # data.num_workers
    with_loss: bool = True
    amp: Optional[AmpPlan] = None
    beat: Callable[[], None] = _no_beat
    phase: Optional[Callable] = None
    events: Optional[Events] = None
    ignore_index: Optional[int] = None

    @classmethod
    def of(cls, parts, cfg: Config, **hooks) -> "EvalSetup":
        """The job's evaluation of `parts` (trainer Parts: model, eval_data, feed, loss,
        metrics, task) with `cfg`'s settings, and `hooks` (amp, beat, phase, events)."""
        return cls(parts.model, parts.eval_data, parts.feed, parts.loss, parts.metrics,
                   cfg.train.eval_batch_size, parts.task, cfg.data.batched, cfg.data.num_workers,
                   cfg.train.eval_loss, ignore_index=ignore_index_of(cfg.train), **hooks)


@paddle.no_grad()
def evaluate(setup: EvalSetup, env: DistEnv) -> Dict[str, Any]:
    """Loss, the metrics (or, with none and a classifier, accuracy) and the sample count over
    the whole of `setup.source`, identical on all ranks, and a loss with a count's
    perplexity. No loss without `setup.with_loss` or from a model that gives none
    (Feed.evaluated): then the result has no "loss"."""
    from .amp import AmpPlan, autocast

    net, metrics, events, phase, amp = setup.net, setup.metrics, setup.events, setup.phase, setup.amp
    was_training = net.training
    net.eval()
    batches, rounds = _batches(setup, env)
    for metric in metrics:
        metric.reset()
    try:
        loss_sum = weights = counted = correct = count = lossless = 0.0
        accuracy = setup.task == "classification" and not metrics
        for step in range(rounds) if rounds is not None else itertools.count():
            batch, results = next(batches, None), None
            if batch is None and rounds is None and not metrics:
                break             # a stream's last batch of this rank: nothing to exchange
            if batch is not None:
                inputs, labels = batch
                if events is not None:
                    events.eval_batch_begin(step)
                with autocast(amp if amp is not None and amp.level == "O2" else AmpPlan()):
                    loss, outputs, items = setup.feed.evaluated(net, setup.loss_fn, inputs, labels,
                                                                setup.with_loss, setup.ignore_index)
                n = batch_size_of(inputs)
                if loss is not None:     # its mean over its count's items, or its samples (one host read)
                    mean, weight = read_values([loss, n if items is None else items])
                    loss_sum, weights, counted = loss_sum + mean * weight, weights + weight, counted + (items is not None)
                lossless += loss is None
                count += n
                if accuracy:
                    hits = builtin_accuracy(outputs, labels)
                    accuracy = hits is not None
                    correct += float(hits) if accuracy else 0.0
                results = [computed(m, outputs, labels) for m in metrics]
            if metrics:
                every = gather(results, env, phase)
                if rounds is None and all(found is None for found in every):
                    break         # a stream: no rank had a batch this round
                for found in every:
                    for metric, args in zip(metrics, found or ()):
                        metric.update(*args)
            if batch is not None and events is not None:
                events.eval_batch_end(step, {**({"loss": [mean]} if loss is not None else {}),
                                             "batch_size": n})
            setup.beat()
    finally:
        batches.close()           # its DataLoader workers, if any, end now
    if was_training:
        net.train()
    # A rank whose batches were not classifier outputs counts no accuracy: the ranks agree.
    sums = all_reduce_sum([loss_sum, correct, count, 0.0 if accuracy or count == 0 else 1.0, lossless,
                           weights, counted], env, phase)
    loss_sum, correct, count, refused, lossless, weights, counted = (float(v) for v in sums)
    if not count and setup.source.stream:     # a Dataset without samples is refused by Source.of
        raise DataError(f"fit(eval_data=...) gave no samples ({name_of(setup.source.dataset)}, a stream): its "
                        "evaluation would report 0 on 0 samples; give it samples, or leave eval_data out")
    found: Dict[str, Any] = {"count": int(count)} if lossless else \
        {"loss": loss_sum / max(weights, 1), "count": int(count)}
    if counted and not lossless:
        found["perplexity"] = perplexity(found["loss"])
    if setup.task == "classification" and not metrics and not refused:
        found["accuracy"] = correct / max(count, 1)
    for metric in metrics:
        found.update(zip_values(metric))
    return found


def _batches(setup: EvalSetup, env: DistEnv):
    """This rank's batches (inputs, labels) and the rounds of exchange every rank joins:
    a dataset's batches r, r + W, ... of one process's (ExactShardSampler), or a stream's
    by evalstream.py's rule, whose rounds (None) go on while any rank has a batch."""
    source = setup.source
    if source.stream:
        loader = evalstream.eval_loader(source, setup.batch_size, env.global_rank, env.world_size, setup.feed,
                                        setup.workers, env.job_dir)
        return iter(loader), None
    sampler = ExactShardSampler(len(source), setup.batch_size, env.global_rank, env.world_size)
    return iter(source.loader(sampler, setup.feed, setup.workers, setup.batched, env.job_dir)), sampler.rounds


def computed(metric, outputs: Sequence, labels: Sequence) -> list:
    """`metric.compute(*outputs, *labels)` as the numpy arguments of its update(), as
    paddle.Model passes them."""
    return [_numpy(r) for r in _as_list(metric.compute(*outputs, *labels))]


def zip_values(metric) -> Dict[str, Any]:
    """{name: value} of a metric's accumulate(), numbers as floats."""
    names, values = _as_list(metric.name()), metric.accumulate()
    values = list(values) if isinstance(values, (list, tuple)) and len(names) > 1 else [values]
    return {name: _plain(value) for name, value in zip(names, values)}


def _plain(value):
    array = np.asarray(value, dtype="float64")
    return float(array.reshape(-1)[0]) if array.size == 1 else array.tolist()


def _numpy(value):
    """A metric's compute() result as update() takes it: numpy, with bfloat16 values as
    float32 (.numpy() of bfloat16 gives the bits, as uint16)."""
    if isinstance(value, paddle.Tensor):
        return (value.astype("float32") if value.dtype == paddle.bfloat16 else value).numpy()
    return value


def _as_list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def evaluate_only(parts, cfg: Config, env: DistEnv, run_dir: Path, monitor, log,
                  found: "Resumed", precision: "AmpPlan") -> Result:
    """A run that evaluates only (--eval-only): the resumed weights on the test set (exact
    counts on any number of ranks), as the run's one entry of history."""
    held = "the eval stream" if parts.eval_data.stream else f"{len(parts.eval_data)} test samples"
    log.info(f"paddle_dist: evaluating {found.path} on {held} "
             f"with {env.world_size} rank(s); nothing is trained")
    setup = EvalSetup.of(parts, cfg, amp=precision, beat=monitor.beat, phase=monitor.phase)
    evaluated = evaluate(setup, env)
    metrics = {"epoch": found.start.epoch, **{f"eval_{k}": v for k, v in evaluated.items()}}
    return Result(run_dir=run_dir, history=[metrics], steps=found.start.global_step, resumed_from=found.path)
