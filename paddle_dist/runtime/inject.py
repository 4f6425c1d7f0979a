"""Fault injection (`faults.inject: KIND:RANK:STEP`), for testing how failures end a job
(docs/faults.md). Rank RANK, at optimizer step STEP:

- raise: raises RuntimeError; exit: exits with code 1; kill: SIGKILLs itself;
- hang: stalls in training code; nativehang: stalls in a C call that holds the GIL;
- slowsave: the checkpoint of that step takes SLOW_SAVE_S longer to write;
- slow: SLOW_STEPS steps from STEP take SLOW_STEP_S longer each, with progress (slow but
  alive: never to be called hung);
- perturb: PERTURBATION is added to the first trainable parameter of that rank's model:
  its weights then differ from its peers', which the ranks' weights check must catch
  (trainer/agreement.py);
- term: SIGTERMs its parent (the launcher: a stop request, as a scheduler sends);
- interrupt: SIGINTs its parent (Ctrl+C in the terminal of the launcher);
  both at an exact step, where a signal from outside would land anywhere;
- lose: SIGKILLs its machine's paddle_dist launcher, whose ranks go with it: a machine
  lost at an exact step (an elastic job goes on without it: launch/job.py).

The rank's Monitor holds an Injector and calls it after every step, before a checkpoint
is written and after the optimizer step.

Example:
    injector = Injector("raise:1:5", rank=1)
    injector.after_step(5, beat=lambda: None)     # RuntimeError: injected fault: rank 1 raises at step 5
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Callable, Optional, Tuple

from .. import procfs
from ..errors import EXIT_FAILED

SLOW_SAVE_S = 35.0       # longer than gloo's fixed timeout of a collective (monitor.GLOO_TIMEOUT_S)
SLOW_STEP_S = 5.0        # the injected slow steps: each this much longer,
SLOW_STEPS = 3           # this many of them
PERTURBATION = 1e-3      # the injected perturb: added to one parameter of one rank
SIGNAL_WAIT_S = 30.0     # term, interrupt: the longest wait for the launcher's answer


def parse_fault(spec: str) -> Optional[Tuple[str, int, int]]:
    """'raise:1:5' -> ('raise', 1, 5): rank 1 raises after its 5th step. '' -> None."""
    if not spec:
        return None
    kind, rank, step = spec.split(":")
    return kind, int(rank), int(step)


class Injector:
    """The fault `spec` ('' for none) as rank `rank` acts on it."""

    def __init__(self, spec: str, rank: int):
        self.fault = parse_fault(spec)
        self.rank = rank

    def _due(self, step: int) -> bool:
        return bool(self.fault) and self.fault[1] == self.rank and step >= self.fault[2]

    def _at(self, kind: str, step: int) -> bool:
        """Whether fault `kind` is this rank's at exactly `step`."""
        return self._due(step) and self.fault[0] == kind and step == self.fault[2]

    def after_step(self, step: int, beat: Callable[[], None],
                   stop_seen: Callable[[], bool] = lambda: False) -> None:
        """After optimizer step `step`: the fault due then, if any; `beat` marks progress
        (a slow step is slow but alive); `stop_seen`: whether this rank has received its
        stop request (term waits for it, so the stop lands at this step, not after the end)."""
        if self._due(step) and self.fault[2] == step:
            self._inject(self.fault[0], step)
            if self.fault[0] in ("term", "interrupt"):
                _await_signal(stop_seen, beat)
        if self._due(step) and self.fault[0] == "slow" and step < self.fault[2] + SLOW_STEPS:
            _slow_step(beat)

    def save_delay(self, step: int) -> Optional[Callable[[], None]]:
        """The injected slow save, for the checkpoint of exactly that step."""
        return (lambda: time.sleep(SLOW_SAVE_S)) if self._at("slowsave", step) else None

    def perturb(self, model, step: int) -> None:
        """The injected perturb, after optimizer step `step`: PERTURBATION added to the
        first trainable parameter of this rank's `model`, so that its weights differ from
        its peers' from then on (the gradients stay averaged: the difference stays)."""
        if not self._at("perturb", step):
            return
        import paddle

        param = next(p for p in model.parameters() if not p.stop_gradient)
        with paddle.no_grad():
            param.set_value(param + PERTURBATION)

    def _inject(self, kind: str, step: int) -> None:
        # Named so: a hung rank's recorded stack shows `_inject` where it was stuck.
        if kind == "raise":
            raise RuntimeError(f"injected fault: rank {self.rank} raises at step {step}")
        if kind == "exit":
            os._exit(EXIT_FAILED)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "term":
            os.kill(os.getppid(), signal.SIGTERM)
        if kind == "interrupt":
            os.kill(os.getppid(), signal.SIGINT)
        if kind == "lose":
            os.kill(_machine_launcher(), signal.SIGKILL)
            threading.Event().wait(SIGNAL_WAIT_S)   # until the launcher's end ends this rank
        if kind == "hang":
            threading.Event().wait()   # a stall in user code: no progress, no collective
        if kind == "nativehang":       # a C call that never returns and keeps the GIL
            libc = ctypes.PyDLL(None)
            while True:
                libc.sleep(3600)       # (a signal ends one sleep; the next one starts)
        # slowsave acts in save_delay(); slow in after_step(); perturb in perturb()


def _machine_launcher() -> int:
    """This rank's paddle_dist launcher: its parent, or, under Paddle's launcher (a
    multi-node launch), its parent's."""
    parent = os.getppid()
    if "paddle.distributed.launch" in procfs.cmdline(parent):
        return procfs.parent_of(parent)
    return parent


def _await_signal(seen: Callable[[], bool], beat: Callable[[], None]) -> None:
    """Until the launcher's answer to an injected signal has reached this rank: a stop
    request (`seen()`) or SIGINT (KeyboardInterrupt, raised from inside the wait); at
    most SIGNAL_WAIT_S."""
    end = time.monotonic() + SIGNAL_WAIT_S
    while not seen() and time.monotonic() < end:
        time.sleep(0.01)
        beat()


def _slow_step(beat: Callable[[], None]) -> None:
    """SLOW_STEP_S more for this step, with progress all along: a rank slower than its
    peers but alive (its evaluation batches, say), which must not be called hung."""
    end = time.monotonic() + SLOW_STEP_S
    while time.monotonic() < end:
        time.sleep(0.25)
        beat()
