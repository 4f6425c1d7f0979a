"""What both trainers share: the job's parts, the data order, exact evaluation, and the
per-step / per-epoch bookkeeping (progress, checkpoints, resume, stop requests).

Keeping these in one place is what keeps `hapi` and `loop` from drifting apart in
seeding, sharding, evaluation, checkpoints and resume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.optimizer.lr import LRScheduler

from .. import checkpoint
from ..amp import AmpPlan
from ..faults import Preempted
from ..sync import collective
from . import agreement
from .selection import Best


@dataclass
class Parts:
    """A training job's pieces. `optimizer` is an Optimizer or a factory taking parameters."""

    model: paddle.nn.Layer
    train_data: paddle.io.Dataset
    eval_data: Optional[paddle.io.Dataset]
    loss: Callable
    optimizer: Union[paddle.optimizer.Optimizer, Callable]
    task: str = "classification"      # classification (accuracy) | regression (loss only)
    name: str = ""                    # model name recorded in checkpoints
    classes: Optional[List[str]] = None   # class names, saved in <run>/classes.json
    own: bool = False                 # fit(): the script's own model and data, recorded as such
    optimizer_from: str = "config"    # config (train.optimizer, train.lr) | script (its own)


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
        return self.history[-1] if self.history else {}


@dataclass
class Position:
    """Where training stands: the epoch in progress and the steps already done."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


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


# ------------------------------------------------------------------ data order
class ResumableBatchSampler(paddle.io.DistributedBatchSampler):
    """Paddle's DistributedBatchSampler (same shards, same epoch-seeded order at both API
    levels) that can start an epoch part-way through, for exact resume."""

    def __init__(self, dataset, batch_size: int, env, shuffle: bool, drop_last: bool):
        super().__init__(dataset, batch_size=batch_size, num_replicas=env.world_size,
                         rank=env.global_rank, shuffle=shuffle, drop_last=drop_last)
        self.skip = 0
        self.skipping = 0        # batches the epoch in progress leaves out

    def start(self, epoch: int, skip: int = 0) -> None:
        self.set_epoch(epoch)
        if callable(getattr(self.dataset, "set_epoch", None)):   # per-epoch augmentation
            self.dataset.set_epoch(epoch)
        self.skip, self.skipping = skip, 0

    def __iter__(self):
        self.skipping, self.skip = self.skip, 0
        for i, batch in enumerate(super().__iter__()):
            if i >= self.skipping:
                yield batch

    def __len__(self):
        """Batches this epoch yields (fewer on a resumed epoch: hapi finds its last one by this)."""
        return super().__len__() - max(self.skipping, self.skip)


class BatchLoader:
    """Batches of an in-memory dataset, each gathered by one `dataset.batch(indices)` call
    (one fancy-indexing op per array) instead of a `__getitem__` per sample and a collate.
    Any dataset offering `batch(indices) -> (x, y)` of numpy arrays can use it."""

    def __init__(self, dataset, batch_sampler):
        self.dataset, self.batch_sampler = dataset, batch_sampler

    def __iter__(self):
        for indices in self.batch_sampler:
            x, y = self.dataset.batch(indices)
            yield paddle.to_tensor(x), paddle.to_tensor(y)

    def __len__(self):
        return len(self.batch_sampler)


def loader_for(dataset, batch_sampler, batched: bool = True):
    """BatchLoader when the dataset can gather batches (and `batched`), else a DataLoader."""
    if batched and callable(getattr(dataset, "batch", None)):
        return BatchLoader(dataset, batch_sampler)
    return paddle.io.DataLoader(dataset, batch_sampler=batch_sampler, num_workers=0)


def train_loader(parts: Parts, cfg, env):
    sampler = ResumableBatchSampler(parts.train_data, cfg.train.batch_size, env,
                                    cfg.train.shuffle, cfg.train.drop_last)
    return loader_for(parts.train_data, sampler, cfg.data.batched), sampler


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


# ------------------------------------------------------------------ evaluation
def all_reduce_sum(values: List[float], env, phase=None) -> np.ndarray:
    """Sum a few numbers over all ranks (float64; every rank gets the same result)."""
    tensor = paddle.to_tensor(np.asarray(values, dtype="float64"))
    if env.is_distributed:
        collective(dist.all_reduce, tensor, phase=phase, what="all-reduce of metrics")
    return tensor.numpy()


@paddle.no_grad()
def average_buffers(net, env, phase=None) -> None:
    """Average the model's floating-point state that no gradient moves (BatchNorm's running
    statistics: Paddle keeps them as non-trainable parameters) over the ranks. Each rank's
    come from its own shard; averaged at each epoch's end, evaluation and checkpoints see
    one model, the same on every rank (like DDP's buffer broadcast, but once an epoch,
    and using every rank's statistics)."""
    trained = {id(p) for p in net.parameters() if not p.stop_gradient}
    found = [t for t in net.state_dict().values() if id(t) not in trained and t.dtype in
             (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)]
    if not env.is_distributed or not found:
        return
    flat = paddle.concat([b.reshape([-1]).astype("float32") for b in found])
    collective(dist.all_reduce, flat, phase=phase, what="all-reduce of buffers")
    flat = flat / env.world_size
    offset = 0
    for b in found:
        size = int(b.size)
        b.set_value(flat[offset:offset + size].reshape(b.shape).astype(b.dtype))
        offset += size


@paddle.no_grad()
def evaluate(net, dataset, loss_fn, task: str, env, batch_size: int,
             beat: Callable[[], None] = lambda: None, phase=None,
             batched: bool = True) -> Dict[str, float]:
    """Loss (and accuracy for classification) over the whole dataset, identical on all ranks."""
    was_training = net.training
    net.eval()
    sampler = ExactShardSampler(len(dataset), batch_size, env.global_rank, env.world_size)
    loader = loader_for(dataset, sampler, batched)
    loss_sum = correct = count = 0.0
    for x, y in loader:
        out = net(x)
        n = x.shape[0]
        loss_sum += float(loss_fn(out, y)) * n
        if task == "classification":
            correct += float((out.argmax(axis=-1) == y.reshape([-1])).astype("float64").sum())
        count += n
        beat()
    if was_training:
        net.train()
    loss_sum, correct, count = (float(v) for v in all_reduce_sum([loss_sum, correct, count], env, phase))
    metrics: Dict[str, Any] = {"loss": loss_sum / max(count, 1), "count": int(count)}
    if task == "classification":
        metrics["accuracy"] = correct / max(count, 1)
    return metrics


# ------------------------------------------------------------------ the session
class Session:
    """One rank's training run: counters, progress, checkpoints, stop requests.

    Both trainers call `after_step(loss)` after every optimizer step and
    `end_epoch(epoch)` after every epoch; everything else is shared here, the stepping of
    the optimizer's own LRScheduler included (`step_scheduler`). The losses are
    kept by `progress`, which reads them on the host at its reports only.
    """

    def __init__(self, parts: Parts, cfg, env, run_dir: Optional[Path], progress, monitor,
                 sync, optimizer, start: Position, limit: int, config_hash: str,
                 lr_policy=None):
        self.parts, self.cfg, self.env, self.run_dir = parts, cfg, env, run_dir
        self.progress, self.monitor, self.sync, self.optimizer = progress, monitor, sync, optimizer
        self.pos, self.limit, self.config_hash = start, limit, config_hash
        self.lr_policy = lr_policy
        # The optimizer's own LRScheduler, stepped here (train.scheduler_every) at both API
        # levels; paddle_dist's lr policy and such a scheduler exclude each other (_lr_policy).
        own = getattr(optimizer, "_learning_rate", None)
        self.scheduler = own if isinstance(own, LRScheduler) and lr_policy is None else None
        self.amp, self.scaler = AmpPlan(), None      # mixed precision (set by the trainer)
        self.best = Best(cfg.checkpoint.monitor, cfg.train.early_stop_patience)
        self.saver = checkpoint.AsyncSaver()
        self.checked_at = -1          # the step whose weights the ranks last compared
        self.result = Result(run_dir=run_dir)

    @property
    def done(self) -> bool:
        return self.pos.global_step >= self.limit

    def begin_epoch(self, epoch: int) -> None:
        if epoch != self.pos.epoch:
            self.pos = Position(epoch=epoch, global_step=self.pos.global_step)
        self.progress.epoch_begin(epoch, self.pos.step_in_epoch)

    def before_step(self) -> None:
        """Set the rate for the coming optimizer step (a function of the step alone)."""
        if self.lr_policy is not None:
            self.optimizer.set_lr(self.lr_policy.at(self.pos.global_step))

    def after_step(self, loss) -> bool:
        """Bookkeeping after an optimizer step; True when the step limit is reached.
        `loss`: the step's mean loss, a device tensor (left unread) or a number."""
        self.pos.step_in_epoch += 1
        self.pos.global_step += 1
        self.result.step_times.append(time.perf_counter())
        if self.result.first_step_at is None:
            self.result.first_step_at = time.time()
        measurable = self.env.is_distributed and self.sync.mode != "dataparallel"
        self.progress.step(loss, float(self.optimizer.get_lr()),
                           self.sync.comm_seconds if measurable else None)
        self.step_scheduler("step")
        self.monitor.step(self.pos.global_step, self.pos.epoch)
        self.monitor.perturb(self.parts.model, self.pos.global_step)     # faults.inject=perturb
        if self.sync.stop_requested:
            self._stop_for_preemption()
        every = self.cfg.checkpoint.every_steps
        if every and self.pos.global_step % every == 0 and not self.done:
            self._save_mid_epoch()
        return self.done

    def _save_mid_epoch(self) -> None:
        """A checkpoint holds one model, so first the ranks' BatchNorm statistics are
        averaged, as at each epoch's end: every rank resumes from what it would have had
        (the statistics are running averages, linear in their updates, so averaging them
        now or only at the epoch's end gives the same numbers there)."""
        average_buffers(self.parts.model, self.env, self.monitor.phase)
        self.save(Position(self.pos.epoch, self.pos.step_in_epoch, self.pos.global_step))

    def end_epoch(self, epoch: int) -> Dict[str, Any]:
        """Global train loss, exact evaluation, history, epoch-end checkpoint."""
        self.progress.pause()
        losses = self.progress.epoch_losses()
        total, n = all_reduce_sum([sum(losses), len(losses)], self.env, self.monitor.phase)
        metrics: Dict[str, Any] = {"epoch": epoch + 1, "train_loss": float(total / max(n, 1))}
        average_buffers(self.parts.model, self.env, self.monitor.phase)
        if self.parts.eval_data is not None:
            found = evaluate(self.parts.model, self.parts.eval_data, self.parts.loss, self.parts.task,
                             self.env, self.cfg.train.eval_batch_size, self.monitor.beat,
                             self.monitor.phase, self.cfg.data.batched)
            metrics.update({f"eval_{k}": v for k, v in found.items()})
        self.result.history.append(metrics)
        self.progress.epoch_end(epoch, metrics["train_loss"],
                                {k[5:]: v for k, v in metrics.items() if k.startswith("eval_")})
        self.step_scheduler("epoch")
        every = self.cfg.checkpoint.every_epochs
        at = Position(epoch=epoch + 1, global_step=self.pos.global_step)
        if every and (epoch + 1) % every == 0:
            self.save(at)
        self._select(metrics, at)
        self.progress.resume()
        return metrics

    def step_scheduler(self, when: str) -> None:
        """Step the optimizer's own LRScheduler if train.scheduler_every is `when` (step:
        after every optimizer step, never per micro-batch; epoch: after every epoch), the
        rule of hapi's `paddle.callbacks.LRScheduler(by_step, by_epoch)`. Called before any
        checkpoint of that step or epoch is taken, so a resumed run (the scheduler's state
        is in the optimizer's state_dict) continues the schedule where it stood.

        Example:
            session.step_scheduler("epoch")     # at an epoch's end
        """
        if self.scheduler is not None and self.cfg.train.scheduler_every == when:
            self.scheduler.step()

    def _select(self, metrics: Dict[str, Any], at: Position) -> None:
        """Best checkpoint and early stopping, on rank 0's value (the same everywhere)."""
        if self.best.monitor not in metrics:
            return
        value = metrics[self.best.monitor] if self.env.is_main else 0.0
        metrics = dict(metrics, **{self.best.monitor: float(all_reduce_sum(
            [value], self.env, self.monitor.phase)[0])})
        improved = self.best.update(metrics)      # on every rank: it is the early-stop state
        if improved and self.cfg.checkpoint.save_best and self.run_dir:
            self.save(at, Path(self.run_dir) / "best", keep_last=1)
        if self.best.should_stop and not self.done:
            self.progress.log.info(
                f"early stop after epoch {at.epoch}: no better {self.best.monitor} in "
                f"{self.best.stale} evaluations ({self.best.describe()})")
            self.limit = self.pos.global_step

    def save(self, at: Position, root: Optional[Path] = None, keep_last: Optional[int] = None) -> None:
        """Rank 0 snapshots the state now and writes it in the background: no other rank
        ever waits inside a collective while the files are written. `root`: where
        (default <run>/checkpoints). Every rank calls it: first the ranks check that
        their weights agree (check_weights), so a checkpoint never keeps diverged ones."""
        self.check_weights(at.global_step)
        if not (self.env.is_main and self.run_dir):
            return
        meta = {"global_step": at.global_step, "epoch": at.epoch, "step_in_epoch": at.step_in_epoch,
                "world_size": self.env.world_size, "model": self.parts.name,
                "api": self.cfg.train.api, "config_hash": self.config_hash,
                "history": self.result.history}
        snap = checkpoint.snapshot(self.parts.model, self.optimizer, meta)
        self.saver.submit(root or Path(self.run_dir) / "checkpoints", snap,
                          self.cfg.checkpoint.keep_last if keep_last is None else keep_last,
                          before_write=self.monitor.save_delay(at.global_step))
        what = "best checkpoint" if root is not None else "checkpoint"
        self.progress.log.info(f"{what} for step {at.global_step} is being written")

    def check_weights(self, step: int) -> None:
        """The ranks compare their weights (agreement.check: one collective), once a step:
        an epoch's end may save twice (its checkpoint and the best one). Raises
        faults.Diverged when they differ."""
        if self.checked_at != step:
            self.checked_at = step
            agreement.check(self.parts.model, self.env, step, self.monitor.phase)

    def _stop_for_preemption(self) -> None:
        self._save_mid_epoch()
        self.saver.wait()
        self.progress.log.info(f"stop requested: checkpoint saved at step {self.pos.global_step}; "
                               "exiting so the job can be requeued")
        raise Preempted(f"stopped on request at step {self.pos.global_step}")

    def close(self) -> None:
        self.saver.close()


def steps_per_epoch(num_samples: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Steps of Paddle's DistributedBatchSampler per epoch (each rank gets ceil(N/W) samples)."""
    per_rank = -(-num_samples // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def total_steps(cfg, per_epoch: int) -> int:
    full = per_epoch * cfg.train.epochs
    return min(full, cfg.train.max_steps) if cfg.train.max_steps else full


def to_float(value: Any) -> float:
    return float(np.asarray(value).reshape(-1)[0])
