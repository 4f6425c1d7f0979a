"""The trainer: `fit()` for users' own parts, `train()` for the built-in jobs.

Both API levels (`train.api: loop | hapi`) run behind the same progress, exact
evaluation, checkpoints and metrics, so a script behaves the same standalone, under
`paddle.distributed.launch` and under `spawn`.

Example (a user's own model; run it as is, or under `python -m paddle_dist.launch --nprocs 2`):
    import paddle, paddle_dist
    cfg = paddle_dist.config.load(overrides=["train.api=hapi", "train.epochs=2"])
    paddle_dist.setup(cfg)                     # device + process group + seed, first
    net = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(784, 10))
    result = paddle_dist.fit(net, train_ds, eval_ds, config=cfg)
    print(result.metrics["eval_accuracy"])
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import paddle
from paddle.optimizer.lr import LRScheduler, ReduceOnPlateau

from .. import errors
from . import amp, progress as progress_log
from .. import checkpoint
from ..sync import collectives
from ..runtime import monitor as rank_monitor, process
from ..runs import report, rundir
from ..runs.layout import Run
from ..data import registry
from ..schema import MODEL_TASKS
from .. import config as configlib
from ..errors import ConfigError
from .schedule import LrPolicy
from ..sync import GradSync, PeerFailure, agree_on_layout, check_optimizer, resolve_mode
from ..sync.batchstats import BatchStats, sync_batch_norm_on_cpu
from . import callbacks as callbacklib
from . import firstbatch, hapi, loop
from . import randomness, sampling, schedule
from .common import Parts, Position, Result, make_optimizer
from .session import Session, SessionSetup
from .resuming import batches_at, resume
from ..security import private
from .sampling import DataPlan, epochs_for, steps_per_epoch, total_steps
from .evaluation import evaluate, gather, metric_names
from .own import fit, fit_record
from .selection import Best
from ..runtime.env import DistEnv

__all__ = ["Parts", "Result", "fit", "train"]

TRAINERS = {"loop": loop, "hapi": hapi}
# How each way of starting a job is written in dist.launcher (others keep the config's).
LAUNCHERS = {"paddle_launch": "launch", "spawn": "spawn", "openmpi": "mpirun"}


@dataclass
class Prepared:
    """What a job decides before it creates anything on disk (so that a refusal leaves
    nothing behind): its optimizer, steps and lr policy, and a fit() run's record."""

    optimizer: paddle.optimizer.Optimizer
    per_epoch: int                    # optimizer steps per epoch
    limit: int                        # optimizer steps in all
    lr_policy: Optional[LrPolicy]
    lr_text: str                      # the rate in plain words, for the start line
    base_lr: float                    # the optimizer's rate before any checkpoint is loaded
    record: Optional[dict]            # fit(): model, parameters, optimizer, data (fit_record)
    as_batch_norm: Tuple[str, ...] = ()   # SyncBatchNorm layers run as BatchNorm (one rank, CPU)


def train(parts: Parts, cfg: configlib.Config, env: DistEnv) -> Result:
    """Run one job on this rank; rank 0 writes config.yaml and metrics.json to the run dir.

    Raises `PeerFailure` when another rank fails and `Preempted` after a requested stop
    (the checkpoint is saved by then); every rank records its outcome in <run>/status/.
    """
    started = time.perf_counter()
    precision = amp.plan(cfg.train, env.device)   # a mode this device cannot run: no run dir
    prepared = _prepare(parts, cfg, env, precision)
    cfg = _epochs_of_steps(cfg, prepared.per_epoch)
    run_dir = process.make_run_dir(cfg, env, {"fit": prepared.record} if prepared.record else None)
    try:
        return _monitored(parts, cfg, env, run_dir, precision, prepared, started)
    finally:
        rundir.release(run_dir)   # a process that fits again may choose this run


def _epochs_of_steps(cfg: configlib.Config, per_epoch: int):
    """With train.max_steps (steps, as suites count them), train.epochs becomes the epochs
    those steps fill at `per_epoch` optimizer steps an epoch: the run's, which a
    continuation on another number of ranks replans (_replanned)."""
    if not cfg.train.max_steps or configlib.evaluates_only(cfg):
        return cfg
    return configlib.replace_key(cfg, "train.epochs", epochs_for(cfg, per_epoch))


