"""Where a job starts: from scratch, or from the checkpoint `checkpoint.resume` names,
on this job's ranks (the run's data plan: sampling.py), as one record (`Resumed`).

The pieces of training state that survive a resume each save and load themselves: the
model, optimizer and random generators (checkpoint.restore, here), the position and the
epoch's loss so far (`Resumed.start`), the data plan, the history and best checkpoint
(Session: Best.replay), the EMA with its update count (Ema.load), the loss scaler
(amp.load_scaler_state, the Engine). The Session is built from the record and collects
their state again at every checkpoint (Session.meta); the checkpoint's meta.json is read
through its typed record (checkpoint.Meta) only.

Example:
    found = resume(parts, cfg, env, run_dir, optimizer, digest, log)
    found.start.global_step, found.plan        # 120, DataPlan(world=2, accumulate=1)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from ..runs.layout import Run
from .. import checkpoint
from ..checkpoint import Meta
from .. import config as configlib
from ..runtime import process
from . import sampling
from .parts import Parts, Position
from .sampling import DataPlan, batches_per_rank
from ..runtime.env import DistEnv


@dataclass(frozen=True)
class Resumed:
    """Where a job starts: from scratch, or from the checkpoint `checkpoint.resume` names."""

    start: Position
    path: Optional[str]            # the checkpoint, None from scratch
    averaged: Dict[str, Any]       # its moving averages, or {}
    meta: Optional[Meta]           # its meta.json, None from scratch
    plan: DataPlan                 # the run's data plan (trainer/sampling.py)

    @property
    def history(self) -> List[Dict[str, Any]]:
        """The run's evaluations and epochs so far."""
        return list(self.meta.history) if self.meta is not None else []

    @property
    def scaler_state(self) -> Optional[Dict[str, Any]]:
        """The loss scaler's scale and counters, if the checkpoint has them."""
        return self.meta.loss_scaler if self.meta is not None else None

    @property
    def ema_updates(self) -> Optional[int]:
        return self.meta.ema_updates if self.meta is not None else None


def resume(parts: Parts, cfg: configlib.Config, env: DistEnv, run_dir: Path, optimizer, digest: str,
           log) -> Resumed:
    """The start from `checkpoint.resume`. Evaluating only takes the averages as the
    weights, when there are. A checkpoint of another number of ranks is continued with its
    data plan, or refused (one line, before anything is loaded) when this job's ranks
    cannot share its steps evenly.

    Rank 0 alone reads the checkpoint and sends it to the other ranks, so ranks on other
    machines need neither a copy of the files nor the same run directory path."""
    def read():
        path = checkpoint.resolve_resume(cfg.checkpoint.resume, run_dir)
        return checkpoint.load(path) if path is not None else None

    state = process.from_rank0(cfg, env, read)
    if state is None:
        return Resumed(Position(), None, {}, None, DataPlan(env.world_size, cfg.train.accumulate_steps))
    path = state.path
    # Any number of ranks may continue it (its data plan) or evaluate it.
    checkpoint.check_compatible(state, None, parts.name, parts.model)
    plan = DataPlan(env.world_size, cfg.train.accumulate_steps) if configlib.evaluates_only(cfg) else \
        sampling.plan_for(state.record, env.world_size, cfg.train.accumulate_steps, batches_at(parts, cfg))
    # Evaluating draws nothing at random: the generators stay as they are, so a checkpoint
    # written on GPUs is evaluated on a CPU (or another count of GPUs) too.
    checkpoint.restore(state, parts.model, optimizer, rng=not configlib.evaluates_only(cfg))
    meta = state.record
    # Evaluating only differs in train.eval_only at least: nothing to warn about.
    if meta.config_hash not in (None, digest) and not configlib.evaluates_only(cfg) and env.is_main:
        changed = _changes(Path(path), cfg)
        log.warning(f"the config differs from the one checkpoint {path} was trained with "
                    f"({changed or 'beyond epochs, steps, logging and output'}); resuming anyway")
    log.info(f"resuming from {path}: epoch {meta.epoch + 1}, step {meta.step_in_epoch} "
             f"in it, {meta.global_step} steps done")
    start = Position(meta.epoch, meta.step_in_epoch, meta.global_step, meta.epoch_loss or (0.0, 0.0))
    if configlib.evaluates_only(cfg) and state.averaged:      # what training evaluated
        checkpoint.restore(dataclasses.replace(state, model=state.averaged), parts.model, rng=False)
    return Resumed(start, str(path), state.averaged, meta, plan)


def batches_at(parts: Parts, cfg: configlib.Config):
    """Per-rank batches of an epoch at a given world size."""
    return lambda world: batches_per_rank(parts.train_data, cfg, world)


def _changes(path: Path, cfg: configlib.Config) -> str:
    """How `cfg` differs from the config of the run that wrote checkpoint `path` (its
    <run>/config.yaml), in words; "" when that file is not there."""
    run = Run.of_checkpoint(path)
    try:
        ran = yaml.safe_load(run.config.read_text()) if run is not None else None
    except (OSError, yaml.YAMLError):
        return ""
    return configlib.config_differences(ran, cfg.to_dict()) if isinstance(ran, dict) else ""
