"""`python -m paddle_dist.launch [--nprocs N] [--gpus 0,1] [-c cfg] script.py [args]`: any
Paddle training script, data-parallel, with paddle_dist's devices, variables, gate and report.

Options are long and distinct (`--config/-c`, `--override/-o`) because
`paddle.distributed.launch` rejects script options that are prefixes of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import List, Optional

from .. import config as configlib
from .. import errors
from ..options import ArgParser, add_config_options, add_device_options, config_from_args, run
from ..runs import commands
from ..runtime import protocol
from ..security import exposure
from . import job, jobspec, launcher, preflight, supervisor


def launch_main(argv: Optional[List[str]] = None) -> int:
    """`python -m paddle_dist.launch`: run any Paddle script data-parallel."""
    parser = ArgParser(
        prog="python -m paddle_dist.launch",
        description="Run a Paddle training script on N processes with paddle_dist's device "
                    "selection and NCCL settings (the script calls init_parallel_env itself). "
                    "Without --nprocs or --gpus it runs one process (tools/spawn_train.py "
                    "starts 2). -c and -o reach the script's paddle_dist.load_config() and "
                    "paddle_dist.fit().")
    add_config_options(parser)
    add_device_options(parser)
    parser.add_argument("--log_dir", default="log",
                        help="where Paddle's launcher writes every rank's output (default: log)")
    parser.add_argument("--sync-buffers", action="store_true",
                        help="keep the BatchNorm statistics of every paddle.DataParallel the script "
                             "makes equal on every rank: after each training forward, those of one "
                             "process on all ranks' batches (one all-reduce per forward)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    try:
        return _launch_script(args)
    except KeyboardInterrupt:      # Ctrl+C before the ranks run (the supervisor handles it after)
        print("paddle_dist: interrupted", file=sys.stderr, flush=True)
        return errors.EXIT_INTERRUPTED


def _launch_script(args) -> int:
    script = Path(args.script)
    if not script.is_file():
        what = "is not a file" if script.exists() else "not found"
        raise errors.UserError(f"script {args.script!r} {what}; give the path of a Python file")
    # spawn needs a function; a script is run by launch
    spec = jobspec.resolve(config_from_args(args, ["dist.launcher=launch"]), script=args.script,
                           script_args=args.script_args)
    if spec.here.launcher != "standalone":
        raise errors.UserError("already inside a launched job; run the script directly")
    cfg = spec.cfg
    job.warn_unsupported()
    preflight.check(cfg, spec.facts.environ, spec.facts.gpus, warn=job.warn)
    p = launcher.plan(spec, log_dir=args.log_dir, always=True)
    job.isolate_if_asked(cfg)
    # The script's fit() (rank 0) chooses its run directory: only the script knows the
    # job's identity (its model, optimizer and data). It writes the directory here; the
    # launcher then reports from the ranks' status records and names the command that
    # continues the run. --log_dir (default: log/ here) is checked all the way first.
    supervisor.log_opener(Path(args.log_dir), "--log_dir")
    pointer = Path(args.log_dir).resolve() / "run_dir"
    pointer.unlink(missing_ok=True)          # a previous job's, in the same log directory
    # -c and -o reach the script's paddle_dist.load_config() and fit() (protocol.launch_options).
    # Every paddle.DataParallel the script makes gets --sync-buffers, or a warning where
    # BatchNorm statistics differ between ranks (runtime/scripthooks/), through PYTHONPATH.
    config = str(configlib.resolve_path(args.config).resolve()) if args.config else None
    p = dataclasses.replace(p, env={**p.env, **protocol.launch_variables(config, args.override),
                                    **launcher.SCRIPT_CHILD,
                                    **protocol.script_hooks(args.sync_buffers, spec.facts.environ),
                                    protocol.RUN_POINTER: str(pointer)})
    ranks = f"{p.nprocs} rank{'s' * (p.nprocs != 1)}"
    devices = f"GPUs {','.join(p.gpus)}" if p.gpus else "CPU"
    print(f"paddle_dist: starting {ranks} of {args.script} on {devices}; logs in {args.log_dir}/",
          flush=True)
    print(exposure.start_line(cfg), flush=True)
    started = time.monotonic()
    code = launcher.launch(p, script=supervisor.UserScript(tuple(commands.own_command()), pointer))
    if code == 0:
        print(f"paddle_dist: {ranks} finished in {time.monotonic() - started:.1f} s; "
              f"logs in {args.log_dir}/", flush=True)
    return code


def launch_entry() -> None:
    """Console command `paddle-dist-launch`."""
    run(launch_main)


if __name__ == "__main__":
    run(launch_main)
