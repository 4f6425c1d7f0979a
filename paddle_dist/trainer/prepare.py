"""What a job decides before its run directory exists, so that a refusal leaves nothing
behind: the optimizer (AMP-decorated, checked against the sync mode, its layout agreed by
the ranks), the run's steps (counted once, sampling.optimizer_steps) and its lr policy.
A run continued with an earlier attempt's data plan is planned again from that plan
(`replanned`): its steps, epochs and lr policy are the run's, not this attempt's.

Example:
    prepared = prepare(parts, cfg, env, precision)
    prepared.per_epoch, prepared.limit          # 32, 64
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple

import paddle
from paddle.optimizer.lr import LRScheduler, ReduceOnPlateau

from . import amp, sampling, selection
from .. import config as configlib
from ..config import Config
from ..errors import ConfigError
from ..runtime.env import DistEnv
from ..sync import agree_on_layout, check_optimizer, resolve_mode
from ..sync.batchstats import sync_batch_norm_on_cpu
from .optim import make_optimizer
from .own import fit_record
from .parts import Parts
from .randomness import describe as describe_randomness
from .sampling import DataPlan, check_data, epochs_for, steps_of, total_steps
from .schedule import LrPolicy

SCHEDULER_RULES = {"step": "after every optimizer step", "epoch": "after every epoch"}


@dataclass(frozen=True)
class Prepared:
    """What a job decides before it creates anything on disk: its optimizer, steps and lr
    policy, and a fit() run's record."""

    optimizer: paddle.optimizer.Optimizer
    per_epoch: int                    # optimizer steps per epoch
    limit: int                        # optimizer steps in all
    lr_policy: Optional[LrPolicy]
    lr_text: str                      # the rate in plain words, for the start line
    base_lr: float                    # the optimizer's rate before any checkpoint is loaded
    record: Optional[dict]            # fit(): model, parameters, optimizer, data (fit_record)
    as_batch_norm: Tuple[str, ...] = ()   # SyncBatchNorm layers run as BatchNorm (one rank, CPU)


def prepare(parts: Parts, cfg: Config, env: DistEnv, precision: amp.AmpPlan) -> Prepared:
    """The optimizer, steps and lr policy of this job on its own ranks (module docstring)."""
    if configlib.evaluates_only(cfg) and parts.eval_data is None:
        raise ConfigError("evaluating only needs a test set: pass eval_data to fit()")
    selection.check_monitor(parts, cfg)
    if not configlib.evaluates_only(cfg):
        check_data(parts.train_data, cfg)
    replaced = tuple(sync_batch_norm_on_cpu(parts.model, env.device, env.world_size))
    optimizer = make_optimizer(parts.optimizer, parts.model.parameters())
    check_optimizer(optimizer, parts.model, resolve_mode(cfg.sync.mode, env.device, cfg.sync.compress,
                                                         cfg.sync.bucket_mb, cfg.sync.transport))
    record = fit_record(parts, optimizer) if parts.own else None
    parts.model, optimizer = amp.decorate(parts.model, optimizer, precision)
    agree_on_layout(optimizer, parts.model, env)
    per_epoch = steps_of(parts.train_data, cfg, DataPlan(env.world_size, cfg.train.accumulate_steps))
    limit = total_steps(cfg, per_epoch)
    policy, text = (None, "") if configlib.evaluates_only(cfg) else \
        lr_policy(cfg, env, optimizer, per_epoch, limit, parts.callbacks)
    return Prepared(optimizer, per_epoch, limit, policy, text, float(optimizer.get_lr()), record, replaced)


def epochs_of_steps(cfg: Config, per_epoch: int) -> Config:
    """With train.max_steps (steps, as suites count them), train.epochs becomes the epochs
    those steps fill at `per_epoch` optimizer steps an epoch: the run's, which a
    continuation on another number of ranks plans again (`replanned`)."""
    if not cfg.train.max_steps or configlib.evaluates_only(cfg):
        return cfg
    return configlib.replace_key(cfg, "train.epochs", epochs_for(cfg, per_epoch))


