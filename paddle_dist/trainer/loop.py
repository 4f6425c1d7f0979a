"""The manual data-parallel loop: the "three changes" done once.

`init_parallel_env()` (in runtime/process.setup), `paddle.DataParallel`, and a distributed batch
sampler whose epoch is set every epoch. The gradients are averaged by `GradSync` when the
optimizer steps (see sync/grad_sync.py for why not inside backward), so `train.accumulate_steps`
micro-batches cost one communication. With sync.mode=dataparallel every micro-batch's
backward() all-reduces, as under paddle.Model: `no_sync()` for all but the last would
lose, with find_unused_parameters, the gradient of a parameter that an earlier
micro-batch reached and the last did not (the ranks' weights then differ).
"""

from __future__ import annotations

import contextlib

from typing import Callable

import paddle

from .amp import AmpPlan, autocast
from ..sync import wrap
from .session import Session
from .sampling import train_loader
from .feed import Feed


def run(session: Session) -> None:
    parts, cfg, env = session.parts, session.cfg, session.env
    net = parts.model
    model = wrap(net, env, session.sync)
    loader, sampler = train_loader(parts, cfg, env, session.plan)
    session.sampler = sampler
    k = cfg.train.accumulate_steps
    net.train()
    for epoch in range(session.pos.epoch, cfg.train.epochs):
        done = session.pos.step_in_epoch if epoch == session.pos.epoch else 0
        sampler.start(epoch, done)
        session.begin_epoch(epoch)
        for group in groups(loader, k):
            session.before_step()
            loss = step(model, parts.loss, group, session.optimizer, session.amp, session.scaler,
                        session.sync.arm, parts.feed, session.sync.in_backward, session.seed_micro_batch)
            if session.after_step(loss, parts.feed.step_parts):
                break
        session.end_epoch(epoch)
        if session.done:
            break


def groups(batches, k: int):
    """Consecutive lists of k batches (the epoch's last list may be shorter)."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == k:
            yield group
            group = []
    if group:
        yield group


def step(model, loss_fn, group, optimizer, precision: AmpPlan = AmpPlan(), scaler=None,
         arm: Callable[[bool], None] = lambda final: None, feed: Feed = None,
         in_backward: Callable = contextlib.nullcontext,
         seed: Callable[[int, int], None] = lambda index, share: None) -> paddle.Tensor:
    """One optimizer step over the micro-batches in `group`; returns their mean loss as a
    detached float64 tensor on the device (the means of its parts, if any, are left in
    `feed.step_parts`) (read it on the host only when it is needed:
    on a GPU every read waits for the queued work, see progress.read_values).

    Each micro-batch's mean loss is divided by the group's size, so the summed gradient
    is that of the mean loss over all the group's samples (equal micro-batch sizes).
    `precision` and `scaler`: mixed precision and its loss scaling (amp.py); `arm(final)`
    tells the gradient sync whether an optimizer step follows the coming backward().
    `group` holds (inputs, labels) lists, split by `feed` (default: one input, the rest labels).
    `seed(index, share)` seeds the generators before micro-batch `index` of the `share`
    (randomness.py: dropout that does not depend on the world size)."""
    feed = feed or Feed(model, inputs=1)
    total, named = None, {}
    for i, (inputs, labels) in enumerate(group):
        if len(group) > 1:
            arm(i == len(group) - 1)
        seed(i, len(group))
        with autocast(precision):
            loss, _ = feed.loss_and_outputs(model, loss_fn, inputs, labels)
        part = loss / len(group) if len(group) > 1 else loss
        with in_backward():       # mode dataparallel: Paddle's all-reduces run inside it
            (scaler.scale(part) if scaler is not None else part).backward()
        # Summed in float64, like Python floats: the same mean as reading each loss would give.
        value = loss.detach().astype("float64")
        total = value if total is None else total + value
        for name, part in feed.loss_parts.items():
            named[name] = part if name not in named else named[name] + part
    if scaler is not None:
        scaler.step(optimizer)      # averages, then skips the step on inf/nan
        scaler.update()
    else:
        optimizer.step()
    optimizer.clear_grad()
    feed.step_parts = {name: part / len(group) for name, part in named.items()}   # the loss's parts, likewise
    return total / len(group)
