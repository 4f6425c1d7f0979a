"""The trainer's composition root: `train()` runs one job on this rank, at either API level.

Before the run directory exists, what can be refused is decided (prepare.py); in it, the
rank records how it ends (runtime/monitor.py), resumes (state.py: one record), checks its
first batches (firstbatch.py), builds the distributed step (engine.py) and the Session
(session.py) from what it found, and hands the Session to the loop or hapi trainer;
outcome.py writes what the run leaves behind and says.

Example (a user's own model; run it as is, or under `python -m paddle_dist.launch --nprocs 2`):
    import paddle, paddle_dist
    cfg = paddle_dist.config.load(overrides=["train.api=hapi", "train.epochs=2"])
    paddle_dist.setup(cfg)                     # device + process group + seed, first
    net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 10))
    result = paddle_dist.fit(net, train_ds, eval_ds, config=cfg)
    print(result.metrics["eval_accuracy"])
"""

from __future__ import annotations

import time
from pathlib import Path

from .. import checkpoint, errors
from .. import config as configlib
from ..config import Config
from ..runs import rundir
from ..runtime import monitor as rank_monitor, process
from ..runtime.env import DistEnv
from ..sync import GradSync, collectives
from . import amp, callbacks as callbacklib, firstbatch, hapi, loop, outcome, selection, streamplan
from . import progress as progress_log
from .engine import Engine
from .evaluation import all_reduce_sum, evaluate_only, gather
from .ledger import LossLedger
from .own import fit
from .parts import Parts, Result
from .prepare import Prepared, epochs_of_steps, prepare, replanned
from .sampling import DataPlan, train_loader
from .session import Session, SessionSetup
from .state import resume
from .weighting import ignore_index_of

__all__ = ["Parts", "Result", "fit", "train"]

TRAINERS = {"loop": loop, "hapi": hapi}


def train(parts: Parts, cfg: Config, env: DistEnv) -> Result:
    """Run one job on this rank; rank 0 writes config.yaml and metrics.json to the run dir.

    Raises `PeerFailure` when another rank fails and `Preempted` after a requested stop
    (the checkpoint is saved by then); every rank records its outcome in <run>/status/.
    """
    started = time.perf_counter()
    precision = amp.plan(cfg.train, env.device)   # a mode this device cannot run: no run dir
    prepared = prepare(parts, cfg, env, precision)
    cfg = epochs_of_steps(cfg, prepared.per_epoch)
    run_dir = process.make_run_dir(cfg, env, {"fit": prepared.record} if prepared.record else None)
    try:
        return _monitored(parts, cfg, env, run_dir, precision, prepared, started)
    finally:
        rundir.release(run_dir)   # a process that fits again may choose this run


def _monitored(parts: Parts, cfg: Config, env: DistEnv, run_dir: Path, precision: amp.AmpPlan,
               prepared: Prepared, started: float) -> Result:
    """train() in its run directory: status records, the run, config.yaml and metrics.json."""
    log = progress_log.setup(run_dir, env)
    outcome.begin(run_dir, cfg, env, parts, prepared.record)
    monitor = rank_monitor.Monitor(env, run_dir, cfg.dist.hang_timeout, cfg.faults.inject)
    with monitor.running(), collectives.watched(monitor.phase):
        try:
            result = _run(parts, cfg, env, run_dir, monitor, log, precision, prepared)
        except BaseException as exc:
            state = errors.outcome_of(exc)
            monitor.finish(state, exc)
            outcome.say_ending(exc, state, log, env, parts, run_dir, monitor.step_no)
            raise
        # The digest lets anyone check that every rank ended with the same weights.
        monitor.finish("done", weights_sha256=checkpoint.weights_digest(parts.model))
    result.wall_time_s = time.perf_counter() - started
    outcome.finish(log, result, run_dir, cfg, env, parts)
    return result


def _run(parts: Parts, cfg: Config, env: DistEnv, run_dir: Path, monitor, log, precision: amp.AmpPlan,
         prepared: Prepared) -> Result:
    digest = configlib.config_hash(cfg.to_dict())
    found = resume(parts, cfg, env, run_dir, prepared.optimizer, digest, log)
    if found.plan != DataPlan(env.world_size, cfg.train.accumulate_steps):   # the run's steps, not the config's
        cfg, prepared = replanned(parts, cfg, env, prepared, found.plan, log)
    selection.agree_on_metrics(parts, env, monitor.phase)
    first = firstbatch.check(parts, cfg, env, precision, train=not configlib.evaluates_only(cfg))
    if configlib.evaluates_only(cfg):            # no gradients: no sync to open
        return evaluate_only(parts, cfg, env, run_dir, monitor, log, found, precision)
    sync = GradSync.from_config(env, cfg.sync, monitor.phase, monitor.want_stop, cfg.train.accumulate_steps)
    engine = Engine(parts.model, prepared.optimizer, env, sync, precision, found.scaler_state,
                    ignore_index_of(cfg.train))
    outcome.start_lines(log, parts, cfg, env, engine, prepared, first, run_dir, found)
    ledger = LossLedger()
    progress = progress_log.Progress(env, run_dir, prepared.per_epoch, cfg.train.epochs,
                                     cfg.train.batch_size * cfg.train.accumulate_steps, cfg.train.log_every,
                                     prepared.limit, found.start.global_step, bool(cfg.train.max_steps), ledger,
                                     lambda value: float(all_reduce_sum([value], env, monitor.phase)[0]) / env.world_size)
    gathered = lambda mine: gather(mine, env, monitor.phase)   # noqa: E731 - the ranks' data agree
    if parts.train_data.stream:       # its lanes' positions, gathered from every rank at a checkpoint
        loader, sampler = streamplan.train_loader(parts, cfg, env, found.plan, found.meta, gathered)
    else:
        loader, sampler = train_loader(parts, cfg, env, found.plan, gathered)
    session = Session(SessionSetup(parts=parts, cfg=cfg, env=env, run_dir=run_dir, progress=progress,
                                   ledger=ledger, monitor=monitor, engine=engine, optimizer=prepared.optimizer,
                                   resumed=found, limit=prepared.limit, config_hash=digest, loader=loader,
                                   sampler=sampler, first=first, lr_policy=prepared.lr_policy))
    try:
        if not session.done:
            session.events.train_begin()
            TRAINERS[cfg.train.api].run(session)
            _check_reached(session)
            session.events.train_end(callbacklib.hapi_logs(session.result.metrics, "eval_"))
        # The ranks compare their final weights (as at every checkpoint: once a step), before
        # session.close() has rank 0 wait for its checkpoint writes: the others must not
        # wait for those inside a collective (gloo gives up after 30 s).
        session.check_weights(session.pos.global_step)
    finally:
        progress.close()
        session.close()
        engine.close()
    result = session.result
    result.losses, result.steps, result.samples_per_s = ledger.losses, session.pos.global_step, progress.samples_per_s
    result.tokens_per_s = progress.tokens_per_s
    result.comm_calls, result.sync_transport = sync.calls, sync.used
    return result


def _check_reached(session: Session) -> None:
    """A run is done at its last step (or an early stop, which moves the limit there), never
    before: epochs that ran out first would record a shorter run as finished."""
    if not session.done:
        raise RuntimeError(f"training ended at step {session.pos.global_step} of {session.limit}: "
                           f"its {session.cfg.train.epochs} epoch(s) ran out first; this is a bug in "
                           "paddle_dist's step count, please report it with the run's config.yaml")

