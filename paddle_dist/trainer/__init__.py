"""The trainer: `fit()` for users' own parts, `train()` for the built-in jobs.

Both API levels (`train.api: loop | hapi`) run behind one Session (session.py): the same
progress, exact evaluation, checkpoints and metrics, so a script behaves the same
standalone, under `paddle.distributed.launch` and under `spawn`.

Example:
    result = paddle_dist.fit(net, train_ds, eval_ds, config=cfg)
    print(result.metrics["eval_accuracy"])
"""

from .job import Parts, Result, train
from .own import fit

__all__ = ["Parts", "Result", "fit", "train"]
