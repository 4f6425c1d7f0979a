"""`python -m paddle_dist.train [-c cfg] [-o key=value ...]`: the built-in job's command line.

train.py (the checkout's) and tools/spawn_train.py are this command line. When it starts its
own ranks (`-o dist.nprocs=2`), they run `python -m paddle_dist.train ...` (or train.py)
too, and take the config their launcher resolved (launch/job.py), not their -c/-o again.
Under `python -m`, the ranks never run this file as a script: a script's directory comes
first on sys.path, and the package's module names would shadow others there.

Example:
    $ python -m paddle_dist.train -o dist.nprocs=2 -o train.epochs=1
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Tuple

from .config import replace_key
from .options import ArgParser, add_config_options, add_device_options, add_eval_only, config_from_args, run
from .runs import commands
from .runtime import env as envlib, protocol, variables as varlib


def train_main(argv: Optional[List[str]] = None) -> int:
    """train.py and `python -m paddle_dist.train`: one process, or the ranks of a launched
    job, or (dist.nprocs > 1) a launcher whose ranks run the same command."""
    script, module = this_command()
    parser = ArgParser(prog=f"python -m {module}" if module else "train.py",
                       description="Train a paddle_dist job: in this process, or on the ranks it starts.")
    add_config_options(parser)
    add_eval_only(parser)
    hand = parser.add_argument_group("a rank started by hand, one process per command (tcp:// style)")
    hand.add_argument("--master", help="rank 0's host:port, the same for every rank")
    hand.add_argument("--world-size", type=int, help="number of ranks in the job")
    hand.add_argument("--rank", type=int, help="this process's rank, 0 .. world size - 1")
    hand.add_argument("--local-rank", type=int,
                      help="the rank's index among this machine's ranks, which picks its GPU "
                           "(default: an inherited LOCAL_RANK, else 0)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    resolved = protocol.resolved_config()
    if resolved is not None:        # a rank that this command launched: the config resolved there
        from . import worker

        return worker.run_resolved(resolved)
    from .launch import job

    cfg = config_from_args(args)
    if args.master or any(v is not None for v in (args.world_size, args.rank, args.local_rank)):
        varlib.export(envlib.hand_started(args.master, args.world_size, args.rank, args.local_rank))
    return job.run(cfg, script=script, script_args=argv, module=module)


def spawn_main(argv: Optional[List[str]] = None) -> int:
    """tools/spawn_train.py: the same job through `paddle.distributed.spawn`."""
    parser = ArgParser(prog="spawn_train.py", description="Train through paddle.distributed.spawn.")
    add_config_options(parser)
    add_eval_only(parser)
    add_device_options(parser)
    args = parser.parse_args(argv)
    from .launch import job

    cfg = config_from_args(args, ["dist.launcher=spawn"])
    if cfg.dist.nprocs is None and not cfg.dist.gpus:
        cfg = replace_key(cfg, "dist.nprocs", 2)     # nothing said how many: spawning one would be pointless
    return job.run(cfg)


def this_command() -> Tuple[str, str]:
    """(script, module) that runs this command again: ("/abs/train.py", "") for a script;
    ("", "paddle_dist.train") under `python -m paddle_dist.train`, whose sys.argv[0] is
    the module's file, which must not be run as a script (launcher.python_args)."""
    module = commands.main_module()
    return ("", module) if module else (os.path.abspath(sys.argv[0]), "")


if __name__ == "__main__":
    run(train_main)
