"""The single per-process entry for every launch mode: set up, build the parts, train.

Example:
    worker.main(cfg)          # in each rank, however it was started
"""

from __future__ import annotations

import sys

from . import config as configlib
from .data import registry
from . import models, trainer
from .runtime import process
from .security import private
from .trainer.optim import default_loss, optimizer_factory
from .trainer.parts import Parts


def build_parts(cfg: configlib.Config) -> Parts:
    data = registry.get(cfg.data.name)
    registry.check(cfg)
    train_data, eval_data, classes = data.build(cfg)
    task = models.task_of(cfg.model.name)
    net = models.build(cfg.model.name, cfg.model.num_classes or len(classes or ()))
    return Parts(model=net, train_data=train_data, eval_data=eval_data,
                 loss=default_loss(task), task=task, name=cfg.model.name, classes=classes,
                 optimizer=optimizer_factory(cfg.train.optimizer, cfg.train.lr, cfg.train.weight_decay,
                                                     cfg.train.clip_grad_norm))


def main(cfg: configlib.Config) -> trainer.Result:
    """Run this rank's share of the job described by `cfg`."""
    env = process.setup(cfg)          # seeds before the model is built: same weights everywhere
    return trainer.train(build_parts(cfg), cfg, env)


def run_resolved(cfg_dict: dict) -> int:
    """A rank of the built-in job started by paddle_dist's launcher: the config it resolved
    (runtime/protocol.py), run as it is; nothing on the rank's command line is read again."""
    cfg = configlib.from_dict(cfg_dict)
    private.closed_umask(cfg.output.share)
    main(cfg)
    return 0


def spawn_entry(cfg_dict) -> None:
    """Target of `paddle.distributed.spawn`: the config arrives as a plain dict. Exits with
    paddle_dist's codes (spawn's wrapper would turn every exception into exit 1)."""
    from .options import rank_exit_code

    try:
        main(configlib.from_dict(cfg_dict))
    except BaseException as exc:  # noqa: BLE001 - every ending becomes an exit code
        sys.exit(rank_exit_code(exc))
