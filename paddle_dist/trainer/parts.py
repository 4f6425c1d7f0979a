"""The records both trainers share: a job's parts (Parts), where a run stands (Position)
and what it returns (Result).

Example:
    parts = Parts(model=net, train_data=train_ds, eval_data=eval_ds, loss=None, optimizer=opt)
    parts.train_data          # a loading.Source: the Dataset or DataLoader as fit() took it
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import paddle

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
    losses: List[float] = field(default_factory=list)      # each step's loss over every rank (this run)
    history: List[Dict[str, float]] = field(default_factory=list)  # per epoch, same on all ranks
    samples_per_s: float = 0.0
    tokens_per_s: Optional[float] = None   # the loss's count per second over all ranks (tokens/s), if it has one
    step_times: List[float] = field(default_factory=list)  # perf_counter() after each step (this run)
    first_step_at: Optional[float] = None  # time.time() when this run's first step ended
    wall_time_s: float = 0.0
    steps: int = 0                    # optimizer steps in total, including resumed ones
    comm_calls: int = 0               # exchanges by the gradient sync (all-reduces or shm rounds)
    sync_transport: str = "none"      # how gradients travelled: a sync/transports.py entry's name, or none
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
    `epoch_loss`: the sum of the step losses (each over every rank) and the count of the
    steps of the epoch in progress that an earlier attempt ran (for a loss with a count,
    weighing each step by its count: Σ sums and Σ counts), and the sums of the loss's parts
    by name, so that a resumed epoch's train loss still covers the whole epoch."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    epoch_loss: tuple = (0.0, 0.0, {})
