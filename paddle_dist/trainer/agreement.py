"""The ranks check each other: at every checkpoint and at the end of training, each rank
digests its parameters, buffers and moving averages and the ranks compare the digests in
one all-gather; before every evaluation they compare what they are about to evaluate
with (`check_evaluated`: after the callbacks' on_eval_begin, which may swap weights in).

Data parallelism keeps every rank's weights bitwise equal: the same start, the same
averaged gradients, the same optimizer. When they differ, something broke it (an update
that draws its own random numbers, a parameter the gradient sync never sees, a buffer
changed on one rank alone, a faulty device), and a checkpoint would keep rank 0's
weights as if they were everyone's. The job then ends with exit 7 (errors.Diverged) and
one line naming the first parameter that differs and which ranks hold which value,
before the checkpoint is written.

A digest is the CRC-32 of a tensor's bytes, read in place (compat.numpy_view: no copy on
the CPU): about 4 GB/s on one core, and a one-element change is always seen (CRC-32
catches every change of up to 32 consecutive bits; any other with odds 1 - 2**-32). The
ranks exchange one int64 per tensor, in state_dict order.

Example:
    check(net, env, step=12, phase=monitor.phase)     # returns, or raises errors.Diverged
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from ..sync.collectives import collective
from ..compat import numpy_view, state_tensors
from ..errors import Diverged
from ..runtime.env import DistEnv

# How the line counts the different values of one tensor; beyond these, how many more.
ORDINALS = ("one", "a second", "a third")


def tensor_digest(tensor) -> int:
    """CRC-32 of a tensor's bytes (read in place when it is a contiguous CPU tensor).

    Example:
        tensor_digest(paddle.zeros([2]))      # 1696784233
    """
    try:
        if tensor.place.is_cpu_place() and tensor.is_contiguous():
            return zlib.crc32(numpy_view(tensor.detach()))
    except (TypeError, BufferError, AttributeError, RuntimeError):
        pass          # a dtype numpy cannot view, or a device tensor: a copy on the host
    return zlib.crc32(np.ascontiguousarray(tensor.numpy()).reshape(-1).view(np.uint8))


def digests(model, extra: Optional[Mapping[str, object]] = None) -> Tuple[List[str], np.ndarray]:
    """(state_dict keys, their digests as int64), in state_dict order: the same keys, in
    the same order, on every rank of a job. The model's own tensors are read (an O2
    model's state_dict() would cast copies); `extra`: more tensors by name (the moving
    averages), after them."""
    state = dict(state_tensors(model))
    state.update(extra or {})
    return list(state), np.fromiter((tensor_digest(t) for t in state.values()), dtype=np.int64,
                                     count=len(state))


def disagreement(names: Sequence[str], gathered: Sequence[Sequence[int]]) -> str:
    """Where the ranks' digests first differ, in words ("" when they all agree):
    `gathered[r]` is rank r's digests of `names`.

    Example:
        disagreement(["w", "b"], [[1, 2], [1, 3], [1, 2]])
        # "'b' is one value on ranks 0, 2 and another on rank 1"
    """
    table = np.asarray(gathered)
    differs = np.flatnonzero((table != table[:1]).any(axis=0))
    if differs.size == 0:
        return ""
    column = table[:, differs[0]]
    groups: dict = {}
    for rank, value in enumerate(column.tolist()):
        groups.setdefault(value, []).append(rank)
    # The most common value first (the odd ones out come last); on a tie, rank 0's first.
    ordered = sorted(groups.values(), key=lambda ranks: (-len(ranks), ranks[0]))
    name = f"'{names[differs[0]]}'"
    if len(ordered) == 2:
        return f"{name} is one value on {rank_words(ordered[0])} and another on {rank_words(ordered[1])}"
    named = [f"{ordinal} on {rank_words(ranks)}" for ordinal, ranks in zip(ORDINALS, ordered)]
    rest = len(ordered) - len(named)
    listed = ", ".join(named[:-1]) + (f", {named[-1]} and {rest} more on the other ranks" if rest
                                      else f" and {named[-1]}")
    return f"{name} has {len(ordered)} different values: {listed}"


def rank_words(ranks: Sequence[int]) -> str:
    """'rank 1', 'ranks 0, 2', 'ranks 0-5, 7': runs of three or more as a range.

    Example:
        rank_words([0, 1, 2, 3, 5])     # 'ranks 0-3, 5'
    """
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    runs: List[List[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    words = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return "ranks " + ", ".join(words)


def check(model, env: DistEnv, step: int, phase=None, averages: Optional[Mapping[str, object]] = None,
          explain: Callable[[str], str] = lambda where: "") -> None:
    """Compare this rank's weights, buffers and `averages` (the moving averages, by name)
    with every other rank's (one all-gather: every rank must call it at the same point);
    raise errors.Diverged when they differ. Nothing to compare in a job of one process.
    `explain(where)`: the likely cause when the first tensor that differs is one of a kind
    (a sparse table: sync/sparse.py's Tables.explain), else ''."""
    named = {f"moving average of {key}": value for key, value in (averages or {}).items()}
    where = _compare(model, env, step, phase, named)
    if where:
        raise Diverged(f"the ranks' weights differ at step {step}: {where}; "
                       + (explain(where) or "data parallelism broke (docs/faults.md)"))


def check_evaluated(model, env: DistEnv, step: int, phase=None) -> None:
    """Compare the weights and buffers the ranks are about to evaluate with (after the
    callbacks' on_eval_begin, which may swap weights in); raise errors.Diverged, naming the
    first tensor that differs and the likely cause, when they differ: each rank would
    score its share of the eval set with another model, and the metric would be no
    single model's."""
    where = _compare(model, env, step, phase, {})
    if where:
        raise Diverged(f"the ranks would evaluate different weights after step {step}: {where}. "
                       "A callback that puts its own weights in at on_eval_begin (an EMA of "
                       "per-rank state?) made them differ; use train.ema_decay instead, whose "
                       "averages are the same on every rank (docs/own_model.md)")


def _compare(model, env: DistEnv, step: int, phase, extra) -> str:
    if not env.is_distributed:
        return ""
    started = time.perf_counter()
    names, mine = digests(model, extra)
    if not names:
        return ""
    digested = time.perf_counter()
    gathered: list = []
    theirs = collective(dist.all_gather, gathered, paddle.to_tensor(mine), phase=phase, what="weights check",
                        read=lambda: [g.numpy() for g in gathered])
    log = logging.getLogger("paddle_dist")
    if log.isEnabledFor(logging.DEBUG):
        log.debug(f"weights check at step {step}: {len(names)} tensors digested in "
                  f"{(digested - started) * 1e3:.2f} ms, compared in "
                  f"{(time.perf_counter() - digested) * 1e3:.2f} ms")
    return disagreement(names, theirs)
