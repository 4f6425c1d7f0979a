"""The high-level path: `paddle.Model.prepare` / `fit`, unchanged.

`paddle.Model` wraps the network in `DataParallel` itself (never wrap it twice). It is
handed a DataLoader over the same resumable distributed sampler as the loop trainer, so
both API levels see the same shards in the same order and resume mid-epoch alike (a
plain, unsharded DataLoader would make every rank train on all the data). Progress,
exact evaluation, checkpoints and stop requests run through one callback.
"""

from __future__ import annotations

import paddle

from ..runtime import quiet_paddle
from ..sync import disable_reducer
from .common import Session, to_float, train_loader


class _Bridge(paddle.callbacks.Callback):
    def __init__(self, session: Session, sampler):
        super().__init__()
        self.session, self.sampler = session, sampler
        self.first = session.pos.epoch

    def on_epoch_begin(self, epoch, logs=None):
        real = self.first + epoch          # hapi counts the epochs of this fit() call
        self.sampler.start(real, self.session.pos.step_in_epoch if epoch == 0 else 0)
        self.session.begin_epoch(real)

    def on_train_batch_end(self, step, logs=None):
        if self.session.after_step(to_float(logs["loss"])):
            # The step limit: hapi leaves its batch loop when num_iters runs out, which it
            # checks right after this callback.
            self.model.num_iters = 1

    def on_epoch_end(self, epoch, logs=None):
        self.session.end_epoch(self.first + epoch)


def run(session: Session) -> None:
    with quiet_paddle():
        _fit(session)


def _fit(session: Session) -> None:
    cfg, env = session.cfg, session.env
    model = paddle.Model(session.parts.model)
    if env.is_distributed and session.sync.mode != "dataparallel":
        disable_reducer(model._adapter.ddp_model)
    model.prepare(optimizer=session.optimizer, loss=session.parts.loss)
    loader, sampler = train_loader(session.parts, cfg, env)
    model.fit(loader, epochs=cfg.train.epochs - session.pos.epoch, verbose=0,
              callbacks=[_Bridge(session, sampler)])
