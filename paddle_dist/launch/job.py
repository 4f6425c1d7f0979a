"""Command lines: train.py, tools/spawn_train.py and `python -m paddle_dist.launch`.
`python -m paddle_dist.train` is train.py's command line for an installed package.

Options are long and distinct (`--config/-c`, `--override/-o`) because
`paddle.distributed.launch` rejects script options that are prefixes of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

import shlex

from .. import errors
from .. import config as configlib
from ..runtime import devices as devicelib, env as envlib, protocol, variables as varlib
from ..trainer import amp
from .. import cifar, compat
from ..runtime import engines, netcheck
from ..security import exposure, private
from ..data import mnist as idx
from . import launcher, preflight
from ..runs import commands, rundir
from . import isolate, supervisor
from ..errors import UserError
from ..options import ArgParser, add_config_options, run


# Exit codes no restart can change: success, bad input, a stop request (saved, or before
# anything started: 143), Ctrl+C, machines that did not all arrive in time, and ranks whose
# weights diverged (a run never continued: docs/faults.md).
FINAL = (0, errors.EXIT_USAGE, errors.EXIT_PREEMPTED, errors.EXIT_INTERRUPTED, 128 + 15,
         errors.EXIT_RENDEZVOUS, errors.EXIT_DIVERGED)


def _eval_only(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--eval-only", action="store_true",
                        help="evaluate the checkpoint given by -o checkpoint.resume=PATH on the "
                             "test set and write metrics.json; train nothing (train.eval_only)")


def _devices(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nprocs", type=int, default=None,
                        help="processes on this machine (default: one per --gpus id, else dist.nprocs)")
    parser.add_argument("--gpus", default=None,
                        help="GPU ids, e.g. 0,1 (physical ids, members of CUDA_VISIBLE_DEVICES)")


def _load(args, extra: List[str] = ()) -> configlib.Config:
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


def train_main(argv: Optional[List[str]] = None) -> int:
    """train.py and `python -m paddle_dist.train`: one process, or the ranks of a launched
    job, or (dist.nprocs > 1) a launcher whose ranks run the same command."""
    script, module = _this_command()
    parser = ArgParser(prog=f"python -m {module}" if module else "train.py",
                       description=__doc__.splitlines()[0])
    add_config_options(parser)
    _eval_only(parser)
    hand = parser.add_argument_group("a rank started by hand, one process per command (tcp:// style)")
    hand.add_argument("--master", help="rank 0's host:port, the same for every rank")
    hand.add_argument("--world-size", type=int, help="number of ranks in the job")
    hand.add_argument("--rank", type=int, help="this process's rank, 0 .. world size - 1")
    hand.add_argument("--local-rank", type=int,
                      help="the rank's index among this machine's ranks, which picks its GPU "
                           "(default: an inherited LOCAL_RANK, else 0)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    cfg = _load(args)
    if args.master or any(v is not None for v in (args.world_size, args.rank, args.local_rank)):
        varlib.export(envlib.hand_started(args.master, args.world_size, args.rank, args.local_rank))
    return _run_job(cfg, script=script, script_args=argv, module=module)


def _isolate(cfg: configlib.Config, module: str = "") -> None:
    """dist.isolate: move this launcher, before it starts anything, into a network namespace
    of the job's own (isolate.py); as a user other than root, by running this command again
    through isolate.py."""
    if not cfg.dist.isolate or isolate.isolated():
        return
    if cfg.dist.nnodes > 1 or cfg.dist.launcher == "mpirun" or cfg.dist.hostfile:
        raise UserError("dist.isolate=true keeps a job inside one machine's private loopback; a job on "
                        "several machines cannot use it: remove -o dist.isolate=true")
    if os.geteuid() != 0:
        module = module or commands.main_module()
        isolate.rerun_inside([sys.executable, "-m", module, *sys.argv[1:]] if module else
                             [sys.executable, *sys.argv])
    try:
        isolate.enter()
    except isolate.Unavailable as e:
        raise UserError(f"dist.isolate=true: this machine refuses a private network namespace: {e}; "
                        "run without -o dist.isolate=true (docs/security.md)") from None


def _this_command() -> Tuple[str, str]:
    """(script, module) that runs this command again: ("/abs/train.py", "") for a script;
    ("", "paddle_dist.train") under `python -m paddle_dist.train`, whose sys.argv[0] is
    the module's file, which must not be run as a script (launcher.python_args)."""
    module = commands.main_module()
    return ("", module) if module else (os.path.abspath(sys.argv[0]), "")


