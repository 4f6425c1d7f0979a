"""fit(): a script's own model, data, loss, optimizer, metrics and callbacks, as
paddle.Model takes them, made into the Parts of a job (and the record of what it trains).

Example:
    result = paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer,
                             metrics=[paddle.metric.Accuracy()], callbacks=[...])
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np
import paddle
from paddle.optimizer.lr import LinearWarmup, LRScheduler

from .. import errors
from .. import config as configlib
from ..runtime import protocol
from ..runtime import process, seedorder
from ..runtime.env import detect
from ..errors import ConfigError, PeerFailure
from . import callbacks as callbacklib
from .optim import default_loss, optimizer_factory
from .parts import Parts, Result
from .sampling import DataPlan, check_data, steps_of, total_steps
from .evaluation import metric_names
from .feed import MODEL_LOSS, Feed
from .loading import Source


def fit(model: paddle.nn.Layer, train_data, eval_data=None, loss=None, optimizer=None,
        config: Union[None, str, configlib.Config] = None, task: str = "classification",
        metrics=None, callbacks=None, inputs=None, labels=None,
        split_batch: Optional[Callable] = None, epochs: Optional[int] = None,
        batch_size: Optional[int] = None, num_workers: Optional[int] = None) -> Result:
    """Train `model` data-parallel on whatever processes this job has.

    `train_data`, `eval_data`: a paddle.io.Dataset, or a paddle.io.DataLoader whose batch
    size, drop_last, shuffling, collate_fn and workers are kept (paddle_dist shards it).
    A batch is split into the model's inputs and the labels by paddle.Model's rule:
    `inputs` and `labels` (counts, or lists of paddle.static.InputSpec, whose names pick
    a dict sample's keys) default to `forward`'s arguments and the rest of the batch;
    `split_batch(batch) -> (inputs, labels)` does what the rule cannot.

    `loss` is called as `loss(*outputs, *labels)`; it defaults to cross-entropy
    (classification) or MSE (regression); `loss="model"`: the model takes the inputs and
    the labels and returns its own loss (a tensor, a tuple (loss, *outputs) or a dict
    with "loss"). `metrics`: paddle.metric.Metric objects, evaluated exactly over the
    whole eval set (logged as eval_<name>); `callbacks`: paddle.callbacks.Callback
    objects, called as paddle.Model calls them, on every rank (docs/own_model.md).
    `epochs`, `batch_size` (per rank) and `num_workers`, as paddle.Model.fit takes them,
    set train.epochs, train.batch_size and data.num_workers.

    `optimizer` is an Optimizer or a factory `fn(parameters) -> Optimizer` (default: the
    config's); it keeps the rate it was built with unless the config asks for scaling,
    warm-up or a schedule; its own LRScheduler, if any, is stepped after every optimizer
    step or every epoch (train.scheduler_every, or a paddle.callbacks.LRScheduler among
    `callbacks`). `config` defaults to the typed defaults (plus what
    `python -m paddle_dist.launch` was given).

    A requested stop (SIGTERM, SIGUSR1) saves a checkpoint and ends the process with 75,
    Ctrl+C with 130, another rank's failure with 5, each without a traceback
    (errors.Preempted, Interrupted, StoppedByPeer: SystemExits, which a script may catch).
    """
    cfg = _config_of(config)
    if cfg.output.name in ("", configlib.DEFAULT_CONFIG):
        # Not the built-in LeNet job: the run is named after the user's model (a copy:
        # the caller's config stays as it was).
        cfg = configlib.replace_key(cfg, "output.name", type(model).__name__.lower())
    model_loss = isinstance(loss, str) and loss == MODEL_LOSS
    if isinstance(loss, str) and not model_loss:
        raise ConfigError(f"fit(loss={loss!r}): give a loss function, or loss='model' for a model "
                          "that returns its own loss")
    feed = Feed(model, inputs, labels, split_batch, model_loss)
    train_source, eval_source = Source.of(train_data, "train_data"), Source.of(eval_data, "eval_data")
    for key, value in (("train.epochs", epochs), ("train.batch_size", batch_size),
                       ("data.num_workers", num_workers)):
        if value is not None:
            cfg = configlib.replace_key(cfg, key, value)
    cfg = _loader_settings(cfg, train_source, eval_source)
    metrics = _metric_list(metrics)
    if metrics and eval_source is None:
        raise ConfigError("fit(metrics=...) needs eval_data: paddle_dist computes the metrics when it "
                          "evaluates, not on training batches")
    cfg = _monitor_for(cfg, metrics, eval_source is not None)
    env = process.setup(cfg)
    if env.is_main:
        seedorder.warn_once(model, cfg.train.seed, _say)
    loss = None if model_loss else (loss or default_loss(task))
    source = "script" if optimizer is not None else "config"
    if optimizer is not None and cfg.train.clip_grad_norm:
        raise ConfigError("train.clip_grad_norm clips the config's optimizer; give your own optimizer "
                          "grad_clip=paddle.nn.ClipGradByGlobalNorm(...) instead")
    if optimizer is None:
        optimizer = optimizer_factory(cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay,
                                      cfg.train.clip_grad_norm)
    parts = Parts(model, train_source, eval_source, loss, optimizer, task, type(model).__name__,
                  own=True, optimizer_from=source, metrics=metrics,
                  callbacks=callbacklib.check(callbacks), feed=feed)
    from . import train        # the package's, which imports this module

    try:
        return train(parts, cfg, env)
    except KeyboardInterrupt:
        raise errors.Interrupted() from None
    except PeerFailure as exc:
        raise errors.StoppedByPeer(str(exc)) from None


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config_of(config: Union[None, str, configlib.Config]) -> configlib.Config:
    """fit()'s config: the given one, or the defaults with what `python -m
    paddle_dist.launch` was given."""
    if config is None:
        given_path, given = protocol.launch_options()
        return configlib.load(given_path, given, fit_record=True) if given_path \
            else configlib.with_overrides(given)
    return config if isinstance(config, configlib.Config) else configlib.load(config, fit_record=True)


@dataclass(frozen=True)
class Steps:
    """What fit() will do with a dataset on this job's ranks, known before the optimizer."""
    per_epoch: int        # optimizer steps a rank takes in an epoch
    total: int            # optimizer steps of the whole run (train.epochs, train.max_steps)
    world_size: int
    micro_batches: int    # micro-batches per optimizer step on a rank (train.accumulate_steps)


def steps(train_data, config: Union[None, str, configlib.Config] = None, epochs: Optional[int] = None,
          batch_size: Optional[int] = None) -> Steps:
    """The optimizer steps fit(model, train_data, config=config, epochs=..., batch_size=...)
    will take on this job's ranks, for sizing a scheduler before fit(): len(DataLoader)
    counts every rank's samples, so a schedule sized from it runs W times too long.

    Example:
        plan = paddle_dist.steps(train_loader, cfg)
        scheduler = paddle.optimizer.lr.CosineAnnealingDecay(0.1, T_max=plan.total)
    """
    cfg = _config_of(config)
    for key, value in (("train.epochs", epochs), ("train.batch_size", batch_size)):
        if value is not None:
            cfg = configlib.replace_key(cfg, key, value)
    source = Source.of(train_data, "train_data")
    cfg = _loader_settings(cfg, source, None)
    check_data(source, cfg)
    world = detect().world_size
    per_epoch = steps_of(source, cfg, DataPlan(world, cfg.train.accumulate_steps))
    return Steps(per_epoch, total_steps(cfg, per_epoch), world, cfg.train.accumulate_steps)


def _metric_list(metrics) -> list:
    found = [] if metrics is None else list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    for metric in found:
        if not isinstance(metric, paddle.metric.Metric):
            raise ConfigError(f"fit(metrics=...) takes paddle.metric.Metric objects, not "
                              f"{type(metric).__name__}")
    return found


def _monitor_for(cfg: configlib.Config, metrics: list, evaluates: bool):
    """The config with checkpoint.monitor resolved against the metrics: the default
    (eval_accuracy) becomes the first metric's when the metrics log no accuracy. (A
    monitor the job never logs is refused when it starts: trainer.job._check_monitor.)"""
    if not metrics or not evaluates:
        return cfg
    names = [f"eval_{name}" for name in metric_names(metrics)]
    if cfg.checkpoint.monitor == configlib.Config().checkpoint.monitor and cfg.checkpoint.monitor not in names:
        return configlib.replace_key(cfg, "checkpoint.monitor", names[0])
    return cfg


def _loader_settings(cfg: configlib.Config, train: Source, eval_: Optional[Source]):
    """The config with what the user's DataLoaders set (batch sizes, drop_last, shuffling,
    workers), so that config.yaml records what ran and the step counts follow it."""
    pairs = [("train.batch_size", train.batch_size), ("train.drop_last", train.drop_last),
             ("train.shuffle", train.shuffle), ("data.num_workers", train.num_workers)]
    if eval_ is not None:
        pairs.append(("train.eval_batch_size", eval_.batch_size))
    for key, value in pairs:
        if value is not None:
            cfg = configlib.replace_key(cfg, key, value)
    return cfg


def base_lr(optimizer) -> float:
    """The optimizer's base rate: its float, or its scheduler's (through a LinearWarmup, the
    rate it warms up to; the rate now would be the warm-up's start).

    Example:
        base_lr(paddle.optimizer.SGD(LinearWarmup(0.02, 10, 0.0, 0.02), ...))    # 0.02
    """
    rate = optimizer._learning_rate
    while isinstance(rate, LinearWarmup):
        rate = rate.learning_rate
    return float(rate.base_lr if isinstance(rate, LRScheduler) else rate)


def _decay(optimizer):
    """The optimizer's own weight decay, as a number or Paddle's words for its regularizer."""
    for name in ("_weight_decay", "regularization", "_regularization_coeff"):
        value = getattr(optimizer, name, None)
        if value is not None:
            return float(value) if isinstance(value, (int, float)) else str(value)
    return None


def _groups(optimizer) -> list:
    """The parameter groups' sizes, rates and decays ([] for one group)."""
    groups = getattr(optimizer, "_param_groups", None) or []
    if not groups or not isinstance(groups[0], dict):
        return []
    plain = (int, float, str, type(None))
    return [{"params": len(group.get("params", [])),
             **{key: group[key] if isinstance(group[key], plain) else str(group[key])
                for key in ("learning_rate", "weight_decay", "regularization_coeff") if key in group}}
            for group in groups]


def fit_record(parts: Parts, optimizer) -> dict:
    """What a fit() run trained, for its config.yaml and run.json (and its identity: a
    changed model, optimizer or dataset is another job, whose checkpoints would not load
    or would not mean the same).

    Example:
        fit_record(parts, opt)["parameters_digest"]    # sha256 of the names and shapes
    """
    shapes = "\n".join(f"{name}:{list(value.shape)}" for name, value in parts.model.state_dict().items())
    scheduler = optimizer._learning_rate
    return {"model": type(parts.model).__name__,
            "parameters": int(sum(int(np.prod(p.shape)) for p in parts.model.parameters())),
            "parameters_digest": hashlib.sha256(shapes.encode()).hexdigest()[:16],
            "optimizer": type(optimizer).__name__, "lr": base_lr(optimizer),
            "weight_decay": _decay(optimizer), "param_groups": _groups(optimizer),
            # The script and its arguments: `--lr 0.02` instead of `--lr 2e-3` is another run.
            "script": [os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else "", *sys.argv[1:]],
            "lr_scheduler": type(scheduler).__name__ if isinstance(scheduler, LRScheduler) else "",
            "optimizer_from": parts.optimizer_from,
            "train_samples": len(parts.train_data),
            "eval_samples": len(parts.eval_data) if parts.eval_data is not None else 0}
