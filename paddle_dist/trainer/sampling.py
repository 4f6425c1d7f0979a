"""The data plan: which samples each optimizer step trains on, the same on any number of ranks.

A run's plan is fixed when it starts: its world size W and micro-batches per step k
(train.accumulate_steps), with the per-rank batch B. Step s of epoch e trains on W x k
micro-batches: rank r's batches s*k .. s*k + k - 1 of Paddle's DistributedBatchSampler for
W ranks (epoch-seeded shuffle, padding, drop_last, as at both API levels). The global
batch is B x W x k.

The batches may instead come as the epoch's whole list (train.group_by_length, a batch
sampler of the user's own: grouping.py): plan rank r's are then batches r, r + W, ... of
the list, and the rest is the same. A stream (streams.py) has a plan of its own kind.

A run continued on W' ranks keeps the plan: the step's W x k micro-batches, in the same
compositions, are dealt out in order, W x k / W' to each rank (a rank's share of a step is
its micro-batches, accumulated). The optimizer then sees the gradient of the same samples
at every step, BatchNorm the same micro-batches (and, sync/batchstats.py, statistics that
do not depend on the split), so the run goes on as at W, within float rounding (the sums'
order differs). It needs a whole number of micro-batches per rank in every step, the
epoch's last, shorter one included; where there is none, `plan_for` refuses, listing the
world sizes that work.

Example:
    plan = DataPlan(world=2, accumulate=1)             # the run's, from its checkpoint
    sampler = PlannedBatchSampler(dataset, 8, plan, rank=0, world=1, shuffle=True, drop_last=False)
    sampler.start(epoch=0, steps_done=5)               # rank 0 of 1: 2 micro-batches a step
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import zlib
from dataclasses import dataclass
from typing import Callable, Iterator, List, Optional

import numpy as np
import paddle

from ..checkpoint.format import Meta
from ..errors import ConfigError
from ..runtime.env import DistEnv
from ..schema import Config
from .grouping import Dealt, EpochBatches, LengthGrouped, dealt_batches, grouped_batches, lengths_of


@dataclass(frozen=True)
class DataPlan:
    """The world size and micro-batches per step that define a run's steps."""

    world: int
    accumulate: int

    def per_rank(self, world: int) -> int:
        """Micro-batches per full step for each of `world` ranks."""
        return self.world * self.accumulate // world

    def fits(self, world: int, last: int) -> bool:
        """Whether `world` ranks share every step evenly (`last`: the micro-batches per
        plan rank in an epoch's last step)."""
        return all(self.world * k % world == 0 for k in (self.accumulate, last))


def plan_for(meta: Optional[Meta], world: int, accumulate: int, batches: Callable[[int], int]) -> DataPlan:
    """The plan of a job on `world` ranks with `accumulate` micro-batches per step: the
    checkpoint's (`meta`: its record; a checkpoint from before plans were recorded was
    planned for its world size and `accumulate`), or a new one. `batches(world)`: the
    per-rank batches an epoch has at that world size. Raises ConfigError when `world`
    ranks cannot share the checkpoint's steps evenly."""
    if meta is None:
        return DataPlan(world, accumulate)
    plan = DataPlan(meta.planned_world, int(meta.plan_accumulate or accumulate))
    if plan.world == world:
        return plan
    last = _last_step(batches(plan.world), plan.accumulate)
    if plan.fits(world, last):
        return plan
    options = [w for w in range(1, plan.world * plan.accumulate + 1) if plan.fits(w, last)]
    raise ConfigError(
        f"the run was planned for {plan.world} ranks x {plan.accumulate} micro-batch(es) per step; "
        f"{world} ranks cannot share each step's {plan.world * plan.accumulate} micro-batches (or "
        f"an epoch's last step's {plan.world * last}) evenly; continue it on "
        f"{', '.join(map(str, options))} rank(s) (dist.nprocs), or start afresh with "
        "checkpoint.resume=none")