def replanned(parts: Parts, cfg: Config, env: DistEnv, prepared: Prepared, plan: DataPlan,
              log) -> Tuple[Config, Prepared]:
    """The config and steps of a run continued on this job's ranks with its data plan:
    each rank accumulates its share of every step's micro-batches, so the global batch,
    the steps per epoch, the epochs of train.max_steps and the lr policy (a function of
    the global batch) stay the run's."""
    cfg = configlib.replace_key(cfg, "train.accumulate_steps", plan.per_rank(env.world_size))
    per_epoch = steps_of(parts.train_data, cfg, plan)
    cfg = epochs_of_steps(cfg, per_epoch)       # the run's steps fill the run's epochs
    limit = total_steps(cfg, per_epoch)
    policy, text = lr_policy(cfg, env, prepared.optimizer, per_epoch, limit, parts.callbacks,
                             base=prepared.base_lr)
    drawn = describe_randomness(parts.model)
    log.info(f"paddle_dist: {sampling.describe(plan, env.world_size, cfg.train.batch_size)}"
             + (f"; {drawn}" if drawn else ""))
    return cfg, dataclasses.replace(prepared, per_epoch=per_epoch, limit=limit, lr_policy=policy, lr_text=text)


def lr_policy(cfg: Config, env: DistEnv, optimizer, per_epoch: int, limit: int,
              callbacks=(), base: Optional[float] = None) -> Tuple[Optional[LrPolicy], str]:
    """The lr policy when it changes anything (else the optimizer keeps its own rate), and
    the rate in plain words. An optimizer with its own LRScheduler is refused only when the
    config asks for a policy of its own; else Session steps it (train.scheduler_every), or
    a paddle.callbacks.LRScheduler among the callbacks does."""
    base = float(optimizer.get_lr()) if base is None else base
    policy = LrPolicy.from_config(cfg.train, env.world_size, per_epoch, limit, base_lr=base)
    scheduler = optimizer._learning_rate
    if policy.peak == base and not policy.varies:
        stepper = next((c for c in callbacks if isinstance(c, paddle.callbacks.LRScheduler)), None)
        if isinstance(scheduler, LRScheduler) and stepper is not None:
            return None, (f"lr from the optimizer's own {type(scheduler).__name__}, {base:g} at the "
                          f"start, stepped by paddle.callbacks.LRScheduler(by_step={stepper.by_step}, "
                          f"by_epoch={stepper.by_epoch}): a step is an optimizer step")
        if isinstance(scheduler, LRScheduler):
            return None, _own_scheduler(scheduler, base, cfg.train.scheduler_every)
        return None, f"lr {base:g}, constant"
    if isinstance(scheduler, LRScheduler):
        raise ConfigError(
            "the optimizer has its own LRScheduler, which train.lr_scaling, train.warmup_epochs "
            "and train.lr_schedule would override; set those to none/0/constant or drop the scheduler")
    return policy, policy.describe(cfg.train, env.world_size, base)


def _own_scheduler(scheduler: LRScheduler, base: float, every: str) -> str:
    """The start line for the optimizer's own LRScheduler, which the Session steps by
    train.scheduler_every at both API levels. ReduceOnPlateau is refused: its step() needs
    a metric, which neither rule passes (hapi's own LRScheduler callback fails on it too)."""
    if isinstance(scheduler, ReduceOnPlateau):
        raise ConfigError(
            "the optimizer's own ReduceOnPlateau steps on a metric, which paddle_dist does not "
            "pass to it (it steps the optimizer's LRScheduler after every step or epoch, "
            "train.scheduler_every); use a scheduler that steps without one, e.g. "
            "paddle.optimizer.lr.MultiStepDecay with train.scheduler_every=epoch")
    return (f"lr from the optimizer's own {type(scheduler).__name__}, {base:g} at the start, "
            f"stepped {SCHEDULER_RULES[every]} (train.scheduler_every={every})")

