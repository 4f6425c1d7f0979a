"""A user error in a script of one's own ends it as it ends a launcher: one line on stderr
and exit 2, not a traceback and exit 1, under every launcher (python my_script.py,
`python -m paddle_dist.launch`, `python -m paddle.distributed.launch`).

The functions a script calls (paddle_dist.load_config, setup, fit, detect) are given it
through `for_scripts`: a UserError they raise is printed as `paddle_dist: error: <what is
wrong and how to fix it>` (the launcher's own line for the same mistake is `error: ...`)
and raised again as `Refused`, a SystemExit of code 2 (an ending, as faults.Preempted is)
that is also the UserError's own class, so that `except ConfigError` in a script still
catches it. A launcher's report finds the line in a rank's output (report._refused); a
rank that fit() was running records the state "refused" (faults.outcome_of).

Under `paddle.distributed.spawn`, Paddle's `except Exception` around each rank catches it
first and spawn raises it again in the parent with the rank's traceback: a script that
loads its config before spawn stops there, with the one line.

Example:
    load_config = for_scripts(load_config)
"""

from __future__ import annotations

import functools
import sys
from typing import Dict

from .errors import UserError
from .faults import EXIT_USAGE, _Ending

REFUSAL_LINE = "paddle_dist: error: "    # how a script's rank says it (report.py finds it)


class Refused(_Ending):
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
    # Exception.__init__ comes before _Ending's in the class's MRO, and is not called here:
    # SystemExit's code and _Ending's message are set as _Ending.__init__ would.
    ending.code, ending.message = EXIT_USAGE, str(exc)
    ending.__cause__, ending.__suppress_context__ = exc.__cause__, True   # not "during handling of"
    return ending.with_traceback(exc.__traceback__)


def for_scripts(function):
    """`function` as paddle_dist gives it to a script: a UserError it raises is printed as
    one line on stderr and raised again as a Refused (module docstring).

    Example:
        setup = for_scripts(runtime.setup)
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
