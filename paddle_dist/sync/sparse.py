"""Gradients that come as rows: embedding tables looked up with sparse=True, exchanged as rows.

`nn.Embedding(v, d, sparse=True)` and `F.embedding(x, weight, sparse=True)` (in a Layer of
the user's own) give their table a SelectedRows gradient: the looked-up rows, one per
lookup, and their values, never the whole table. paddle.DataParallel's reducer must
never hold such a table unless Paddle knows it for one (its `nn.Embedding(sparse=True)`):
its hooks copy every gradient as a dense tensor and die with SIGSEGV
(`EagerReducer::AddDistHook`, Paddle 3.3.1), even with the reducer switched off. So:

- **which**: an `nn.Embedding(sparse=True)`'s weight is known before anything starts
  (`declared`); any other parameter could be looked up with F.embedding(sparse=True), and
  Paddle's own layers' parameters are only where Paddle put them (`paddle_owned`). At the
  first exchange the ranks agree, by one all-gather, which parameters came as rows
  (`Tables.settle`); a parameter first reached later as rows is an error of one line.
- **who averages them**: paddle_dist, in every sync mode. Paddle's reducer
  (sync.mode=dataparallel) is given only the parameters of Paddle's own layers, never a
  table (`Tables.kept`, wiring.py); the other modes build no reducer at all.
- **the exchange** (`Tables.exchange`, before the dense one): each rank merges its rows
  (a repeated row's values summed), the ranks all-gather every table's row count, ids and
  values in one buffer of a size they agree on (one collective per step for all tables; a
  second when some rank's rows outgrow that size), and every rank sums them by row in rank order and divides by the number of ranks: the same bits on
  every rank, the gradient of one process on the union of the ranks' batches, and bytes
  proportional to the rows looked up. A failed peer is a PeerFailure (collectives.py).
- **the optimizer**: SGD and Adam/AdamW(lazy_mode=True) update only the rows given
  (`keeps_rows`). Every other optimizer updates every row anyway (Adam's moments decay
  everywhere), and Paddle 3.3.1's CPU Adam on rows is not deterministic (runs 0.02-0.07
  apart): it gets the averaged rows as a dense gradient, whose update is deterministic and
  the one a dense table gets (also in one process).

Example:
    tables = Tables(env, params, net, phase)        # GradSync.attach
    dense = tables.dense_of(params)                 # what the dense exchange carries
    tables.exchange(optimizer, overlap)             # at each step, before the dense exchange
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterable, List, Optional, Set, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from .collectives import collective, first_line
from ..errors import ConfigError, PeerFailure

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv

_VT = paddle.base.core.VarDesc.VarType
DENSE = getattr(_VT, "DENSE_TENSOR", None) or _VT.LOD_TENSOR      # 3.x / 2.6
# The CPU reducer's round is sized to carry this many rows of each table from every rank
# at once (`Tables.room`): more travel in several rounds.
ROOM_ROWS = 16384
ROWS = _VT.SELECTED_ROWS


def is_rows(grad) -> bool:
    """Whether a gradient holds rows (SelectedRows) rather than the whole tensor."""
    return grad is not None and grad.is_selected_rows()


def declared(net) -> List:
    """The weights of `net`'s `nn.Embedding(sparse=True)` layers, known before any backward."""
    return [layer.weight for layer in net.sublayers(include_self=True)
            if isinstance(layer, paddle.nn.Embedding) and getattr(layer, "_sparse", False)]


def paddle_owned(net) -> Set[int]:
    """ids of the parameters that a layer of Paddle's own holds (nn.Linear, nn.Conv2D, ...,
    not a sparse Embedding): those paddle.DataParallel's reducer can take. A Layer of the
    user's own (a subclass too) may look its parameters up with F.embedding(sparse=True)."""
    sparse = {id(p) for p in declared(net)}
    owned = set()
    for layer in net.sublayers(include_self=True):
        if type(layer).__module__.startswith("paddle."):
            owned.update(id(p) for p in layer.parameters(include_sublayers=False) if id(p) not in sparse)
    return owned


def keeps_rows(optimizer) -> bool:
    """Whether `optimizer` updates only the rows it is given: SGD, and Adam/AdamW with
    lazy_mode=True. Any other gets the rows as a dense gradient (module docstring)."""
    return isinstance(optimizer, paddle.optimizer.SGD) or bool(getattr(optimizer, "_lazy_mode", False))


def optimizer_mode(optimizer) -> str:
    """How `optimizer` treats a sparse table, for messages: 'Adam(lazy_mode=False)', 'SGD'."""
    base = getattr(type(optimizer), "_paddle_dist_base", type(optimizer))
    lazy = getattr(optimizer, "_lazy_mode", None)
    return base.__name__ + (f"(lazy_mode={lazy})" if lazy is not None else "")


