"""The manual data-parallel loop: the "three changes" done once.

`init_parallel_env()` (in the worker), `paddle.DataParallel`, and a
`DistributedBatchSampler` whose `set_epoch` is called every epoch.
"""

from __future__ import annotations

import paddle

from .common import EpochEnd, Parts, lr_of, make_optimizer


def run(parts: Parts, cfg, env, progress, epoch_end: EpochEnd, max_steps: int) -> None:
    net = parts.model
    model = paddle.DataParallel(net) if env.is_distributed else net
    optimizer = make_optimizer(parts.optimizer, net.parameters())
    sampler = paddle.io.DistributedBatchSampler(
        parts.train_data, batch_size=cfg.train.batch_size, num_replicas=env.world_size,
        rank=env.global_rank, shuffle=cfg.train.shuffle, drop_last=cfg.train.drop_last)
    loader = paddle.io.DataLoader(parts.train_data, batch_sampler=sampler, num_workers=0)
    net.train()
    for epoch in range(cfg.train.epochs):
        sampler.set_epoch(epoch)
        progress.epoch_begin(epoch)
        for x, y in loader:
            loss = parts.loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            progress.step(float(loss), lr_of(optimizer))
            if progress.step_count >= max_steps:
                break
        epoch_end(epoch, net, optimizer)
        if progress.step_count >= max_steps:
            break
