"""Waiting for the other machines of a multi-node launch, before any rank starts: one line
and the job's exit code for each way the wait can end.

Example:
    code, met = wait_for_machines(gate)
"""

from __future__ import annotations

import signal
import sys
from typing import Optional, Tuple

from .. import errors
from . import rendezvous
from .host import KeptListener


class _StopRequested(Exception):
    pass


def _raise_stop(signum, frame):
    raise _StopRequested()


def wait_for_machines(gate: rendezvous.MeetingPlace,
                      kept: Optional[KeptListener] = None) -> Tuple[int, Optional[rendezvous.Meeting]]:
    """Wait for the other machines (rendezvous.meet): (0, what they learnt) when all
    arrived, else (the job's exit code, None) after one line: 3 (a node missing), 143
    (SIGTERM/SIGUSR1), 130 (Ctrl+C). Nothing has started yet, so a stop request ends the
    wait at once: there is nothing to save. `kept`: node 0's listener, kept across the
    job's attempts (host.KeptListener).

    Example:
        code, met = wait_for_machines(gate)   # 0, Meeting(run='mnist_lenet-...', nodes={0: ..., 1: ...})
    """
    who = "the other machines" if gate.node_rank == 0 else "node 0 and the other machines"
    limit = f" (up to {gate.timeout:g} s)" if gate.timeout > 0 else ""
    old = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGUSR1):      # inside the try: one may land at once
            old[sig] = signal.signal(sig, _raise_stop)
        print(f"paddle_dist: waiting for {who} at {gate.master}{limit}", flush=True)
        return 0, rendezvous.meet(gate, kept)
    except rendezvous.NodesMissing as e:
        print(e, file=sys.stderr, flush=True)
        return errors.EXIT_RENDEZVOUS, None
    except _StopRequested:
        code = 128 + signal.SIGTERM
        print(f"paddle_dist: stopped on request while waiting for the other machines (exit {code}); "
              "no rank had started: run the same command again to start the job", file=sys.stderr, flush=True)
        return code, None
    except KeyboardInterrupt:
        print("paddle_dist: interrupted while waiting for the other machines; no rank had started",
              file=sys.stderr, flush=True)
        return errors.EXIT_INTERRUPTED, None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