def spawn_main(argv: Optional[List[str]] = None) -> int:
    """tools/spawn_train.py: the same job through `paddle.distributed.spawn`."""
    parser = ArgParser(prog="spawn_train.py", description="Train through paddle.distributed.spawn.")
    add_config_options(parser)
    _eval_only(parser)
    _devices(parser)
    cfg = _load(parser.parse_args(argv), ["dist.launcher=spawn"])
    if cfg.dist.nprocs is None and not cfg.dist.gpus:
        cfg.dist.nprocs = 2           # nothing said how many: spawning one would be pointless
    return _run_job(cfg)


def _run_job(cfg: configlib.Config, script: str = "", script_args: List[str] = (),
             module: str = "") -> int:
    """Run the built-in job: here, or as the ranks it starts, each running `script` (or
    `-m module`) with `script_args`."""
    private.closed_umask(cfg.output.share)
    environ, gpu_info, cores = varlib.host_facts()
    node = engines.srun_node_launcher(environ, cfg.dist.nprocs)
    if node is not None:
        _as_node_launcher(cfg, node)
    here = envlib.detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend, gpu_info=gpu_info,
                         environ=engines.as_launcher(environ) if node else environ)
    # What every plan below shares: the ranks' command and this host's facts.
    facts = dict(script=script, module=module, environ=environ, gpu_info=gpu_info, cpu_count=cores)
    p = launcher.plan(cfg, here, script_args=script_args, **facts)
    if p.mode == "none":
        from .. import worker

        worker.main(cfg)
        return 0
    _isolate(cfg, module)
    compat.warn_unsupported(_warn)      # the ranks, supervised, leave it to this process
    configlib.check_pairing(cfg)
    amp.plan(cfg.train, "gpu" if p.gpus else "cpu", bf16_supported=lambda: True,   # CPU: refused
             fp16_supported=lambda: True)
    configlib.check_compress(cfg.sync.compress, devicelib.select_backend(
        cfg.dist.backend, "gpu" if p.gpus else "cpu", p.nprocs))
    preflight.check(cfg, environ, gpu_info, warn=_warn)
    _check_data(cfg)
    if cfg.dist.master and (cfg.dist.nnodes > 1 or cfg.dist.hostfile):
        netcheck.check(cfg.dist.master, cfg.dist.nccl.socket_ifname)
        if cfg.dist.nnodes > 1 and not cfg.dist.host:
            cfg.dist.host = netcheck.route_to(cfg.dist.master.rpartition(":")[0])[0]
            p = launcher.plan(cfg, here, script_args=script_args, **facts)
    if p.mode == "mpirun" and not cfg.dist.master:
        first = launcher.hostfile_first_host(cfg.dist.hostfile) if cfg.dist.hostfile else "127.0.0.1"
        cfg.dist.master = f"{first}:{launcher.free_port()}"
        p = launcher.plan(cfg, here, script_args=script_args, **facts)
    world = p.nprocs * (cfg.dist.nnodes if p.mode == "launch" else 1)
    run_dir = None        # another machine of a multi-node launch: node 0 names it (_meet)
    if p.gate is None or cfg.dist.node_rank == 0:
        choice = rundir.choose(cfg, world, commands.own_command())
        run_dir = choice.path
        cfg.output.run_dir = str(run_dir)
        if choice.note:
            print(f"paddle_dist: {choice.note}", flush=True)
    ranks = f"{p.nprocs} rank{'s' * (p.nprocs != 1)}" + (f" on this machine ({world} in all)"
                                                          if world != p.nprocs else "")
    where = f"; outputs in {run_dir}" if run_dir else ""
    print(f"paddle_dist: starting {ranks} with {p.mode}{where}", flush=True)
    print(exposure.start_line(cfg), flush=True)
    if node is None:      # under srun, Slurm starts the other machines' tasks itself
        _tell_other_nodes(cfg, script, script_args, module)
    code = 0
    for attempt in range(cfg.dist.max_restarts + 1):
        if attempt:
            # A restart continues from the latest checkpoint, whatever resume said first;
            # an injected fault (testing) fires in the first attempt only.
            cfg.checkpoint.resume, cfg.faults.inject = "auto", ""
            print(f"paddle_dist: restart {attempt}/{cfg.dist.max_restarts} from the latest "
                  "checkpoint", flush=True)
        if cfg.dist.nnodes == 1:   # other machines' ranks may already be reporting
            rundir.clear_status(run_dir)
        code = _start(p, cfg, here, facts, run_dir, script_args)
        if code in FINAL:
            break
    return code


