"""Collective calls that fail as Python exceptions, and that the hang watchdog can see.

The lowest layer of the gradient sync (grad_sync, checks, reducers and overlap use it): a
collective whose peer died, hung or lost its connection raises `PeerFailure`, which the
trainer records and the supervisor's report names as a consequence, not a root cause.
Each one is marked in the rank's heartbeat (its kind, number and size:
runtime/watchdog.py), and so are the training code's own calls of paddle.distributed's
collectives while `watched()`.

Example:
    collective(dist.all_reduce, tensor, phase=monitor.phase, what="all-reduce of metrics")
    with watched(monitor.phase):
        ... a fit() whose callbacks call dist.all_reduce themselves ...
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Callable

from ..errors import PeerFailure

# paddle.distributed's collectives, and the kinds their waits are reported as (runtime/watchdog.py)
KINDS = {"all_reduce": "all-reduce", "broadcast": "broadcast", "reduce": "reduce",
         "all_gather": "all-gather", "all_gather_object": "all-gather-object", "barrier": "barrier",
         "scatter": "scatter", "reduce_scatter": "reduce-scatter", "alltoall": "all-to-all",
         "send": "send", "recv": "recv", "broadcast_object_list": "broadcast-object-list",
         "scatter_object_list": "scatter-object-list", "gather": "gather"}


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (gloo's run to many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def collective(fn, *args, phase=None, what: str = "collective", read: Callable = None, **kwargs):
    """Run a collective call, turning a peer's failure into PeerFailure. `read`: what
    reads its result back on the host (e.g. `tensor.numpy`), run inside the same phase and
    returned: over NCCL the call returns at once and the host waits at the read, so a
    hang there must count as one in this collective (runtime/watchdog.py names the ranks by it)."""
    kind = KINDS.get(getattr(fn, "__name__", ""), "collective")
    guard = phase("comm", kind, nbytes(args)) if phase else contextlib.nullcontext()
    with guard:
        try:
            out = fn(*args, **kwargs)
            return read() if read is not None else out
        except RuntimeError as exc:
            raise PeerFailure(f"{what} failed: {first_line(exc)}") from exc


def nbytes(values) -> int:
    """Bytes in the tensors (and numpy arrays) among `values`; 0 for anything else."""
    total = 0
    for value in values:
        try:
            if hasattr(value, "nbytes"):
                total += int(value.nbytes)
            elif hasattr(value, "element_size"):
                total += int(value.element_size()) * int(value.size)
        except (TypeError, ValueError, RuntimeError, AttributeError):
            pass
    return total


@contextlib.contextmanager
def watched(phase):
    """While inside, the main thread's calls of paddle.distributed's collectives (those the
    training code makes itself) are marked in the heartbeat, like paddle_dist's own."""
    import paddle.distributed as dist

    originals = {name: getattr(dist, name) for name in KINDS if callable(getattr(dist, name, None))}
    for name, fn in originals.items():
        setattr(dist, name, _marking(fn, KINDS[name], phase))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _marking(fn, kind: str, phase):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)     # a communication thread's: the main thread marks its wait
        with phase("comm", kind, nbytes(args)):
            return fn(*args, **kwargs)
    return call
