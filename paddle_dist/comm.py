"""Collective calls that fail as Python exceptions: `PeerFailure` and `collective()`.

The lowest layer of the gradient sync (sync.py, reducers.py and overlap.py use it): a
collective whose peer died, hung or lost its connection raises `PeerFailure`, which the
trainer records and the supervisor's report names as a consequence, not a root cause.

Example:
    collective(dist.all_reduce, tensor, phase=monitor.phase, what="all-reduce of metrics")
"""

from __future__ import annotations

import contextlib


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, hung, or the connection broke."""


class CommThreadError(Exception):
    """paddle_dist's communication thread failed on this rank for a reason of its own (not a
    peer's): a root cause, reported with the exception it met."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (gloo's run to many lines)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def collective(fn, *args, phase=None, what: str = "collective", **kwargs):
    """Run a collective call, turning a peer's failure into PeerFailure."""
    guard = phase("comm") if phase else contextlib.nullcontext()
    with guard:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as exc:
            raise PeerFailure(f"{what} failed: {first_line(exc)}") from exc
