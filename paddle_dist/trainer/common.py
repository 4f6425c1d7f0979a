"""What both trainers share besides the Session (session.py): the job's parts, where a run
stands (Position), what it returns (Result), the optimizer from the config, and losses
read as numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import paddle

from .ema import MeasuredClip
from .feed import Feed
from .loading import Source


@dataclass
class Parts:
    """A training job's pieces. `optimizer` is an Optimizer or a factory taking parameters;
    the data a Dataset or a DataLoader (kept as a loading.Source); `feed` how a batch
    reaches the model and the loss (default: paddle.Model's rule for `model`)."""

    model: paddle.nn.Layer
    train_data: Any
    eval_data: Optional[Any]
    loss: Optional[Callable]
    optimizer: Union[paddle.optimizer.Optimizer, Callable]
    task: str = "classification"      # classification (accuracy) | regression (loss only)
    name: str = ""                    # model name recorded in checkpoints
    classes: Optional[List[str]] = None   # class names, saved in <run>/classes.json
    own: bool = False                 # fit(): the script's own model and data, recorded as such
    optimizer_from: str = "config"    # config (train.optimizer, train.lr) | script (its own)
    metrics: List[Any] = field(default_factory=list)      # paddle.metric.Metric objects
    callbacks: List[Any] = field(default_factory=list)    # paddle.callbacks.Callback objects
    feed: Optional[Feed] = None

    def __post_init__(self):
        self.train_data = Source.of(self.train_data, "train_data")
        self.eval_data = Source.of(self.eval_data, "eval_data")
        if self.feed is None:
            self.feed = Feed(self.model)


@dataclass
class Result:
    """What `fit` returns on every rank."""

    run_dir: Optional[Path]
    losses: List[float] = field(default_factory=list)      # this rank's loss per step (this run)
    history: List[Dict[str, float]] = field(default_factory=list)  # per epoch, same on all ranks
    samples_per_s: float = 0.0
    step_times: List[float] = field(default_factory=list)  # perf_counter() after each step (this run)
    first_step_at: Optional[float] = None  # time.time() when this run's first step ended
    wall_time_s: float = 0.0
    steps: int = 0                    # optimizer steps in total, including resumed ones
    comm_calls: int = 0               # exchanges by the gradient sync (all-reduces or shm rounds)
    sync_transport: str = "none"      # how gradients travelled: shm | backend | none
    resumed_from: Optional[str] = None

    @property
    def metrics(self) -> Dict[str, float]:
        """The last epoch's metrics, with the last evaluation's when they have none of their
        own (train.eval_every_steps evaluates between epoch ends)."""
        last = dict(self.history[-1]) if self.history else {}
        evaluated = next((h for h in reversed(self.history) if "eval_count" in h), {})
        return last if "eval_count" in last else {**last, **{k: v for k, v in evaluated.items() if k.startswith("eval_")}}


@dataclass
class Position:
    """Where training stands: the epoch in progress and the steps already done;
    `epoch_loss`: the sum of the step losses (each the mean over its ranks) and the count
    of the steps of the epoch in progress that an earlier attempt ran, and the sums of the
    loss's parts by name, so that a resumed epoch's train loss still covers the whole epoch."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_loss: tuple = (0.0, 0.0, {})


def default_loss(task: str):
    return paddle.nn.CrossEntropyLoss() if task == "classification" else paddle.nn.MSELoss()


def make_optimizer(spec, parameters):
    if isinstance(spec, paddle.optimizer.Optimizer):
        return spec
    return spec(parameters)


def optimizer_factory(name: str, lr: float, weight_decay: float, clip_norm: float = 0.0) -> Callable:
    """Factory for the configured optimizer (so it is created on the right parameters);
    `clip_norm` > 0: gradients clipped to that global norm (ema.MeasuredClip)."""
    def build(parameters):
        decay = weight_decay or None
        clip = MeasuredClip(clip_norm) if clip_norm else None
        if name == "adam":
            return paddle.optimizer.Adam(learning_rate=lr, parameters=parameters, weight_decay=decay,
                                         grad_clip=clip)
        if name == "momentum":
            return paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=parameters,
                                             weight_decay=decay, grad_clip=clip)
        return paddle.optimizer.SGD(learning_rate=lr, parameters=parameters, weight_decay=decay,
                                    grad_clip=clip)
    return build


def to_float(value: Any) -> float:
    """A loss or metric value as a Python float: a tensor's value, a bfloat16 one's too
    (its .numpy() gives the bits, as uint16)."""
    if isinstance(value, paddle.Tensor):
        value = value.astype("float32").numpy()
    return float(np.asarray(value).reshape(-1)[0])
