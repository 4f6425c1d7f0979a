"""What every command line shares: a parser whose errors are one line, the -c/-o options,
and how a command's end becomes its exit code. Entry points import this, never cli.

Example:
    parser = ArgParser(prog="python -m paddle_dist.doctor")
    add_config_options(parser)
    run(main)                 # exits with main's code, or the failure's (monitor.EXIT_*)
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import List, Optional

from . import errors
from .errors import UserError


class ArgParser(argparse.ArgumentParser):
    """argparse, but a bad option is one line on stderr (exit 2) like every other usage error."""

    def error(self, message):
        raise UserError(f"{self.prog}: {message} (see --help)")


def add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", default=None,
                        help="YAML config: a path or a name from configs/ (default: mnist_lenet)")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. -o train.api=hapi (repeatable)")


def rank_exit_code(exc: BaseException) -> int:
    """Say how a command or rank ended, in one place: a user error is one line; a peer's
    failure and a stop request were logged by the trainer already; anything else gets its
    traceback. Returns the exit code (monitor.EXIT_*)."""
    if isinstance(exc, SystemExit):
        return exc.code if isinstance(exc.code, int) else 1
    code = errors.exit_code_of(exc)
    if isinstance(exc, UserError):
        print(f"error: {exc}", file=sys.stderr, flush=True)
    elif code not in (errors.EXIT_PEER, errors.EXIT_PREEMPTED, errors.EXIT_INTERRUPTED):
        traceback.print_exception(exc)
        sys.stderr.flush()
    return code


def run(main, argv: Optional[List[str]] = None) -> None:
    """Run a command and exit with its code (see rank_exit_code for failures)."""
    try:
        code = main(argv)
    except BaseException as exc:  # noqa: BLE001 - every ending becomes an exit code
        code = rank_exit_code(exc)
    sys.exit(code)
