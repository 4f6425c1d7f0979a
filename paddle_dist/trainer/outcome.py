"""What a run leaves behind and says at its ends: config.yaml as it ran, the start lines,
how a rank ended (one line in its log), metrics.json and the run's last lines.

Example:
    outcome.begin(run_dir, cfg, env, parts, record)      # rank 0: config.yaml, classes.json
    ...
    outcome.finish(log, result, run_dir, cfg, env, parts)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .. import config as configlib
from ..config import Config
from ..data import registry
from ..runs import report
from ..runs.layout import Run
from ..runtime.env import DistEnv
from ..schema import MODEL_TASKS
from ..security import private
from ..errors import PeerFailure
from . import progress as progress_log, schedule, streams
from .parts import Parts, Result
from .selection import Best

# How each way of starting a job is written in dist.launcher (others keep the config's).
LAUNCHERS = {"paddle_launch": "launch", "spawn": "spawn", "openmpi": "mpirun"}


def as_ran(cfg: Config, env: DistEnv) -> Config:
    """The config as this job ran, so that `train.py -c <run>/config.yaml` repeats it: its
    ranks per machine, machines, master and launcher, whoever started it (a bare
    `paddle.distributed.launch` leaves dist.nprocs unset), and no run directory (a repeat
    is a new run)."""
    return configlib.derived(cfg, {
        "output.run_dir": "", "dist.nprocs": env.local_world_size, "dist.nnodes": env.nnodes,
        "dist.node_rank": 0, "dist.master": cfg.dist.master or (env.master if env.nnodes > 1 else ""),
        "dist.launcher": LAUNCHERS.get(env.launcher, cfg.dist.launcher)})


def begin(run_dir: Path, cfg: Config, env: DistEnv, parts: Parts, record: Optional[dict]) -> None:
    """Rank 0 writes the config as it runs (with a fit() run's record) and the class names."""
    if env.is_main:
        configlib.dump(as_ran(cfg, env), Run(run_dir).config, fit=record)
        if parts.classes:
            private.write_text(Run(run_dir).classes, json.dumps(parts.classes))


def start_lines(log, parts: Parts, cfg: Config, env: DistEnv, engine, prepared, first, run_dir: Path,
                resumed) -> None:
    """What the run is about to do: ranks, device, sync, data and steps; the learning rate;
    what evaluation computes (`first`: what the check before epoch 1 found); mixed precision."""
    log.info(f"paddle_dist: {env.world_size} rank(s) via {env.launcher}, device {env.device}, "
             f"backend {env.backend}, api {cfg.train.api}, {engine.sync.describe()}, "
             f"{_data(parts.train_data)}, {prepared.per_epoch} steps/epoch, run dir {run_dir}")
    log.info(f"paddle_dist: {prepared.lr_text}")
    if prepared.as_batch_norm:
        log.info(f"paddle_dist: SyncBatchNorm layers ({', '.join(map(repr, prepared.as_batch_norm[:3]))}) run "
                 "as BatchNorm: Paddle has no CPU kernel for them, and on one rank the math is the same")
    if parts.eval_data is not None:
        log.info(f"paddle_dist: evaluation: {parts.feed.eval_rule(cfg.train.eval_loss, first.eval_returns_loss)}")
    sized = schedule.length_warning(prepared.optimizer._learning_rate, cfg.train.scheduler_every,
                                    prepared.per_epoch, prepared.limit)
    if sized and prepared.lr_policy is None and env.is_main:
        log.warning(f"paddle_dist: {sized}")
    precision = engine.precision
    if engine.scaler is not None and resumed.path and not resumed.scaler_state:
        log.warning(f"checkpoint {resumed.path} holds no loss scaler state: the scale starts again "
                    f"from train.loss_scale={precision.loss_scale:g}")
    if precision.enabled:
        log.info(f"paddle_dist: mixed precision {precision.level} in {precision.dtype}"
                 + (f", dynamic loss scale from {precision.loss_scale:g}" if precision.loss_scale else ""))


def _data(source) -> str:
    """The training data in the start line."""
    if not source.stream:
        return f"{len(source)} training samples"
    if streams.sharded(source.dataset):
        return f"a stream of {len(list(source.dataset.shards()))} shards"
    return "a stream"


def say_ending(exc: BaseException, state: str, log, env: DistEnv, parts: Parts, run_dir: Path,
               step: int) -> None:
    """One line for a rank that ended by `exc` (its `state`, errors.outcome_of), where it
    belongs: the launcher, if any, says an interruption and a divergence on the console."""
    if isinstance(exc, KeyboardInterrupt):
        if not env.supervised and env.is_main:
            log.warning(f"interrupted at step {step}")
    elif state == "diverged":
        if not (env.supervised and progress_log.prints(env)):
            log.error(f"paddle_dist: {exc}")
    elif state != "preempted":
        # fit()'s refusal of the script's input prints its own line (errors.for_scripts):
        # on the console once, in the rank's log file here.
        quiet = {"console": False} if state == "refused" and parts.own else None
        log.error(f"rank {env.global_rank} {state}: {type(exc).__name__}: {exc}".rstrip(": "), extra=quiet)
    if isinstance(exc, PeerFailure) and env.is_main and not env.supervised:
        report.explain_from_rank(run_dir)


def finish(log, result: Result, run_dir: Path, cfg: Config, env: DistEnv, parts: Parts) -> None:
    """Rank 0: metrics.json and the run's last lines; the first rank of another machine:
    that machine's end."""
    if env.is_main:
        write_metrics(run_dir, result, cfg, env)
        _summary(log, result, run_dir, cfg)
        built_in = parts.name in MODEL_TASKS       # not a fit() of the user's own model
        if built_in and registry.get(cfg.data.name).images and not configlib.evaluates_only(cfg):
            log.info(f"to deploy it: python -m paddle_dist.export {run_dir}  (docs/deploy.md)")
    elif progress_log.prints(env):
        log.info(f"finished: {result.steps} steps, {result.samples_per_s:,.0f} samples/s, "
                 f"{result.wall_time_s:.1f} s; this machine's logs and status in {run_dir}")


def write_metrics(run_dir: Path, result: Result, cfg: Config, env: DistEnv) -> None:
    last = result.metrics
    metrics = {
        "test_accuracy": last.get("eval_accuracy"),
        "test_loss": last.get("eval_loss"),
        "test_samples": last.get("eval_count"),
        # Every evaluation metric by its name (the loss, accuracy or fit()'s metrics).
        "test_metrics": {k[5:]: v for k, v in last.items() if k.startswith("eval_") and k != "eval_count"},
        "final_loss": last.get("train_loss"),
        "samples_per_s": result.samples_per_s,
        "tokens_per_s": result.tokens_per_s,      # the loss's count per second; None: it has none
        "wall_time_s": result.wall_time_s,
        "first_step_at": result.first_step_at,     # Unix time, for start-up measurements
        "steps": result.steps,
        "world_size": env.world_size,
        "api": cfg.train.api,
        "history": result.history,
    }
    if configlib.evaluates_only(cfg):
        metrics.update(eval_only=True, checkpoint=result.resumed_from)
    for key in ("test_accuracy", "test_loss", "test_samples", "tokens_per_s"):     # what does not apply is left out
        if metrics[key] is None:
            del metrics[key]
    path = Run(run_dir).metrics
    tmp = path.with_suffix(".json.tmp")
    private.write_text(tmp, json.dumps(metrics, indent=1))
    tmp.replace(path)


def _summary(log, result: Result, run_dir: Path, cfg: Config) -> None:
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
    tokens = f", {result.tokens_per_s:,.0f} tokens/s" if result.tokens_per_s else ""
    log.info(f"{result.samples_per_s:,.0f} samples/s{tokens}, {result.wall_time_s:.1f} s; outputs in {run_dir}")

