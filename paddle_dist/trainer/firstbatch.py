"""Errors before work: the first batch is run once before epoch 1.

Each rank reads its first training batch in its own thread, splits it, and runs the
model's forward and the loss on it, then its first evaluation batch (a few samples)
through the forward, the loss and every metric's compute and update (the metrics are
reset before each evaluation). Both run in evaluation mode without gradients (a forward
hook of the user's that counts training calls, as an lr recorder may, sees none of
these); a training batch whose forward or loss fails there runs again in training mode
(a model with heads in training only returns them there, as its loss expects), and a
failure says the mode. The random generators and BatchNorm statistics are put back
after, and the optimizer is never called, so training is bitwise what it would have
been. A sample
in the wrong layout, a metric that cannot read the outputs, or a crash at evaluation
shows within seconds as one line (errors.DataError, exit 2), not after an epoch.

What it found is returned (`FirstBatch`): a training batch's count of inputs and labels
(how paddle.Model splits a batch, hapi.py), the names its fields go to `forward` by (a
dict batch's, keywords.py) and whether evaluation returns a loss.

Example:
    first = firstbatch.check(parts, cfg, env, plan)   # raises DataError naming the batch and the step
    first.fields                                      # (1, 1): one input, one label
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
import paddle

from .amp import AmpPlan, autocast
from ..errors import DataError, UserError
from .evaluation import accuracy_left_out, buffers, computed
from .badsample import user_frame
from .feed import describe, returns_loss
from .keywords import keyword_names
from ..runtime.env import DistEnv
from ..schema import Config

EVAL_SAMPLES = 8          # the evaluation check's batch: a few samples are enough
EVAL_LOSS_HINT = ("; a loss that cannot take evaluation's outputs or labels (heads of training only, "
                  "labels of another shape) is left out with -o train.eval_loss=false: the metrics alone")


@dataclass(frozen=True)
class FirstBatch:
    """What the check found: a training batch's (inputs, labels) counts (None when it ran
    no training batch), and whether evaluation returns a loss (a model with its own loss
    may return detections alone); `names`: the names a training batch's fields go to
    forward by, () when by position (else paddle.Model is handed keywords.ByName)."""

    fields: Optional[Tuple[int, int]] = None
    eval_returns_loss: bool = True
    names: Tuple[str, ...] = ()


def check(parts, cfg: Config, env: DistEnv, precision: AmpPlan, train: bool = True) -> FirstBatch:
    """Run the first training batch (when `train`) and the first evaluation batch of this rank."""
    world, rank = env.world_size, env.global_rank
    fields, returns, names = None, True, ()
    with _kept(parts.model):
        if train:
            size = min(cfg.train.batch_size, len(parts.train_data))
            indices = list(range(rank, len(parts.train_data), world))[:size] or [0]
            fields, names = _run(parts, parts.train_data, indices, "training", precision, cfg.data.batched, True)
        if parts.eval_data is not None and (parts.eval_data.stream or len(parts.eval_data)):
            size = min(cfg.train.eval_batch_size, EVAL_SAMPLES)
            # (Of a stream, its first len(indices) samples: source.first_batch.)
            indices = list(range(rank, len(parts.eval_data), world))[:size] or list(range(size))
            returns = _run(parts, parts.eval_data, indices, "evaluation", precision, cfg.data.batched, False,
                           cfg.train.eval_loss)
    for metric in parts.metrics:
        metric.reset()
    return FirstBatch(fields, returns, names)


def _run(parts, source, indices: List[int], what: str, precision: AmpPlan, batched: bool,
         training: bool, with_loss: bool = True):
    """Training: the batch's (inputs, labels) counts and the names they go to forward by;
    evaluation: whether it gave a loss (always True when the model is not the loss's own)."""
    feed = parts.feed
    batch = _step(f"reading the first {what} batch (samples {_span(indices)})",
                  lambda: source.first_batch(indices, batched))
    hint = feed.dict_hint(batch)
    inputs, labels = _step(f"splitting the first {what} batch ({describe(batch)})", lambda: feed.split(batch), hint)
    if not training:
        return _forward(parts, inputs, labels, what, "evaluation", precision, hint, with_loss)
    try:                 # quietly first: a user's hook that counts training forwards sees none
        _forward(parts, inputs, labels, what, "evaluation", precision, hint)
    except DataError:    # outputs of training only (auxiliary heads): as training runs it
        _forward(parts, inputs, labels, what, "training", precision, hint)
    # What paddle.Model is told of a training batch's fields, and the names it calls them by.
    return (len(inputs), len(labels)), keyword_names(inputs, labels if feed.model_loss else ())


def _forward(parts, inputs, labels, what: str, mode: str, precision: AmpPlan, hint: str,
             with_loss: bool = True) -> bool:
    """The forward, the loss and (evaluating) the metrics on one batch, in `mode`; whether
    a model with its own loss returned one."""
    net, feed = parts.model, parts.feed
    held = (f"the first {what} batch (inputs {describe(inputs)}; labels {describe(labels) or 'none'}; "
            f"in {mode} mode)")
    net.train() if mode == "training" else net.eval()
    with paddle.no_grad(), autocast(precision):
        returned = True
        if what == "evaluation":      # as evaluation computes it: the loss, if any, and the outputs
            loss, given, _ = _step(f"the model's forward and the loss on {held}",
                                lambda: feed.evaluated(net, parts.loss, inputs, labels, with_loss),
                                hint or (EVAL_LOSS_HINT if with_loss else ""))
            returned = loss is not None or not with_loss
        else:
            outputs = _step(f"the model's forward on {held}", lambda: feed.outputs(net, inputs, labels), hint)
            _step(f"the loss on {held} and the model's outputs ({describe(outputs)})",
                  lambda: _training_loss(feed, parts.loss, outputs, labels), hint)
            given = []
        if what == "evaluation" and parts.task == "classification" and not parts.metrics:
            _say_accuracy(given, labels)
        for metric in parts.metrics if what == "evaluation" else ():
            name = type(metric).__name__
            _step(f"metric {name}'s compute/update on the outputs ({describe(given)}) and labels "
                  f"({describe(labels)}) of {held}",
                  lambda: metric.update(*computed(metric, given, labels)), hint)
    return returned


def _say_accuracy(outputs, labels) -> None:
    """One line at the start when evaluation will leave the built-in accuracy out because
    the scores have one column (evaluation.accuracy_left_out)."""
    line = accuracy_left_out(outputs, labels)
    if line:
        logging.getLogger("paddle_dist").info(f"paddle_dist: {line}")


def _training_loss(feed, loss_fn, outputs, labels):
    if feed.model_loss and not returns_loss(outputs):     # a detector's detections, evaluating
        raise ValueError("loss='model', but the model returned no loss (a one-element tensor, or a "
                         "dict with 'loss')")
    return feed.loss_of(loss_fn, outputs, labels)


def _step(what: str, fn: Callable, hint: str = ""):
    try:
        return fn()
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here is the input's: one line
        raise DataError(f"{what} failed: {type(exc).__name__}: {key_line(exc)}{user_frame(exc)}"
                        + (hint or "; check that the samples have the layout and dtype the model, the "
                                   "loss and the metrics expect") + " (the check before epoch 1)") from exc


def key_line(exc: BaseException, limit: int = 400) -> str:
    """The line of an error's text that says what went wrong (Paddle's errors run to
    dozens of lines: the one naming the error, e.g. `(InvalidArgument) ...`)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    found = next((line for line in lines if re.match(r"^(\(\w+\)|\w*Error:)", line)), None)
    found = found or next((line for line in lines if not line.startswith(("-", "="))), "")
    return found if len(found) <= limit else found[:limit] + "..."


class _kept:
    """Puts back the model's buffers (BatchNorm statistics) and the random generators
    (Python's, numpy's, Paddle's; on Paddle 2.6 its CPU engine is not restorable, and an
    evaluation-mode forward draws nothing from it)."""

    def __init__(self, net):
        self.net = net

    def __enter__(self):
        # The dataset's own augmentation draws from Python's and numpy's generators.
        self.rng = (random.getstate(), np.random.get_state(), paddle.get_rng_state())
        self.saved = [(b, b.clone()) for b in buffers(self.net)]
        self.training = self.net.training

    def __exit__(self, *exc):
        python, numpy, own = self.rng
        random.setstate(python)
        np.random.set_state(numpy)
        paddle.set_rng_state(own)
        with paddle.no_grad():
            for buffer, value in self.saved:
                buffer.set_value(value)
        self.net.train() if self.training else self.net.eval()
        return False


def _span(indices: List[int]) -> str:
    return f"{indices[0]}..{indices[-1]}" if len(indices) > 1 else str(indices[0])
