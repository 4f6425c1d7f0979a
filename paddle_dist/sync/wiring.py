"""Where the averaging plugs into Paddle: the optimizer's class and paddle.DataParallel.

`install` gives an optimizer object a subclass of its own class whose step() and
minimize() call its GradSync first (`uninstall` gives it back); `wrap` builds what a loop
trains: with sync.mode=dataparallel a paddle.DataParallel whose reducer is given only the
parameters of Paddle's own layers (`kept_from_reducer`), otherwise `Replicated`: rank 0's
weights broadcast and no reducer at all. A reducer switched off still has its hooks on
every parameter, and those die with SIGSEGV on a table whose gradient comes as rows
(sparse.py). `building(sync)` makes paddle.Model's own DataParallel the same.

Example:
    install(optimizer, grad_sync)         # GradSync.attach does this
    model = wrap(net, env, grad_sync)     # Replicated(net), or DataParallel (dataparallel)
    with building(grad_sync):
        model = paddle.Model(net)         # hapi: paddle.Model builds its DataParallel itself
"""

from __future__ import annotations

import contextlib
import functools

import paddle

from .checks import trainable
from .collectives import collective
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
    """What a loop trains (module docstring): `net` itself on a single process; with
    sync.mode=dataparallel paddle.DataParallel over Paddle's own layers' parameters, which
    also averages those some rank's batch did not reach (sync.find_unused_parameters);
    else `Replicated(net)`."""
    if not env.is_distributed:
        return net
    with building(sync):
        return paddle.DataParallel(net)


class Replicated(paddle.nn.Layer):
    """paddle.DataParallel's one other job, without its reducer: rank 0's parameters and
    buffers broadcast to every rank when built (Paddle's own `sync_params_buffers`);
    forward is the network's. GradSync averages the gradients."""

    def __init__(self, layers, strategy=None, **kwargs):
        super().__init__()
        self._layers = layers
        from paddle.distributed.parallel import sync_params_buffers
        collective(sync_params_buffers, layers, fuse_params=False, what="broadcast of rank 0's weights")

    def forward(self, *inputs, **kwargs):
        return self._layers(*inputs, **kwargs)


@contextlib.contextmanager
def building(sync):
    """While inside, `paddle.DataParallel(net, ...)` builds what `wrap` gives (module
    docstring): for paddle.Model, which builds its own. A second DataParallel over the
    same parameters instead would give them two reducers, whose hooks crash backward()
    (SIGSEGV, Paddle 3.3.1)."""
    plain = paddle.DataParallel
    kept = sync.tables.kept if sync.tables is not None else []

    class Built(plain):
        def __new__(cls, layers, *args, **kwargs):
            if sync.mode != "dataparallel" or len(kept) == len(trainable_of(layers)):
                return Replicated(layers)
            return super().__new__(cls)

        def __init__(self, layers, strategy=None, **kwargs):
            with kept_from_reducer(kept):      # (Paddle broadcasts every parameter still)
                super().__init__(layers, strategy, **{**kwargs, "find_unused_parameters": sync.find_unused})

    paddle.DataParallel = Built
    try:
        yield
    finally:
        paddle.DataParallel = plain


def trainable_of(net) -> list:
    return [p for p in net.parameters() if not p.stop_gradient]


@contextlib.contextmanager
def kept_from_reducer(params):
    """paddle.DataParallel built inside leaves `params` to paddle_dist: its reducer takes the
    parameters that are trainable while it is built. (Its `no_sync` attribute would do on
    Paddle 3.3.1, but 2.6.2 then builds the reducer with mismatched lists: PreconditionNotMet.)"""
    for p in params:
        p.stop_gradient = True
    try:
        yield
    finally:
        for p in params:
            p.stop_gradient = False

