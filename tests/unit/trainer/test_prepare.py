"""What a job decides before its run directory (trainer/prepare.py): a step-based run's
epochs are its plan's, on any number of ranks."""

import logging
import types

import paddle

from paddle_dist import config as configlib
from paddle_dist.runtime.env import DistEnv
from paddle_dist.trainer.loading import Source
from paddle_dist.trainer.prepare import Prepared, epochs_of_steps, replanned
from paddle_dist.trainer.sampling import DataPlan


def test_a_continued_step_run_fills_the_epochs_of_its_plan_not_of_its_ranks():
    cfg = configlib.with_overrides(["train.max_steps=40", "train.batch_size=8", "train.epochs=1"])
    assert epochs_of_steps(cfg, 32).train.epochs == 2                 # 1 rank's own plan: 32 a epoch
    net = paddle.nn.Linear(2, 2)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    parts = types.SimpleNamespace(train_data=Source.of(list(range(256)), "train_data"), callbacks=[], model=net)
    prepared = Prepared(opt, 32, 40, None, "", 0.1, None)
    cfg, again = replanned(parts, cfg, DistEnv(world_size=1), prepared, DataPlan(2, 1), logging.getLogger("t"))
    assert (cfg.train.accumulate_steps, again.per_epoch, again.limit, cfg.train.epochs) == (2, 16, 40, 3)