def _as_node_launcher(cfg, node: dict) -> None:
    """An srun task alone on its node, asked for dist.nprocs ranks, starts them as a
    multi-node launch does (engines.srun_node_launcher): Slurm says how many nodes, which
    one this is and, unless dist.master does, where node 0 is."""
    for key, default in (("nnodes", 1), ("node_rank", 0)):
        given = getattr(cfg.dist, key)
        if given not in (node[key], default):
            raise UserError(f"dist.{key}={given}, but srun started this task as node_rank "
                            f"{node['node_rank']} of {node['nnodes']} nodes; drop dist.{key}")
    cfg.dist.nnodes, cfg.dist.node_rank = node["nnodes"], node["node_rank"]
    cfg.dist.master = cfg.dist.master or node["master"]
    cfg.dist.launcher = "launch"
    print(f"paddle_dist: srun task of node {cfg.dist.node_rank} of {cfg.dist.nnodes}: it starts this "
          f"node's {cfg.dist.nprocs} ranks (master {cfg.dist.master})", flush=True)


def _check_data(cfg) -> None:
    """Bad or missing data fails here, once, before any rank starts (and CIFAR-10 is
    downloaded here, once, when data.root is "" and Paddle's cache has none)."""
    if cfg.data.name == "imagefolder":
        from ..data import imagefolder

        imagefolder.parse_floats(cfg.data.mean, "data.mean")
        imagefolder.parse_floats(cfg.data.std, "data.std")
        imagefolder.load_imagefolder(cfg.data.root, cfg.data.image_size)
    for split in ("train", "test"):
        if cfg.data.name == "mnist":
            idx.load_mnist(cfg.data.root, split)
        elif cfg.data.name == "cifar10":
            cifar.load_cifar10(cfg.data.root, split)


def _start(p, cfg, here, facts, run_dir: Optional[Path], script_args: List[str]) -> int:
    if p.mode in ("launch", "mpirun"):
        met = None
        if p.gate is not None:
            code, met, run_dir = _meet(p.gate, cfg, run_dir)
            if code:
                return code
        extra = ["-o", f"output.run_dir={run_dir}", "-o", f"checkpoint.resume={cfg.checkpoint.resume}",
                 "-o", f"faults.inject={cfg.faults.inject}", "-o", f"dist.master={cfg.dist.master}"]
        p = launcher.plan(cfg, here, script_args=list(script_args) + extra,
                          log_dir=str(launch_logs(run_dir, cfg.dist)), **facts)
        return launcher.launch(p, run_dir=run_dir, met=met)
    # spawn needs paddle here anyway. It reads variables such as OMP_NUM_THREADS when
    # imported, and forked ranks keep this import: make it with the ranks' environment.
    old = varlib.export(p.env)
    try:
        from .. import worker
    finally:
        varlib.restore(old)
    return launcher.launch(p, worker.spawn_entry, (cfg.to_dict(),), run_dir=run_dir)


