"""Gradients between ranks, averaged at every optimizer step at both API levels, and
BatchNorm's running statistics, kept equal on every rank.

- grad_sync: `GradSync`, the averaging before the optimizer's update, its modes;
- checks: the mode a config runs as, the layout every rank must share, what is refused;
- wiring: the optimizer's class and paddle.DataParallel (or no reducer at all);
- sparse: tables whose gradients come as rows, exchanged as rows in every mode;
- overlap: buckets sent during backward(); reducers, shm: the CPU transports;
- collectives: collective calls that fail as a `PeerFailure` and that the watchdog sees;
- batchstats: BatchNorm's running statistics, one update per optimizer step from every
  rank's samples (`BatchStats`), so every rank holds the same ones at every step.

Example:
    check_optimizer(optimizer, net, cfg.sync.mode)
    grad_sync = GradSync.from_config(env, cfg.sync, monitor.phase)
    agree_on_layout(optimizer, net, env)        # collective, before anything starts
    grad_sync.attach(optimizer, net)
    model = wrap(net, env, grad_sync)           # the trainer's Engine does these (trainer/engine.py)

Importing the package imports no paddle: `shm` serves processes that never need it (its
tests start dozens). Its public names import their module when first used.
"""

import importlib

__all__ = ["GradSync", "agree_on_layout", "check_optimizer", "collective", "first_line",
           "resolve_mode", "wrap"]
_HOME = {"agree_on_layout": "checks", "check_optimizer": "checks", "resolve_mode": "checks",
         "collective": "collectives", "first_line": "collectives",
         "GradSync": "grad_sync", "wrap": "wiring"}


def __getattr__(name):
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