def merged(rows: np.ndarray, values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Each row once, ascending, with the sum of its values in the order given.

    Example:
        merged(np.array([5, 1, 5]), np.array([[1.], [2.], [3.]]))   # ([1, 5], [[2.], [4.]])
    """
    if len(rows) == 0:
        return rows.astype(np.int64), values
    order = np.argsort(rows, kind="stable")
    rows, values = rows[order], values[order]
    first = np.r_[True, rows[1:] != rows[:-1]]
    out = values[first]
    if not first.all():            # a row's later values added to its first, in order
        repeats = np.flatnonzero(~first)
        np.add.at(out, np.cumsum(first)[repeats] - 1, values[repeats])
    return rows[first].astype(np.int64), out


def set_rows(param, rows: np.ndarray, values: np.ndarray) -> None:
    """Make `param`'s gradient the rows `rows` with `values` (in place, or a new one for a
    parameter that has none: a rank whose batches did not look the table up)."""
    grad = param.grad
    if grad is None:
        grad = paddle.base.core.eager.Tensor(param.dtype, list(param.shape), param.name + "@GRAD", ROWS, False)
    held = grad.get_selected_rows()
    held.set_rows(rows.tolist())
    held.set_height(int(param.shape[0]))
    held.get_tensor().set(np.ascontiguousarray(values.reshape([len(rows)] + list(param.shape[1:]))), _place(param))
    if param.grad is None:
        param.grad = grad


def set_dense(param, rows: np.ndarray, values: np.ndarray) -> None:
    """Make `param`'s gradient the dense tensor holding `values` at `rows`, zeros elsewhere
    (the next backward() gives rows again)."""
    dense = np.zeros([int(d) for d in param.shape], dtype=values.dtype)
    dense.reshape(len(dense), -1)[rows] = values.reshape(len(rows), -1)
    param._set_grad_type(DENSE)       # drops the rows; a dense gradient can then be set
    param.grad = paddle.to_tensor(dense, place=param.place)


def scale(grad, factor) -> None:
    """Multiply a gradient by `factor` (a 0-d tensor) in place: rows too, which Paddle's
    multiply_ refuses (bump_inplace_version is only supported on DenseTensor, 3.3.1)."""
    if not is_rows(grad):
        grad.multiply_(factor.astype(grad.dtype))
        return
    held = grad.get_selected_rows().get_tensor()
    values = np.array(held)
    held.set(values * values.dtype.type(float(factor)), _place(grad))


def _place(param):
    place = param.place
    core = paddle.base.core
    return core.CUDAPlace(place.gpu_device_id()) if place.is_gpu_place() else core.CPUPlace()


def local_rows(param, name: str) -> Tuple[np.ndarray, np.ndarray]:
    """This rank's rows of `param`'s gradient, merged: (row ids, values [n, row size])."""
    width = int(np.prod(param.shape[1:]))
    grad = param.grad
    if grad is None:
        return np.zeros(0, np.int64), np.zeros((0, width), np.dtype(str(param.dtype).split(".")[-1]))
    if not is_rows(grad):
        raise ConfigError(f"parameter '{name}' got a dense gradient where it had rows before "
                          "(F.embedding with sparse=True at some steps or ranks and not others?); "
                          "look a table up the same way everywhere")
    values = grad.numpy()
    if values.dtype not in (np.float32, np.float64):
        raise ConfigError(f"sparse table '{name}' is {grad.dtype}: its rows are exchanged in float32 "
                          "or float64 only; keep the table in float32 (AMP O1 keeps it)")
    return merged(np.asarray(grad.rows(), dtype=np.int64), values.reshape(len(values), width))


def pack(tables: Iterable[Tuple[np.ndarray, np.ndarray]], word=np.int32) -> np.ndarray:
    """Row ids and values of every table in one buffer of 4-byte words: for each table two
    words per id, then its values. `word` int32: the bits as they are (for an all-gather);
    float32 (float32 tables): each id as two float32 integers below 2^24 (id = hi 2^24 + lo),
    exact through a sum with zeros (an all-reduce: `Tables._gather`)."""
    parts = []
    for rows, values in tables:
        rows = rows.astype(np.int64)
        if word == np.float32:
            parts += [np.stack([rows >> 24, rows & 0xFFFFFF], axis=1).astype(np.float32).ravel(),
                      np.ascontiguousarray(values, dtype=np.float32).ravel()]
        else:
            parts += [rows.view(np.int32), np.ascontiguousarray(values).view(np.int32).ravel()]
    return np.concatenate(parts) if parts else np.zeros(0, word)


def unpack(buffer: np.ndarray, counts, shapes) -> List[Tuple[np.ndarray, np.ndarray]]:
    """`pack`'s buffer back into (ids, values) per table; `shapes`: (row size, dtype) each."""
    out, at = [], 0
    for n, (width, dtype) in zip(counts, shapes):
        n = int(n)
        if buffer.dtype == np.float32:
            ids = buffer[at:at + 2 * n].reshape(n, 2).astype(np.int64)
            rows = (ids[:, 0] << 24) + ids[:, 1]
        else:
            rows = buffer[at:at + 2 * n].view(np.int64)
        at += 2 * n
        words = n * width * np.dtype(dtype).itemsize // 4
        out.append((rows, buffer[at:at + words].view(dtype).reshape(n, width)))
        at += words
    return out


