"""What both trainers share: the job's parts, exact evaluation, optimizer, epoch end.

Keeping these in one place is what keeps `hapi` and `loop` from drifting apart in
seeding, sharding, evaluation and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import paddle
import paddle.distributed as dist

from .. import checkpoint
from ..logger import Progress


@dataclass
class Parts:
    """A training job's pieces. `optimizer` is an Optimizer or a factory taking parameters."""

    model: paddle.nn.Layer
    train_data: paddle.io.Dataset
    eval_data: Optional[paddle.io.Dataset]
    loss: Callable
    optimizer: Union[paddle.optimizer.Optimizer, Callable]
    task: str = "classification"      # classification (accuracy) | regression (loss only)


@dataclass
class Result:
    """What `fit` returns on every rank."""

    run_dir: Optional[Path]
    losses: List[float] = field(default_factory=list)      # this rank's loss per step
    history: List[Dict[str, float]] = field(default_factory=list)  # per epoch, same on all ranks
    samples_per_s: float = 0.0
    wall_time_s: float = 0.0
    steps: int = 0

    @property
    def metrics(self) -> Dict[str, float]:
        return self.history[-1] if self.history else {}


def default_loss(task: str):
    return paddle.nn.CrossEntropyLoss() if task == "classification" else paddle.nn.MSELoss()


def make_optimizer(spec, parameters):
    if isinstance(spec, paddle.optimizer.Optimizer):
        return spec
    return spec(parameters)


def optimizer_factory(name: str, lr: float, weight_decay: float) -> Callable:
    """Factory for the configured optimizer (so it is created on the right parameters)."""
    def build(parameters):
        decay = weight_decay or None
        if name == "adam":
            return paddle.optimizer.Adam(learning_rate=lr, parameters=parameters, weight_decay=decay)
        if name == "momentum":
            return paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=parameters,
                                             weight_decay=decay)
        return paddle.optimizer.SGD(learning_rate=lr, parameters=parameters, weight_decay=decay)
    return build


class ExactShardSampler(paddle.io.BatchSampler):
    """Evaluation batches of rank r: samples r, r+W, r+2W, ... No padding, so with the
    counts summed across ranks every sample is counted exactly once (Paddle's
    DistributedBatchSampler pads with duplicates to even out the shards)."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int):
        self.indices = list(range(rank, num_samples, world_size))
        self.batch_size = batch_size

    def __iter__(self):
        for start in range(0, len(self.indices), self.batch_size):
            yield self.indices[start:start + self.batch_size]

    def __len__(self):
        return (len(self.indices) + self.batch_size - 1) // self.batch_size


def all_reduce_sum(values: List[float], env) -> np.ndarray:
    """Sum a few numbers over all ranks (float64; every rank gets the same result)."""
    tensor = paddle.to_tensor(np.asarray(values, dtype="float64"))
    if env.is_distributed:
        dist.all_reduce(tensor)
    return tensor.numpy()


@paddle.no_grad()
def evaluate(net, dataset, loss_fn, task: str, env, batch_size: int) -> Dict[str, float]:
    """Loss (and accuracy for classification) over the whole dataset, identical on all ranks."""
    was_training = net.training
    net.eval()
    sampler = ExactShardSampler(len(dataset), batch_size, env.global_rank, env.world_size)
    loader = paddle.io.DataLoader(dataset, batch_sampler=sampler, num_workers=0)
    loss_sum = correct = count = 0.0
    for x, y in loader:
        out = net(x)
        n = x.shape[0]
        loss_sum += float(loss_fn(out, y)) * n
        if task == "classification":
            correct += float((out.argmax(axis=-1) == y.reshape([-1])).astype("float64").sum())
        count += n
    if was_training:
        net.train()
    loss_sum, correct, count = all_reduce_sum([loss_sum, correct, count], env)
    metrics = {"loss": loss_sum / max(count, 1), "count": count}
    if task == "classification":
        metrics["accuracy"] = correct / max(count, 1)
    return metrics


class EpochEnd:
    """End-of-epoch work both trainers do: global train loss, exact eval, checkpoint."""

    def __init__(self, parts: Parts, cfg, env, run_dir: Optional[Path], progress: Progress,
                 result: Result):
        self.parts, self.cfg, self.env, self.run_dir = parts, cfg, env, run_dir
        self.progress, self.result = progress, result
        self._epoch_losses: List[float] = []

    def __call__(self, epoch: int, net, optimizer) -> Dict[str, float]:
        self.progress.pause()
        losses = self.progress.losses[len(self._epoch_losses):]
        self._epoch_losses = list(self.progress.losses)
        total, n = all_reduce_sum([sum(losses), len(losses)], self.env)
        metrics = {"epoch": epoch + 1, "train_loss": total / max(n, 1)}
        if self.parts.eval_data is not None:
            found = evaluate(net, self.parts.eval_data, self.parts.loss, self.parts.task,
                             self.env, self.cfg.train.eval_batch_size)
            metrics.update({f"eval_{k}": v for k, v in found.items()})
        self.result.history.append(metrics)
        self.progress.epoch_end(epoch, metrics["train_loss"],
                                {k[5:]: v for k, v in metrics.items() if k.startswith("eval_")})
        self._save(epoch, net, optimizer)
        self.progress.resume()
        return metrics

    def _save(self, epoch: int, net, optimizer) -> None:
        every = self.cfg.checkpoint.every_epochs
        if not (self.env.is_main and self.run_dir and every and (epoch + 1) % every == 0):
            return
        path = checkpoint.save(Path(self.run_dir) / "checkpoints", epoch + 1, net, optimizer,
                               keep_last=self.cfg.checkpoint.keep_last,
                               meta={"world_size": self.env.world_size, "api": self.cfg.train.api,
                                     "model": self.cfg.model.name, "step": self.progress.step_count})
        self.progress.log.info(f"checkpoint saved: {path}")


def steps_per_epoch(num_samples: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Steps of Paddle's DistributedBatchSampler per epoch (each rank gets ceil(N/W) samples)."""
    per_rank = -(-num_samples // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def total_steps(cfg, per_epoch: int) -> int:
    full = per_epoch * cfg.train.epochs
    return min(full, cfg.train.max_steps) if cfg.train.max_steps else full


def lr_of(optimizer) -> float:
    return float(optimizer.get_lr())


def to_float(value: Any) -> float:
    return float(np.asarray(value).reshape(-1)[0])