def _prepare(parts: Parts, cfg: configlib.Config, env: DistEnv, precision: amp.AmpPlan) -> Prepared:
    if configlib.evaluates_only(cfg) and parts.eval_data is None:
        raise ConfigError("evaluating only needs a test set: pass eval_data to fit()")
    _check_monitor(parts, cfg)
    replaced = tuple(sync_batch_norm_on_cpu(parts.model, env.device, env.world_size))
    optimizer = make_optimizer(parts.optimizer, parts.model.parameters())
    check_optimizer(optimizer, parts.model, resolve_mode(cfg.sync.mode, env.device, cfg.sync.compress,
                                                         cfg.sync.bucket_mb, cfg.sync.transport))
    record = fit_record(parts, optimizer) if parts.own else None
    parts.model, optimizer = amp.decorate(parts.model, optimizer, precision)
    agree_on_layout(optimizer, parts.model, env)
    micro = steps_per_epoch(len(parts.train_data), cfg.train.batch_size, env.world_size,
                            cfg.train.drop_last)
    per_epoch = -(-micro // cfg.train.accumulate_steps)     # optimizer steps
    limit = total_steps(cfg, per_epoch)
    policy, text = (None, "") if configlib.evaluates_only(cfg) else \
        _lr_policy(cfg, env, optimizer, per_epoch, limit, parts.callbacks)
    return Prepared(optimizer, per_epoch, limit, policy, text, float(optimizer.get_lr()), record, replaced)


def _check_monitor(parts: Parts, cfg: configlib.Config) -> None:
    """Refuse a checkpoint.monitor that the job never logs (a typo would silently leave
    it with no best checkpoint and no early stop); the default may go unlogged."""
    monitor = cfg.checkpoint.monitor
    logged = {"train_loss"}
    if parts.eval_data is not None:
        names = metric_names(parts.metrics) or (["accuracy"] if parts.task == "classification" else [])
        logged |= {"eval_loss", *(f"eval_{name}" for name in names)} if cfg.train.eval_loss else \
            {f"eval_{name}" for name in names}
    if monitor != configlib.Config().checkpoint.monitor and monitor not in logged:
        raise ConfigError(f"checkpoint.monitor={monitor} is not logged by this job; it logs "
                          f"{', '.join(sorted(logged))}")


def _monitored(parts: Parts, cfg: configlib.Config, env: DistEnv, run_dir: Path, precision: amp.AmpPlan,
               prepared: Prepared, started: float) -> Result:
    """train() in its run directory: status records, the run, config.yaml and metrics.json."""
    log = progress_log.setup(run_dir, env)
    if env.is_main:
        configlib.dump(_as_ran(cfg, env), Run(run_dir).config, fit=prepared.record)
        if parts.classes:
            private.write_text(Run(run_dir).classes, json.dumps(parts.classes))
    monitor = rank_monitor.Monitor(env, run_dir, cfg.dist.hang_timeout, cfg.faults.inject)
    with monitor.running(), collectives.watched(monitor.phase):
        try:
            result = _run(parts, cfg, env, run_dir, monitor, log, precision, prepared)
        except BaseException as exc:
            state = errors.outcome_of(exc)
            monitor.finish(state, exc)
            if isinstance(exc, KeyboardInterrupt):     # the launcher, if any, says it once
                if not env.supervised and env.is_main:
                    log.warning(f"interrupted at step {monitor.step_no}")
            elif state == "diverged":        # one line; on the console the launcher, if any, says it
                if not (env.supervised and progress_log.prints(env)):
                    log.error(f"paddle_dist: {exc}")
            elif state != "preempted":
                # fit()'s refusal of the script's input prints its own line (errors.for_scripts):
                # on the console once, in the rank's log file here.
                quiet = {"console": False} if state == "refused" and parts.own else None
                log.error(f"rank {env.global_rank} {state}: {type(exc).__name__}: {exc}".rstrip(": "),
                          extra=quiet)
            if isinstance(exc, PeerFailure) and env.is_main and not env.supervised:
                report.explain_from_rank(run_dir)
            raise
        # The digest lets anyone check that every rank ended with the same weights.
        monitor.finish("done", weights_sha256=checkpoint.weights_digest(parts.model))
    result.wall_time_s = time.perf_counter() - started
    if env.is_main:
        _write_metrics(run_dir, result, cfg, env)
        _summary(log, result, run_dir, cfg)
        built_in = parts.name in MODEL_TASKS       # not a fit() of the user's own model
        if built_in and registry.get(cfg.data.name).images and not configlib.evaluates_only(cfg):
            log.info(f"to deploy it: python -m paddle_dist.export {run_dir}  (docs/deploy.md)")
    elif progress_log.prints(env):   # the first rank of another machine: that machine's end
        log.info(f"finished: {result.steps} steps, {result.samples_per_s:,.0f} samples/s, "
                 f"{result.wall_time_s:.1f} s; this machine's logs and status in {run_dir}")
    return result


def _as_ran(cfg: configlib.Config, env: DistEnv) -> configlib.Config:
    """The config as this job ran, so that `train.py -c <run>/config.yaml` repeats it: its
    ranks per machine, machines, master and launcher, whoever started it (a bare
    `paddle.distributed.launch` leaves dist.nprocs unset), and no run directory (a repeat
    is a new run)."""
    return configlib.derived(cfg, {
        "output.run_dir": "", "dist.nprocs": env.local_world_size, "dist.nnodes": env.nnodes,
        "dist.node_rank": 0, "dist.master": cfg.dist.master or (env.master if env.nnodes > 1 else ""),
        "dist.launcher": LAUNCHERS.get(env.launcher, cfg.dist.launcher)})


def _run(parts: Parts, cfg: configlib.Config, env: DistEnv, run_dir: Path, monitor, log,
         amp_plan: amp.AmpPlan, prepared: Prepared) -> Result:
    optimizer = prepared.optimizer
    digest = configlib.config_hash(cfg.to_dict())
    found = resume(parts, cfg, env, run_dir, optimizer, digest, log)
    start, history, resumed, averaged, meta = found.start, found.history, found.path, found.averaged, found.meta
    scaled = meta.get("loss_scaler")
    if found.plan != DataPlan(env.world_size, cfg.train.accumulate_steps):   # the run's steps, not the config's
        cfg, prepared = _replanned(parts, cfg, env, prepared, found.plan, log)
    _agree_on_metrics(parts, env, monitor.phase)
    firstbatch.check(parts, cfg, env, amp_plan, train=not configlib.evaluates_only(cfg))
    if configlib.evaluates_only(cfg):            # no gradients: no sync to open
        return _evaluate_only(parts, cfg, env, run_dir, monitor, log, start, resumed, amp_plan)
    grad_sync = GradSync.from_config(env, cfg.sync, monitor.phase, monitor.want_stop,
                                     cfg.train.accumulate_steps)
    # BatchNorm's per-channel sums travel with the gradients where the transport can.
    batch_stats = BatchStats(parts.model, env, monitor.phase)
    grad_sync.attach(optimizer, parts.model, batch_stats.ride_with(grad_sync))
    per_epoch, limit, lr_policy = prepared.per_epoch, prepared.limit, prepared.lr_policy
    log.info(f"paddle_dist: {env.world_size} rank(s) via {env.launcher}, device {env.device}, "
             f"backend {env.backend}, api {cfg.train.api}, {grad_sync.describe()}, "
             f"{len(parts.train_data)} training samples, "
             f"{per_epoch} steps/epoch, run dir {run_dir}")
    log.info(f"paddle_dist: {prepared.lr_text}")
    if prepared.as_batch_norm:
        log.info(f"paddle_dist: SyncBatchNorm layers ({', '.join(map(repr, prepared.as_batch_norm[:3]))}) run "
                 "as BatchNorm: Paddle has no CPU kernel for them, and on one rank the math is the same")
    if parts.eval_data is not None:       # the check before epoch 1 saw what evaluation returns
        log.info(f"paddle_dist: evaluation: {parts.feed.eval_rule(cfg.train.eval_loss)}")
    sized = schedule.length_warning(optimizer._learning_rate, cfg.train.scheduler_every, per_epoch, limit)
    if sized and lr_policy is None and env.is_main:
        log.warning(f"paddle_dist: {sized}")
    progress = progress_log.Progress(env, run_dir, per_epoch, cfg.train.epochs,
                                     cfg.train.batch_size * cfg.train.accumulate_steps,
                                     cfg.train.log_every, limit, start.global_step, bool(cfg.train.max_steps))
    scaler = amp.scaler(amp_plan, grad_sync)
    if scaler is not None and scaled:
        amp.load_scaler_state(scaler, scaled)     # the scale and counters it had reached
    elif scaler is not None and resumed:
        log.warning(f"checkpoint {resumed} holds no loss scaler state: the scale starts again "
                    f"from train.loss_scale={amp_plan.loss_scale:g}")
    if amp_plan.enabled:
        log.info(f"paddle_dist: mixed precision {amp_plan.level} in {amp_plan.dtype}"
                 + (f", dynamic loss scale from {amp_plan.loss_scale:g}" if amp_plan.loss_scale else ""))
    session = Session(SessionSetup(parts=parts, cfg=cfg, env=env, run_dir=run_dir, progress=progress,
                                   monitor=monitor, sync=grad_sync, optimizer=optimizer, start=start, limit=limit,
                                   config_hash=digest, plan=found.plan, lr_policy=lr_policy,
                                   batch_stats=batch_stats, amp=amp_plan, scaler=scaler,
                                   history=tuple(history), resumed_from=resumed))
    if session.ema is not None and averaged:
        session.ema.load(averaged, meta.get("ema_updates"))     # the averages go on where they stood
    elif session.ema is not None and resumed:
        log.warning(f"checkpoint {resumed} holds no moving averages (train.ema_decay was off): "
                    "they start from its weights")
    session.best.replay(history)
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
        grad_sync.close()
    result = session.result
    result.losses, result.steps = progress.losses, session.pos.global_step
    result.samples_per_s = progress.samples_per_s
    result.comm_calls, result.sync_transport = grad_sync.calls, grad_sync.used
    return result


def _check_reached(session: Session) -> None:
    """A run is done at its last step (or an early stop, which moves the limit there), never
    before: epochs that ran out first would record a shorter run as finished."""
    if not session.done:
        raise RuntimeError(f"training ended at step {session.pos.global_step} of {session.limit}: "
                           f"its {session.cfg.train.epochs} epoch(s) ran out first; this is a bug in "
                           "paddle_dist's step count, please report it with the run's config.yaml")


def _agree_on_metrics(parts: Parts, env: DistEnv, phase) -> None:
    """Every rank must evaluate the same metrics (they exchange their results batch by
    batch); ranks given different ones are refused, all of them, in one line."""
    names = gather(metric_names(parts.metrics), env, phase)
    if any(found != names[0] for found in names):
        given = "; ".join(f"rank {rank}: {found or 'none'}" for rank, found in enumerate(names))
        raise ConfigError(f"the ranks were given different metrics ({given}); give fit() the same "
                          "metrics on every rank")


def _evaluate_only(parts: Parts, cfg: configlib.Config, env: DistEnv, run_dir: Path, monitor, log,
                   at: Position, checkpoint_path: str, precision: amp.AmpPlan) -> Result:
    """Evaluate the resumed weights on the test set (exact counts on any number of ranks)."""
    log.info(f"paddle_dist: evaluating {checkpoint_path} on {len(parts.eval_data)} test samples "
             f"with {env.world_size} rank(s); nothing is trained")
    found = evaluate(parts.model, parts.eval_data, parts.feed, parts.loss, parts.metrics, env,
                     cfg.train.eval_batch_size, parts.task, monitor.beat, monitor.phase,
                     cfg.data.batched, cfg.data.num_workers, precision, with_loss=cfg.train.eval_loss)
    metrics = {"epoch": at.epoch, **{f"eval_{k}": v for k, v in found.items()}}
    return Result(run_dir=run_dir, history=[metrics], steps=at.global_step, resumed_from=checkpoint_path)


def _lr_policy(cfg: configlib.Config, env: DistEnv, optimizer, per_epoch: int, limit: int,
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


SCHEDULER_RULES = {"step": "after every optimizer step", "epoch": "after every epoch"}


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


def _replanned(parts: Parts, cfg: configlib.Config, env: DistEnv, prepared: Prepared, plan: DataPlan, log):
    """The config and steps of a run continued on this job's ranks with its data plan:
    each rank accumulates its share of every step's micro-batches, so the global batch,
    the steps per epoch and the lr policy (a function of the global batch) stay the run's."""
    cfg = configlib.replace_key(cfg, "train.accumulate_steps", plan.per_rank(env.world_size))
    per_epoch = -(-batches_at(parts, cfg)(plan.world) // plan.accumulate)
    cfg = _epochs_of_steps(cfg, per_epoch)       # the run's steps fill the run's epochs
    limit = total_steps(cfg, per_epoch)
    policy, text = _lr_policy(cfg, env, prepared.optimizer, per_epoch, limit, parts.callbacks,
                              base=prepared.base_lr)
    drawn = randomness.describe(parts.model)
    log.info(f"paddle_dist: {sampling.describe(plan, env.world_size, cfg.train.batch_size)}"
             + (f"; {drawn}" if drawn else ""))
    return cfg, dataclasses.replace(prepared, per_epoch=per_epoch, limit=limit, lr_policy=policy, lr_text=text)


def _write_metrics(run_dir: Path, result: Result, cfg: configlib.Config, env: DistEnv) -> None:
    last = result.metrics
    metrics = {
        "test_accuracy": last.get("eval_accuracy"),
        "test_loss": last.get("eval_loss"),
        "test_samples": last.get("eval_count"),
        # Every evaluation metric by its name (the loss, accuracy or fit()'s metrics).
        "test_metrics": {k[5:]: v for k, v in last.items() if k.startswith("eval_") and k != "eval_count"},
        "final_loss": last.get("train_loss"),
        "samples_per_s": result.samples_per_s,
        "wall_time_s": result.wall_time_s,
        "first_step_at": result.first_step_at,     # Unix time, for start-up measurements
        "steps": result.steps,
        "world_size": env.world_size,
        "api": cfg.train.api,
        "history": result.history,
    }
    if configlib.evaluates_only(cfg):
        metrics.update(eval_only=True, checkpoint=result.resumed_from)
    for key in ("test_accuracy", "test_loss", "test_samples"):     # what does not apply is left out
        if metrics[key] is None:
            del metrics[key]
    path = Run(run_dir).metrics
    tmp = path.with_suffix(".json.tmp")
    private.write_text(tmp, json.dumps(metrics, indent=1))
    tmp.replace(path)


def _summary(log, result: Result, run_dir: Path, cfg: configlib.Config) -> None:
    last = result.metrics
    if "eval_accuracy" in last:
        log.info(f"test accuracy {last['eval_accuracy']:.4f} on {int(last['eval_count'])} samples")
    elif "eval_loss" in last:
        others = "".join(f", {k[5:]} {v:.4f}" for k, v in last.items() if k.startswith("eval_")
                         and k not in ("eval_loss", "eval_count") and isinstance(v, float))
        log.info(f"test loss {last['eval_loss']:.6f}{others} on {int(last['eval_count'])} samples")
    best = Best(cfg.checkpoint.monitor).replay(result.history)
    if best.value is not None and len(result.history) > 1:
        kept = f"; its checkpoint is {run_dir / 'best'}" if cfg.checkpoint.save_best else ""
        log.info(f"{best.describe()} of {sum(cfg.checkpoint.monitor in h for h in result.history)} evaluations{kept}")
    log.info(f"{result.samples_per_s:,.0f} samples/s, {result.wall_time_s:.1f} s; outputs in {run_dir}")
