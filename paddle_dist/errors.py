"""How paddle_dist's processes end: the errors a user can fix, the exit codes, and the
endings that carry them.

- `UserError` and its kinds: bad input. Entry points print it as one line and exit 2.
- `EXIT_*`: every exit code a launcher or rank ends with (docs/faults.md).
- `JobEnding`: a SystemExit that ends a rank with its code and one line, no traceback
  (Preempted, StoppedByPeer, Diverged, Interrupted, Refused).
- `PeerFailure`: a collective failed because of another rank.
- `for_scripts`: a UserError in a script of one's own ends it as it ends a launcher, one
  line on stderr and exit 2, under every launcher (python my_script.py, `python -m
  paddle_dist.launch`, `python -m paddle.distributed.launch`). It is raised again as a
  `Refused` that is also the UserError's own class, so `except ConfigError` still
  catches it; under `paddle.distributed.spawn`, spawn raises it again in the parent.

Example:
    raise UserError("train.epochs must be >= 1 (got 0); set -o train.epochs=5")
    sys.exit(exit_code_of(exc))
"""

from __future__ import annotations

import functools
import sys
from typing import Dict, Union

# Exit codes (documented in docs/faults.md).
EXIT_FAILED = 1          # a rank raised
EXIT_USAGE = 2           # bad input
EXIT_RENDEZVOUS = 3      # peers never arrived
EXIT_HANG = 4            # a rank made no progress for dist.hang_timeout seconds
EXIT_PEER = 5            # this rank stopped because another one failed
EXIT_SECURITY = 6        # something without the job's token took part in its store (attest.py)
EXIT_DIVERGED = 7        # the ranks' weights differ: data parallelism broke (trainer/agreement.py)
EXIT_PREEMPTED = 75      # stopped on request after saving a checkpoint: requeue me
EXIT_INTERRUPTED = 130   # Ctrl+C


class UserError(Exception):
    """Bad input: a config, an option, a data file. The message says what and how to fix it.

    Example:
        raise UserError("train.epochs must be >= 1 (got 0); set -o train.epochs=5")
    """


class ConfigError(UserError):
    """A config file, key or value is wrong."""


class DataError(UserError):
    """A dataset is missing, incomplete or corrupted."""


class DeviceError(UserError):
    """Devices were asked for that this machine or Paddle build cannot give."""


class PeerFailure(RuntimeError):
    """A collective failed: another rank died, hung, or the connection broke."""


class CommThreadError(Exception):
    """paddle_dist's communication thread failed on this rank for a reason of its own (not a
    peer's): a root cause, reported with the exception it met."""


class JobEnding(SystemExit):
    """How fit() ends a rank of a script of one's own: a SystemExit with the exit code
    `CODE`, so that, left uncaught, it ends the process with that code and no traceback
    (a script may still catch it). `str()` is its one-line message."""

    CODE = EXIT_FAILED

    def __init__(self, message: str = ""):
        super().__init__(self.CODE)
        self.message = message

    def __str__(self) -> str:
        return self.message


class Preempted(JobEnding):
    """A stop was requested (SIGTERM/SIGUSR1); raised after the checkpoint is saved. Exit 75
    is what a scheduler that requeues expects."""

    CODE = EXIT_PREEMPTED


class StoppedByPeer(JobEnding):
    """Another rank failed and fit() stopped this one (exit 5): one line, not a traceback
    of a consequence; the launcher or rank 0 names the root cause."""

    CODE = EXIT_PEER


class Diverged(JobEnding):
    """The ranks' weights differ (exit 7): data parallelism broke. Every rank finds it in
    the same check (trainer/agreement.py), before the checkpoint it would have spoilt, and
    the run is never continued (rundir.diverged). `str()` is the one line that names the
    first parameter that differs and which ranks hold which value."""

    CODE = EXIT_DIVERGED


class Interrupted(JobEnding):
    """Ctrl+C in fit() (exit 130): one line, not a KeyboardInterrupt traceback through
    Paddle's and its own frames."""

    CODE = EXIT_INTERRUPTED

    def __init__(self, message: str = "interrupted"):
        super().__init__(message)


def outcome_of(exc: BaseException) -> str:
    """The state a rank ends in when `exc` stops it."""
    if isinstance(exc, Preempted):
        return "preempted"
    if isinstance(exc, Diverged):
        return "diverged"
    if isinstance(exc, UserError):          # a Refused too: each is one
        return "refused"
    if isinstance(exc, (PeerFailure, StoppedByPeer, KeyboardInterrupt, Interrupted)):
        return "stopped"
    return "failed"


def exit_code_of(ending: Union[BaseException, int]) -> int:
    """The exit code a shell sees for a process that `ending` ended: an exception that ends
    a rank, or a process's return code (negative: killed by that signal, so 128 + its
    number, as a shell reports it).

    Example:
        exit_code_of(Preempted("stopped"))    # 75
        exit_code_of(-9)                      # 137: SIGKILL
    """
    if isinstance(ending, int):
        return 128 - ending if ending < 0 else ending
    exc = ending
    if isinstance(exc, JobEnding):       # each says its own (Preempted, Diverged, attest's, ...)
        return exc.CODE
    for kind, code in ((Preempted, EXIT_PREEMPTED), (PeerFailure, EXIT_PEER), (StoppedByPeer, EXIT_PEER),
                       (UserError, EXIT_USAGE), (KeyboardInterrupt, EXIT_INTERRUPTED),
                       (Interrupted, EXIT_INTERRUPTED)):
        if isinstance(exc, kind):
            return code
    return EXIT_FAILED


REFUSAL_LINE = "paddle_dist: error: "    # how a script's rank says it (report.py finds it)


class Refused(JobEnding):
    """Bad input (exit 2), once its one line is printed; raised as `refused(exc)`, an
    instance of the UserError's class too. Left uncaught, it ends the process with 2 and
    no traceback."""

    CODE = EXIT_USAGE


_KINDS: Dict[type, type] = {}     # a UserError's class -> that class and Refused


def refused(exc: UserError) -> Refused:
    """`exc` as a Refused of its own class, with its message, attributes, cause and
    traceback: `refused(ConfigError("..."))` is a ConfigError and a SystemExit.

    Example:
        except ConfigError as exc:
            raise refused(exc)
    """
    kind = type(exc)
    if kind not in _KINDS:
        _KINDS[kind] = type(kind.__name__, (kind, Refused), {
            "__module__": kind.__module__, "__qualname__": kind.__qualname__,
            # pickled (to another process), it is the plain error again: its class by name
            "__reduce__": lambda self: (kind, self.args, self.__dict__ or None)})
    ending = _KINDS[kind].__new__(_KINDS[kind], *exc.args)    # no __init__: any signature
    ending.__dict__.update(vars(exc))
    # Exception.__init__ comes before JobEnding's in the class's MRO, and is not called here:
    # SystemExit's code and JobEnding's message are set as JobEnding.__init__ would.
    ending.code, ending.message = EXIT_USAGE, str(exc)
    ending.__cause__, ending.__suppress_context__ = exc.__cause__, True   # not "during handling of"
    return ending.with_traceback(exc.__traceback__)


def for_scripts(function):
    """`function` as paddle_dist gives it to a script: a UserError it raises is printed as
    one line on stderr and raised again as a Refused (module docstring).

    Example:
        setup = for_scripts(process.setup)
    """
    @functools.wraps(function)
    def public(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except UserError as exc:
            if isinstance(exc, Refused):      # said already: a public function inside another
                raise
            print(f"{REFUSAL_LINE}{exc}", file=sys.stderr, flush=True)
            raise refused(exc)
    return public
