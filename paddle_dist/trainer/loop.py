"""The manual data-parallel loop: the "three changes" done once.

`init_parallel_env()` (in runtime.setup), `paddle.DataParallel`, and a distributed batch
sampler whose epoch is set every epoch. The gradients are averaged by `GradSync` when the
optimizer steps (see sync.py for why not inside backward).
"""

from __future__ import annotations

import paddle

from ..sync import disable_reducer
from .common import Session, train_loader


def run(session: Session) -> None:
    parts, cfg, env = session.parts, session.cfg, session.env
    net = parts.model
    model = net
    if env.is_distributed:
        model = paddle.DataParallel(net)   # broadcasts rank 0's weights
        disable_reducer(model)
    loader, sampler = train_loader(parts, cfg, env)
    optimizer = session.optimizer
    net.train()
    for epoch in range(session.pos.epoch, cfg.train.epochs):
        sampler.start(epoch, session.pos.step_in_epoch if epoch == session.pos.epoch else 0)
        session.begin_epoch(epoch)
        for x, y in loader:
            loss = parts.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            if session.after_step(float(loss)):
                break
        session.end_epoch(epoch)
        if session.done:
            break
