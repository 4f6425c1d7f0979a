"""The trainer: `fit()` for users' own parts, `train()` for the built-in jobs.

Both API levels (`train.api: loop | hapi`) run behind one Session (session.py): the same
progress, exact evaluation, checkpoints and metrics, so a script behaves the same
standalone, under `paddle.distributed.launch` and under `spawn`.

Importing the package imports no paddle: launchers read `trainer.amp` and
`trainer.schedule` to check a config. Its public names import it when first used.

Example:
    result = paddle_dist.fit(net, train_ds, eval_ds, config=cfg)
    print(result.metrics["eval_accuracy"])
"""

import importlib

__all__ = ["Parts", "Result", "fit", "steps", "train"]
_HOME = {"Parts": "job", "Result": "job", "train": "job", "fit": "own", "steps": "own"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
