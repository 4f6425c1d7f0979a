"""The manual data-parallel loop: the "three changes" done once.

`init_parallel_env()` (in runtime/process.setup), `paddle.DataParallel`, and a distributed batch
sampler whose epoch is set every epoch. Each optimizer step is the Engine's (engine.py): the
gradients are averaged once per step, after the last micro-batch's backward (see
sync/grad_sync.py for why not inside backward), so `train.accumulate_steps` micro-batches cost
one communication. With sync.mode=dataparallel every micro-batch's backward() all-reduces, as
under paddle.Model: `no_sync()` for all but the last would lose, with find_unused_parameters,
the gradient of a parameter that an earlier micro-batch reached and the last did not (the
ranks' weights then differ).
"""

from __future__ import annotations

from .session import Session


def run(session: Session) -> None:
    parts, cfg, engine = session.parts, session.cfg, session.engine
    model = engine.wrapped()
    k = cfg.train.accumulate_steps
    parts.model.train()
    for epoch in range(session.pos.epoch, cfg.train.epochs):
        done = session.pos.step_in_epoch if epoch == session.pos.epoch else 0
        session.sampler.start(epoch, done)
        session.begin_epoch(epoch)
        for group in groups(session.loader, k):
            session.before_step()
            result = engine.step(model, group, parts.feed, parts.loss, session.seed_micro_batch)
            if session.after_step(result.loss, result.parts, result.count, result.local):
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
