"""The high-level path: `paddle.Model.prepare` / `fit`, unchanged.

`paddle.Model` wraps the network in `DataParallel` itself and shards a `Dataset` with its
own `DistributedBatchSampler`, so this path hands it the bare network and the Dataset
(never a DataLoader, which Model.fit would NOT shard). Progress, exact evaluation and
checkpoints come from the same code as the loop trainer, through one callback.
"""

from __future__ import annotations

import paddle

from ..runtime import quiet_paddle
from .common import EpochEnd, Parts, lr_of, make_optimizer, to_float


class _Bridge(paddle.callbacks.Callback):
    def __init__(self, progress, epoch_end: EpochEnd, net, optimizer):
        super().__init__()
        self.progress, self.epoch_end = progress, epoch_end
        self.net, self.optimizer = net, optimizer

    def on_epoch_begin(self, epoch, logs=None):
        self.progress.epoch_begin(epoch)

    def on_train_batch_end(self, step, logs=None):
        self.progress.step(to_float(logs["loss"]), lr_of(self.optimizer))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end(epoch, self.net, self.optimizer)


def run(parts: Parts, cfg, env, progress, epoch_end: EpochEnd, max_steps: int) -> None:
    with quiet_paddle():
        _fit(parts, cfg, progress, epoch_end, max_steps)


def _fit(parts: Parts, cfg, progress, epoch_end: EpochEnd, max_steps: int) -> None:
    net = parts.model
    model = paddle.Model(net)     # wraps DataParallel itself when world size > 1
    optimizer = make_optimizer(parts.optimizer, net.parameters())
    model.prepare(optimizer=optimizer, loss=parts.loss)
    model.fit(parts.train_data, batch_size=cfg.train.batch_size, epochs=cfg.train.epochs,
              shuffle=cfg.train.shuffle, drop_last=cfg.train.drop_last, verbose=0,
              num_workers=0, callbacks=[_Bridge(progress, epoch_end, net, optimizer)],
              num_iters=max_steps if max_steps < progress.steps_per_epoch * cfg.train.epochs else None)
