"""What every command line shares: a parser whose errors are one line, the -c/-o options
(and --eval-only, --nprocs, --gpus) read into one config, and how a command's end becomes
its exit code.

Example:
    parser = ArgParser(prog="python -m paddle_dist.doctor")
    add_config_options(parser)
    run(main)                 # exits with main's code, or the failure's (errors.EXIT_*)
"""

from __future__ import annotations

import argparse
import sys
import traceback
from typing import List, Optional

from . import config as configlib
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


def add_eval_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval-only", action="store_true",
                        help="evaluate the checkpoint given by -o checkpoint.resume=PATH on the "
                             "test set and write metrics.json; train nothing (train.eval_only)")


def add_device_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nprocs", type=int, default=None,
                        help="processes on this machine (default: one per --gpus id, else dist.nprocs)")
    parser.add_argument("--gpus", default=None,
                        help="GPU ids, e.g. 0,1 (physical ids, members of CUDA_VISIBLE_DEVICES)")


def config_from_args(args, extra: List[str] = ()) -> configlib.Config:
    """The config a command line asks for: -c, then -o, then what --eval-only, --nprocs and
    --gpus (where the parser has them) and `extra` say.

    Example:
        cfg = config_from_args(parser.parse_args(["-o", "train.epochs=1", "--nprocs", "2"]))
    """
    overrides = list(args.override) + list(extra)
    if getattr(args, "eval_only", False):
        overrides.append("train.eval_only=true")
    nprocs, gpus = getattr(args, "nprocs", None), getattr(args, "gpus", None)
    if nprocs is not None:
        if nprocs < 1:
            raise UserError(f"--nprocs must be >= 1 (got {nprocs}); use 2 for two processes")
        overrides.append(f"dist.nprocs={nprocs}")
    if gpus is not None:
        if not gpus.strip():
            raise UserError("--gpus is empty; give GPU ids such as 0,1, or drop --gpus to train on CPU")
        overrides.append(f"dist.gpus={gpus}")
    return configlib.load(args.config, overrides)


def rank_exit_code(exc: BaseException) -> int:
    """Say how a command or rank ended, in one place: a user error is one line; a peer's
    failure and a stop request were logged by the trainer already; anything else gets its
    traceback. Returns the exit code (errors.EXIT_*)."""
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
