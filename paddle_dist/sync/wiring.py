"""Where the averaging plugs into Paddle: the optimizer's class and paddle.DataParallel.

`install` gives an optimizer object a subclass of its own class whose step() and
minimize() call its GradSync first (`uninstall` gives it back); `wrap` builds the
DataParallel a loop trains, with Paddle's in-backward reducer off unless
sync.mode=dataparallel (`disable_reducer`, which the hapi trainer calls on paddle.Model's own).

Example:
    install(optimizer, grad_sync)         # GradSync.attach does this
    model = wrap(net, env, grad_sync)     # DataParallel with its reducer off
"""

from __future__ import annotations

import functools

import paddle

from .checks import trainable
from typing import TYPE_CHECKING

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv


@functools.lru_cache(maxsize=None)
def _synced_class(cls):
    """`cls` with step() and minimize() that average the gradients first: the class an
    attached optimizer takes on (named as its own, so it reads the same everywhere)."""
    def step(self, *args, **kwargs):
        self._paddle_dist_sync.before_update()
        return cls.step(self, *args, **kwargs)

    def minimize(self, loss, startup_program=None, parameters=None, no_grad_set=None):
        self._paddle_dist_sync.before_update()
        if parameters is None and no_grad_set is None and _grouped(self):
            # Paddle's minimize() cannot read parameter groups (it hands the list of dicts
            # to get_all_grads: TypeError), yet paddle.Model.fit calls it: step() can.
            cls.step(self)
            return [], [(p, p.grad) for p in trainable(self) if p.grad is not None]
        return cls.minimize(self, loss, startup_program, parameters, no_grad_set)

    return type(cls.__name__, (cls,), {"step": step, "minimize": minimize, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, "_paddle_dist_base": cls})


def _grouped(optimizer) -> bool:
    groups = optimizer._param_groups
    return bool(groups) and isinstance(groups[0], dict)


def install(optimizer, sync) -> None:
    """Make `optimizer`'s step() and minimize() call `sync.before_update()` first."""
    optimizer._paddle_dist_sync = sync
    base = getattr(type(optimizer), "_paddle_dist_base", type(optimizer))
    optimizer.__class__ = _synced_class(base)


def uninstall(optimizer, sync) -> None:
    """Give `optimizer` back its own class, if `sync` is the one installed on it."""
    if getattr(optimizer, "_paddle_dist_sync", None) is sync:
        optimizer.__class__ = type(optimizer)._paddle_dist_base
        del optimizer._paddle_dist_sync


def wrap(net, env: DistEnv, sync):
    """`paddle.DataParallel(net)` (which broadcasts rank 0's weights), with its in-backward
    reducer switched off unless sync.mode=dataparallel, where it also averages the
    gradients of parameters some rank's batch did not reach (sync.find_unused_parameters);
    `net` itself on a single process."""
    if not env.is_distributed:
        return net
    if sync.mode == "dataparallel":
        return paddle.DataParallel(net, find_unused_parameters=sync.find_unused)
    model = paddle.DataParallel(net)
    disable_reducer(model)
    return model


def disable_reducer(data_parallel) -> None:
    """Stop paddle.DataParallel's in-backward all-reduce; GradSync does the averaging.

    (Were this ever ignored by a future Paddle, results stay correct: averaging gradients
    that are already equal on every rank leaves them unchanged.)
    """
    data_parallel.grad_need_sync = False