def _last_step(batches: int, accumulate: int) -> int:
    """Micro-batches per plan rank in an epoch's last step."""
    return batches - (-(-batches // accumulate) - 1) * accumulate if batches else accumulate


def describe(plan: DataPlan, world: int, batch: int) -> str:
    """The start line of a run continued on another number of ranks."""
    micro = plan.per_rank(world)
    return (f"continuing on {world} rank{'s' * (world != 1)} (was {plan.world}): {micro} "
            f"micro-batch{'es' * (micro != 1)} per step keep the global batch of "
            f"{batch * plan.world * plan.accumulate}")


class PlannedBatchSampler(paddle.io.BatchSampler):
    """This rank's batches under `plan` (module docstring), able to start an epoch
    part-way through (`start`), for exact resume. With `world` equal to the plan's, rank
    r gets exactly Paddle's DistributedBatchSampler's batches for rank r. `batches`: the
    epoch's whole list of batches instead (grouping.py), dealt to the plan's ranks;
    `agree(digest)`: every rank's digest of it (a collective), to refuse a list that
    differs between the ranks (a batch sampler of the user's own, drawn unseeded)."""

    def __init__(self, dataset, batch_size: int, plan: DataPlan, rank: int, world: int,
                 shuffle: bool, drop_last: bool, batches=None, agree: Optional[Callable] = None):
        self.dataset, self.batch_size, self.plan = dataset, batch_size, plan
        self.rank, self.world, self.agree = rank, world, agree
        self.listed = EpochBatches(batches) if batches is not None else None
        if self.listed is not None:
            self.shards = [Dealt(self.listed, plan.world, r, drop_last) for r in range(plan.world)]
        else:
            self.shards = [paddle.io.DistributedBatchSampler(dataset, batch_size=batch_size,
                                                             num_replicas=plan.world, rank=r,
                                                             shuffle=shuffle, drop_last=drop_last)
                           for r in range(plan.world)]
        self.epoch, self.skip = 0, 0
        self.skipping = 0             # steps the epoch in progress leaves out
        self._made: dict = {}         # plan rank -> its batches of epoch _epoch_of_shards
        self._epoch_of_shards = -1

    @property
    def steps(self) -> int:
        """Optimizer steps in an epoch."""
        return -(-len(self.shards[0]) // self.plan.accumulate)

    def start(self, epoch: int, steps_done: int = 0) -> None:
        self.epoch, self.skip, self.skipping = epoch, steps_done, 0
        if callable(getattr(self.dataset, "set_epoch", None)):   # per-epoch augmentation
            self.dataset.set_epoch(epoch)
        if self.agree is not None and self.listed is not None:
            self._agreed(epoch)

    def _agreed(self, epoch: int) -> None:
        """Every rank made the same list of batches for `epoch` (each deals its share of it)."""
        made = self.listed.of(epoch)
        digests = self.agree(hashlib.sha256(repr(made).encode()).hexdigest())
        if len(set(digests)) > 1:
            raise ConfigError(f"the batch sampler {type(self.listed.sampler).__name__} gave the ranks different "
                              f"batches in epoch {epoch + 1} (rank 0's differ from rank "
                              f"{next(r for r, d in enumerate(digests) if d != digests[0])}'s): draw its order "
                              "from the epoch set_epoch() gives it, the same on every rank (docs/own_model.md)")

    def _shard(self, rank: int) -> List[List[int]]:
        """Plan rank `rank`'s batches of the epoch in progress, made when first needed:
        a rank of a job at the plan's world size reads only its own shard."""
        if self._epoch_of_shards != self.epoch:
            self._made, self._epoch_of_shards = {}, self.epoch
        if rank not in self._made:
            self.shards[rank].set_epoch(self.epoch)     # (Paddle's moves its epoch on when iterated)
            self._made[rank] = list(self.shards[rank])
        return self._made[rank]

    def _micro(self, step: int, position: int) -> List[int]:
        """Micro-batch number `position` of optimizer step `step`, in plan order (rank-major:
        plan rank r's micro-batches of the step, then rank r + 1's)."""
        k = self.plan.accumulate
        in_step = min(k, len(self.shards[0]) - step * k)       # the epoch's last step may be short
        rank, j = divmod(position, in_step)
        return self._shard(rank)[step * k + j]

    def _share(self, step: int) -> range:
        """The positions of this rank's micro-batches in step `step`."""
        k = self.plan.accumulate
        share = self.plan.world * min(k, len(self.shards[0]) - step * k) // self.world
        return range(self.rank * share, (self.rank + 1) * share)

    def __iter__(self) -> Iterator[List[int]]:
        self.skipping, self.skip = self.skip, 0
        for step in range(self.skipping, self.steps):
            yield from (self._micro(step, position) for position in self._share(step))

    def step_digest(self, step: int) -> str:
        """A digest of the sample indices of optimizer step `step` of the epoch in progress,
        over all ranks (sorted: the same at any world size), for logs that compare runs.

        Example:
            sampler.step_digest(3)      # '9f1c2a0b'
        """
        k = self.plan.accumulate
        count = self.plan.world * min(k, len(self.shards[0]) - step * k)
        indices = sorted(i for position in range(count) for i in self._micro(step, position))
        return hashlib.sha256(",".join(map(str, indices)).encode()).hexdigest()[:8]

    def position(self, steps: int) -> None:
        """A dataset's position is the step counters: nothing more for the checkpoint."""
        return None

    def __len__(self) -> int:
        """Micro-batches this rank takes in the epoch in progress (fewer on a resumed
        epoch: hapi finds its last one by this)."""
        total = len(self.shards[0])
        k, skipped = self.plan.accumulate, max(self.skipping, self.skip)
        left = max(total - skipped * k, 0)
        return left * self.plan.world // self.world


class SeededSamples(paddle.io.Dataset):
    """`dataset[i]` with Python's `random` and numpy's global generator seeded from (the
    run's seed, the epoch, i): a sample's random augmentation is the same whichever rank,
    worker or attempt reads it, so a run continued mid-epoch, on any number of ranks and
    with any number of DataLoader workers, sees the samples it would have. In the process
    that made it (no workers) the generators are put back after each sample; a worker's
    are its own. Randomness inside the model's forward (dropout): randomness.py. A batch
    read in that process (loading.SampleLoader) puts them back once, after its last sample
    (`one_batch`): saving and restoring numpy's state takes 50 us, more than seeding.

    Example:
        seeded = SeededSamples(dataset, seed=2024)
        seeded.set_epoch(3)
        seeded[17]           # the same on every rank and in every attempt
        with seeded.one_batch():
            samples = [seeded[i] for i in (3, 9, 4)]
    """

    def __init__(self, dataset, seed: int):
        self.dataset, self.seed, self.epoch = dataset, int(seed), 0
        self.owner = os.getpid()
        self._in_batch = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        if not self._in_batch:
            with self.one_batch():
                return self[index]
        key = zlib.crc32(f"{self.seed}:{self.epoch}:{int(index)}".encode())
        random.seed(key)
        np.random.seed(key)
        return self.dataset[index]

    @contextlib.contextmanager
    def one_batch(self):
        """Read several samples; Python's and numpy's global generators are put back once,
        at the end, in the process that made this object (a worker's are its own)."""
        kept = (random.getstate(), np.random.get_state()) if os.getpid() == self.owner else None
        self._in_batch = True
        try:
            yield
        finally:
            self._in_batch = False
            if kept is not None:
                random.setstate(kept[0])
                np.random.set_state(kept[1])


def steps_per_epoch(num_samples: int, batch_size: int, world_size: int, drop_last: bool) -> int:
    """Steps of Paddle's DistributedBatchSampler per epoch (each rank gets ceil(N/W) samples)."""
    per_rank = -(-num_samples // world_size)
    return per_rank // batch_size if drop_last else -(-per_rank // batch_size)


def optimizer_steps(num_samples: int, batch_size: int, plan: DataPlan, drop_last: bool) -> int:
    """Optimizer steps per epoch under `plan`: the plan's ranks' batches (steps_per_epoch),
    `plan.accumulate` to a step, the epoch's last step perhaps shorter. The one count of
    steps per epoch (prepare.py, own.steps).

    Example:
        optimizer_steps(4000, 64, DataPlan(world=2, accumulate=2), drop_last=False)   # 16
    """
    micro = steps_per_epoch(num_samples, batch_size, plan.world, drop_last)
    return -(-micro // plan.accumulate)


def batches_per_rank(source, cfg: Config, world: int) -> int:
    """Each rank's batches of an epoch at `world` ranks: Paddle's DistributedBatchSampler's
    for a dataset, a list of batches dealt out (grouping.py), 0 for a stream (one epoch of
    train.max_steps)."""
    if source.stream:
        return 0
    if cfg.train.group_by_length:
        listed = grouped_batches(len(source), cfg.train.batch_size, cfg.train.drop_last)
    elif source.batch_sampler is not None:
        listed = len(source.batch_sampler)
    else:
        return steps_per_epoch(len(source), cfg.train.batch_size, world, cfg.train.drop_last)
    return dealt_batches(listed, world, cfg.train.drop_last)


def steps_of(source, cfg: Config, plan: DataPlan) -> int:
    """Optimizer steps per epoch of `source` under `plan` (a stream: train.max_steps, its
    one epoch). The one count of steps per epoch (prepare.py, own.steps).

    Example:
        steps_of(Source.of(dataset, "train_data"), cfg, DataPlan(world=2, accumulate=2))   # 16
    """
    if source.stream:
        return cfg.train.max_steps
    return -(-batches_per_rank(source, cfg, plan.world) // plan.accumulate)


def check_data(source, cfg: Config) -> None:
    """One line for an order the data cannot have: a stream without train.max_steps, or
    train.group_by_length over a stream or a batch sampler of the user's own."""
    if source.stream and not cfg.train.max_steps:
        raise ConfigError("fit(train_data=...) is a stream (an IterableDataset), which has no length: set the "
                          "run's optimizer steps, e.g. -o train.max_steps=1000")
    if cfg.train.group_by_length and (source.stream or source.batch_sampler is not None):
        what = "a stream" if source.stream else f"a batch sampler of its own ({type(source.batch_sampler).__name__})"
        raise ConfigError(f"train.group_by_length makes the batches, but the training data is {what}; "
                          "drop one of them")


def total_steps(cfg: Config, per_epoch: int) -> int:
    """The run's optimizer steps: train.max_steps when set (the suites' `iters`: as many
    epochs as it takes, epochs_for), else train.epochs of `per_epoch`."""
    return cfg.train.max_steps or per_epoch * cfg.train.epochs


def epochs_for(cfg: Config, per_epoch: int) -> int:
    """The epochs a run counts: train.epochs, or with train.max_steps those its steps fill."""
    return -(-cfg.train.max_steps // max(per_epoch, 1)) if cfg.train.max_steps else cfg.train.epochs


def train_loader(parts, cfg: Config, env: DistEnv, plan: Optional[DataPlan] = None,
                 agree: Optional[Callable] = None):
    """The training batches of this rank, as (inputs, labels), and their sampler: the run's
    data plan (sampling.py; default: this job's world size and train.accumulate_steps).
    `agree`: a gather over the ranks, to check a batch sampler of the user's own."""
    plan = plan or DataPlan(env.world_size, cfg.train.accumulate_steps)
    source = parts.train_data
    batches = source.batch_sampler
    if cfg.train.group_by_length:
        batches = LengthGrouped(lengths_of(source.dataset), cfg.train.batch_size, cfg.train.shuffle,
                                cfg.train.drop_last, cfg.train.seed)
    if not source.gathers(cfg.data.batched):     # a dataset's own batch() seeds its own draws
        source = dataclasses.replace(source, dataset=SeededSamples(source.dataset, cfg.train.seed))
    sampler = PlannedBatchSampler(source.dataset, cfg.train.batch_size, plan, env.global_rank,
                                  env.world_size, cfg.train.shuffle, cfg.train.drop_last, batches,
                                  agree if source.batch_sampler is not None else None)
    return source.loader(sampler, parts.feed, cfg.data.num_workers, cfg.data.batched,
                         env.job_dir), sampler