def launch_logs(run_dir: Path, dist) -> Path:
    """Where Paddle's launcher writes its workerlog.<i> files: `launch/`, or per machine
    (`launch-node<N>/`) in a multi-node job, whose machines may share the run directory."""
    return run_dir / ("launch" if dist.nnodes == 1 else f"launch-node{dist.node_rank}")


def _meet(gate, cfg, run_dir: Optional[Path]):
    """Meet the other machines of a multi-node launch: (0, what they learnt, this machine's
    run directory), or (exit code, None, None) when they did not all come. Node 0 tells
    them its run's name; every other machine writes under a directory of that name
    (rundir.node_run_dir). Each clears its own ranks' status records, which an earlier
    attempt of the run may have left."""
    node0 = gate.node_rank == 0
    code, met = launcher.meeting(dataclasses.replace(gate, run=run_dir.name if node0 else ""))
    if code:
        return code, None, None
    if not node0:
        run_dir = rundir.node_run_dir(cfg, met.run)
        cfg.output.run_dir = str(run_dir)
        print(f"paddle_dist: this machine's outputs in {run_dir} (node 0's run {met.run or run_dir.name})",
              flush=True)
    rundir.clear_status(run_dir, met.ranks_of(gate.node_rank))
    return 0, met, run_dir


def _tell_other_nodes(cfg, script: str, script_args: List[str], module: str = "") -> None:
    """On node 0 of a multi-node launch, print the exact command for every other node:
    `python train.py ...` (the script relative to here), or `python -m module ...`."""
    if cfg.dist.nnodes == 1 or cfg.dist.node_rank != 0:
        return
    print("paddle_dist: run this on the other machines (same code, config and data paths):")
    kept: List[str] = []
    for arg in script_args:          # drop this node's own -o dist.node_rank=...
        if arg.startswith("dist.node_rank="):
            if kept and kept[-1] in ("-o", "--override"):
                kept.pop()
            continue
        kept.append(arg)
    entry = launcher.python_args("" if module else os.path.relpath(script), module)
    for node in range(1, cfg.dist.nnodes):
        args = kept + ["-o", f"dist.node_rank={node}"]
        print("  " + " ".join(shlex.quote(a) for a in ["python", *entry] + args), flush=True)


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
    _devices(parser)
    parser.add_argument("--log_dir", default="log",
                        help="where Paddle's launcher writes every rank's output (default: log)")
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
        raise UserError(f"script {args.script!r} {what}; give the path of a Python file")
    cfg = _load(args)
    private.closed_umask(cfg.output.share)
    environ, gpu_info, cores = varlib.host_facts()
    node = engines.srun_node_launcher(environ, cfg.dist.nprocs)
    if node is not None:
        _as_node_launcher(cfg, node)
    here = envlib.detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend, gpu_info=gpu_info,
                         environ=engines.as_launcher(environ) if node else environ)
    if here.launcher != "standalone":
        raise UserError("already inside a launched job; run the script directly")
    cfg.dist.launcher = "launch"     # spawn needs a function; a script is run by launch
    compat.warn_unsupported(_warn)
    preflight.check(cfg, environ, gpu_info, warn=_warn)
    p = launcher.plan(cfg, here, script=args.script, script_args=args.script_args, log_dir=args.log_dir,
                      always=True, environ=environ, gpu_info=gpu_info, cpu_count=cores)
    _isolate(cfg)
    # -c and -o reach the script's paddle_dist.load_config() and fit() (env.launch_options).
    config = str(configlib.resolve_path(args.config).resolve()) if args.config else None
    p.env.update(protocol.launch_variables(config, args.override))
    p.env.update(launcher.SCRIPT_CHILD)
    # A fit() in the script (rank 0) writes its run directory here: the launcher then
    # reports from the ranks' status records and names the command that continues it.
    pointer = Path(args.log_dir).resolve() / "run_dir"
    pointer.unlink(missing_ok=True)          # a previous job's, in the same log directory
    p.env[protocol.RUN_POINTER] = str(pointer)
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


def _warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def launch_entry() -> None:
    """Console command `paddle-dist-launch`."""
    run(launch_main)
