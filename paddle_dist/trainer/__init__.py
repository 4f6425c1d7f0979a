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

import json
import time
from pathlib import Path
from typing import Callable, Optional, Union

import paddle

from .. import config as configlib
from .. import logger, runtime
from . import hapi, loop
from .common import (EpochEnd, Parts, Result, default_loss, optimizer_factory, steps_per_epoch,
                     total_steps)

TRAINERS = {"loop": loop, "hapi": hapi}


def fit(model: paddle.nn.Layer, train_data: paddle.io.Dataset,
        eval_data: Optional[paddle.io.Dataset] = None, loss: Optional[Callable] = None,
        optimizer=None, config: Union[None, str, configlib.Config] = None,
        task: str = "classification") -> Result:
    """Train `model` data-parallel on whatever processes this job has.

    `optimizer` is an Optimizer or a factory `fn(parameters) -> Optimizer` (default: the
    config's); `loss` defaults to cross-entropy (classification) or MSE (regression).
    """
    if config is None:
        cfg = configlib.Config()
        cfg.output.name = "run"
    else:
        cfg = config if isinstance(config, configlib.Config) else configlib.load(config)
    env = runtime.setup(cfg)
    loss = loss or default_loss(task)
    if optimizer is None:
        optimizer = optimizer_factory(cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay)
    return train(Parts(model, train_data, eval_data, loss, optimizer, task), cfg, env)


def train(parts: Parts, cfg: configlib.Config, env) -> Result:
    """Run one job on this rank; rank 0 writes config.yaml and metrics.json to the run dir."""
    started = time.perf_counter()
    run_dir = runtime.make_run_dir(cfg, env)
    log = logger.setup(run_dir, env)
    if env.is_main:
        # Without its run_dir, the saved config repeats the run into a new directory.
        configlib.dump(configlib.replace_key(cfg, "output.run_dir", ""), run_dir / "config.yaml")
    per_epoch = steps_per_epoch(len(parts.train_data), cfg.train.batch_size, env.world_size,
                                cfg.train.drop_last)
    limit = total_steps(cfg, per_epoch)
    log.info(f"paddle_dist: {env.world_size} rank(s) via {env.launcher}, device {env.device}, "
             f"backend {env.backend}, api {cfg.train.api}, {len(parts.train_data)} training samples, "
             f"{per_epoch} steps/epoch, run dir {run_dir}")
    progress = logger.Progress(env, run_dir, per_epoch, cfg.train.epochs, cfg.train.batch_size,
                               cfg.train.log_every, limit)
    result = Result(run_dir=run_dir)
    epoch_end = EpochEnd(parts, cfg, env, run_dir, progress, result)
    try:
        TRAINERS[cfg.train.api].run(parts, cfg, env, progress, epoch_end, limit)
    finally:
        progress.close()
    result.losses, result.steps = progress.losses, progress.step_count
    result.samples_per_s = progress.samples_per_s
    result.wall_time_s = time.perf_counter() - started
    if env.is_main:
        _write_metrics(run_dir, result, cfg, env)
        _summary(log, result, run_dir)
    return result


def _write_metrics(run_dir: Path, result: Result, cfg, env) -> None:
    last = result.metrics
    metrics = {
        "test_accuracy": last.get("eval_accuracy"),
        "test_loss": last.get("eval_loss"),
        "test_samples": last.get("eval_count"),
        "final_loss": last.get("train_loss"),
        "samples_per_s": result.samples_per_s,
        "wall_time_s": result.wall_time_s,
        "steps": result.steps,
        "world_size": env.world_size,
        "api": cfg.train.api,
        "history": result.history,
    }
    path = Path(run_dir) / "metrics.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=1))
    tmp.replace(path)


def _summary(log, result: Result, run_dir: Path) -> None:
    last = result.metrics
    if "eval_accuracy" in last:
        log.info(f"test accuracy {last['eval_accuracy']:.4f} on {int(last['eval_count'])} samples")
    elif "eval_loss" in last:
        log.info(f"test loss {last['eval_loss']:.6f} on {int(last['eval_count'])} samples")
    log.info(f"{result.samples_per_s:,.0f} samples/s, {result.wall_time_s:.1f} s; outputs in {run_dir}")