class Tables:
    """Which of the exchange's parameters travel as rows, and their exchange (module
    docstring). `params`: the exchange's layout; `net` names them and tells who holds them."""

    def __init__(self, env: DistEnv, params, net=None, phase=None, name_of: Callable = None):
        self.env, self.phase, self.params = env, phase, list(params)
        self.name_of = name_of or (lambda p: p.name)
        known = {id(p) for p in declared(net)} if net is not None else set()
        owned = paddle_owned(net) if net is not None else set()
        self.rows = [p for p in self.params if id(p) in known]
        # A parameter of a Layer of the user's own may come as rows (F.embedding): overlap
        # holds its bucket until the first exchange says (Overlap's `held`).
        self.uncertain = {id(p) for p in self.params if id(p) not in known and id(p) not in owned}
        self.kept = [p for p in self.params if id(p) in known or id(p) in self.uncertain]
        self.unseen: list = []         # dense so far, never seen with a gradient here
        self.settled = not self.params
        self.mode = ""                 # how the optimizer updates the tables (optimizer_mode)
        self.sent_bytes = 0            # the rows' bytes this rank has sent, over all steps
        self.capacity = 0              # words of rows every rank sends (`_rows_of_ranks`)
        self.reducer = None            # GradSync's CPU reducer, if any: the rows travel through it

    def room(self, world: int) -> int:
        """Floats a round of the CPU reducer should hold for the tables' rows (ROOM_ROWS)."""
        return world * sum(min(int(p.shape[0]), ROOM_ROWS) * (2 + int(np.prod(p.shape[1:]))) for p in self.kept)

    def dense_of(self, params) -> list:
        """`params` but the tables: what the dense exchange carries."""
        rows = {id(p) for p in self.rows}
        return [p for p in params if id(p) not in rows] if rows else params

    @property
    def kept_dense(self) -> list:
        """The dense parameters Paddle's reducer is not given (sync.mode=dataparallel)."""
        return self.dense_of(self.kept)

    def exchange(self, optimizer, overlap=None, reducer=None) -> None:
        """At every step, before the dense exchange: settle which parameters come as rows
        (the first time), then average the tables' rows in place (module docstring).
        `reducer`: the dense exchange's CPU reducer (reducers.py), which then carries them."""
        self.reducer = reducer
        if not self.env.is_distributed:
            self._own_rows(optimizer)
            return
        if overlap is not None and (self.rows or not self.settled):
            overlap.drain()           # the communication thread idle before these collectives
        if not self.settled:
            self.mode = optimizer_mode(optimizer)
            found = self.settle()
            if overlap is not None:
                overlap.drop(found)
        self._check_unseen()
        if self.rows:
            self._average(optimizer)

    def explain(self, where: str) -> str:
        """The weights check's cause when the first tensor that differs (`where`, its line)
        is a table: its rows reach every rank the same, so its update differs."""
        for p in self.rows:
            if where.startswith(f"'{self.name_of(p)}'"):
                return (f"'{self.name_of(p)}' is a sparse table (its gradient comes as rows) updated by "
                        f"{self.mode}, and its rows reach every rank the same: that update is not "
                        "deterministic (Paddle's Adam on rows without lazy_mode=True is not, on CPU); "
                        "use lazy_mode=True, or build the table with sparse=False (docs/sync.md)")
        return ""

    def _own_rows(self, optimizer) -> None:
        """One process: nothing to exchange; an optimizer that updates every row gets them dense."""
        if keeps_rows(optimizer):
            return
        for p in self.kept:            # (a layer of Paddle's own holds dense gradients)
            if is_rows(p.grad):
                set_dense(p, *local_rows(p, self.name_of(p)))

    def settle(self) -> list:
        """Collective, at the first exchange: the parameters whose gradient came as rows on
        some rank (one all-gather); they leave the dense exchange. Returns those found."""
        known = {id(p) for p in self.rows}
        mine = [i for i, p in enumerate(self.params) if id(p) not in known and is_rows(p.grad)]
        gathered: list = []
        collective(dist.all_gather_object, gathered, mine, phase=self.phase, what="sparse-table check")
        found = [self.params[i] for i in sorted(set().union(*map(set, gathered)))]
        self.rows += found
        self.unseen = [p for p in self.dense_of(self.params) if p.grad is None]
        self.settled = True
        return found

    def _check_unseen(self) -> None:
        """A parameter of the dense exchange first reached as rows after the first step
        cannot join the tables any more (the ranks agreed on them): one line, not a crash."""
        if not self.unseen:
            return
        for p in self.unseen:
            if is_rows(p.grad):
                raise ConfigError(f"parameter '{self.name_of(p)}' first got a gradient as rows "
                                  "(sparse=True) after the first step, when the ranks had agreed on "
                                  "their sparse tables; build it with nn.Embedding(sparse=True)")
        self.unseen = [p for p in self.unseen if p.grad is None]       # seen dense: dense for good

    def _average(self, optimizer) -> None:
        """All-gather every table's rows, sum by row, divide by the ranks (`_rows_of_ranks`)."""
        local = [local_rows(p, self.name_of(p)) for p in self.rows]
        shapes = [(int(np.prod(p.shape[1:])), values.dtype) for p, (_, values) in zip(self.rows, local)]
        counts, buffers = self._rows_of_ranks(local, shapes)
        if not counts.any():
            return                 # no rank looked a table up: no gradient, as in one process
        ranks = [unpack(b, c, shapes) for b, c in zip(buffers, counts)]
        dense = not keeps_rows(optimizer)
        for i, p in enumerate(self.rows):
            if not counts[:, i].any():
                continue
            rows, values = merged(np.concatenate([r[i][0] for r in ranks]),
                                  np.concatenate([r[i][1] for r in ranks]))
            values = values / values.dtype.type(self.env.world_size)
            (set_dense if dense else set_rows)(p, rows, values)

    def _rows_of_ranks(self, local, shapes):
        """Every rank's (counts per table, packed rows) in one all-gather of a buffer of
        `capacity` words after the counts, the same size on every rank; when some rank's
        rows do not fit, every rank sees it in the counts, and all send again with a
        capacity that fits (the first step: the counts alone first). The capacity follows
        the largest need with a quarter to spare, so the bytes stay proportional to the rows."""
        word = np.float32 if self.reducer is not None and all(t == np.float32 for _, t in shapes) else np.int32
        mine = pack(local, word)
        words = np.array([2 + w * np.dtype(t).itemsize // 4 for w, t in shapes])
        for _ in range(2):
            buffer = np.zeros(len(local) + self.capacity, word)
            buffer[:len(local)] = [len(rows) for rows, _ in local]
            fits = len(mine) <= self.capacity
            if fits:
                buffer[len(local):len(local) + len(mine)] = mine
            self.sent_bytes += buffer.nbytes
            got = self._gather(buffer, "sparse rows")
            counts = got[:, :len(local)].astype(np.int64)
            need = int((counts * words).sum(axis=1).max())
            if need <= self.capacity:
                if 4 * need < self.capacity:        # far too roomy now: shrink for the next step
                    self.capacity = need + need // 4
                return counts, got[:, len(local):]
            self.capacity = need + need // 4
        raise AssertionError("sparse rows: the capacity agreed on did not fit")

    def _gather(self, array: np.ndarray, what: str) -> np.ndarray:
        """The ranks' `array`s (the same shape on each), stacked in rank order: float32 ones
        through the CPU reducer, as a sum of each rank's slot and everyone else's zeros
        (exact: x + 0 is x, and the sum is the same bits on every rank), else all-gathered."""
        if array.dtype == np.float32 and self.reducer is not None:
            slots = np.zeros((self.env.world_size, len(array)), np.float32)
            slots[self.env.global_rank] = array
            guard = self.phase("comm", "all-reduce", slots.nbytes) if self.phase else contextlib.nullcontext()
            with guard:
                try:
                    self.reducer.all_reduce([slots.reshape(-1)], 1.0)
                except RuntimeError as exc:            # gloo's error, or shm.PeerGone
                    raise PeerFailure(f"{what} all-reduce failed: {first_line(exc)}") from exc
            return slots
        parts: list = []
        collective(dist.all_gather, parts, paddle.to_tensor(array), phase=self.phase, what=f"{what} all-gather")
        return np.stack([t.numpy() for t in parts])
