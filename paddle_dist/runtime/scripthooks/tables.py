"""A plain script's `paddle.DataParallel` under `python -m paddle_dist.launch`: a table that
Paddle's reducer cannot take ends the rank with one line instead of a SIGSEGV.

Paddle's reducer knows a parameter's gradient comes as rows (SelectedRows) only for an
`nn.Embedding(sparse=True)`'s weight. Any other parameter that a Layer looks up with
`F.embedding(ids, weight, sparse=True)` gets rows the reducer copies as a dense tensor:
the rank dies with SIGSEGV in `EagerReducer::MarkVarReady` at its first backward (Paddle
3.3.1, raw Paddle too). Which parameters a forward looks up that way is known only then,
so each trainable parameter but those weights gets a gradient hook, which Paddle runs
before the reducer's: a gradient that comes as rows raises `SparseTableRefused`, naming
the parameter and what to do (paddle_dist.fit(), which averages such tables itself, or
`nn.Embedding(sparse=True)`). The hooks return None: every other gradient is left as it
is (one Python call per parameter and backward).

Example:
    net = paddle.DataParallel(model)      # in a rank: guard(net) has run
"""

from __future__ import annotations

import atexit
from typing import Callable, List

import paddle.distributed as dist

from ...sync.sparse import declared, is_rows

REFUSED = ("paddle_dist: parameter '{name}' got its gradient as rows (F.embedding(..., sparse=True)), "
           "which paddle.DataParallel's reducer takes only from an nn.Embedding(sparse=True) (any other "
           "table dies with SIGSEGV inside it): build the table as nn.Embedding(v, d, sparse=True), "
           "or train with paddle_dist.fit(), which averages such tables itself (docs/sync.md)")


class SparseTableRefused(RuntimeError):
    """A parameter Paddle's reducer would take for dense got a rows gradient."""


def guard(data_parallel, net) -> List:
    """Hook every trainable parameter of `net` (the network `data_parallel` wraps) that
    Paddle's reducer holds as dense; the hooks' handles. None for one rank."""
    if dist.get_world_size() < 2:
        return []
    sparse = {id(p) for p in declared(net)}
    handles = [p.register_hook(_refuse_rows(name)) for name, p in net.named_parameters()
               if not p.stop_gradient and id(p) not in sparse]
    data_parallel._paddle_dist_table_hooks = handles
    # Gone before the interpreter's teardown frees the parameters: no Python hook is left
    # on a tensor Paddle destroys at exit.
    atexit.register(_remove, handles)
    return handles


def _remove(handles: List) -> None:
    for handle in handles:
        handle.remove()


def _refuse_rows(name: str) -> Callable:
    def hook(grad):
        if is_rows(grad):
            raise SparseTableRefused(REFUSED.format(name=name))
        return None
    return hook
