"""The built-in job, from its launcher: resolve once, plan once, then check, choose the run,
meet the other machines, start the ranks and restart them.

`jobspec.resolve()` turns the config, the program and this host's facts into one frozen
`JobSpec`: the config with everything the host decides filled in (an srun task that starts
its node's ranks, the master's route, mpirun's master), the host's facts, and who this
process is. `launcher.plan()` plans each attempt from it. The ranks this launcher starts
take their attempt's config from their environment (runtime/protocol.py, JOB_CONFIG) and
run it: they never read their -c/-o again, never plan, and never choose the run directory,
which is chosen here (runs/rundir.py), or, on the other machines of a multi-node launch,
named by node 0 when they meet.

Example:
    sys.exit(run(configlib.load(None, ["dist.nprocs=2"]), script="train.py", script_args=argv))
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Optional

from .. import compat, errors
from .. import config as configlib
from ..data import registry
from ..errors import UserError
from ..runs import commands, layout, rundir, status
from ..runs.topology import Meeting, Node
from ..runtime import variables as varlib
from ..security import exposure
from ..sync import transports
from ..trainer import amp
from . import isolate, jobspec, launcher, preflight
from .host import KeptListener
from .jobspec import JobSpec, attempt_config

# Exit codes no restart can change: success, bad input, a stop request (saved, or before
# anything started: 143), Ctrl+C, machines that did not all arrive in time, and ranks whose
# weights diverged (a run never continued: docs/faults.md).
FINAL = (0, errors.EXIT_USAGE, errors.EXIT_PREEMPTED, errors.EXIT_INTERRUPTED, 128 + 15,
         errors.EXIT_RENDEZVOUS, errors.EXIT_DIVERGED)


def run(cfg: configlib.Config, script: str = "", script_args: List[str] = (), module: str = "") -> int:
    """Run the built-in job: here, or as the ranks it starts, each running `script` (or
    `-m module`) with `script_args` and the config resolved here."""
    spec = jobspec.resolve(cfg, script=script, module=module, script_args=script_args, builtin=True)
    cfg = spec.cfg
    p = launcher.plan(spec)
    if p.mode == "none":
        from .. import worker

        worker.main(cfg)
        return 0
    isolate_if_asked(cfg, module)
    warn_unsupported()                  # the ranks, supervised, leave it to this process
    registry.check(cfg)
    amp.plan(cfg.train, "gpu" if p.gpus else "cpu", bf16_supported=lambda: True,   # CPU: refused
             fp16_supported=lambda: True)
    transports.check(cfg.sync.transport, cfg.sync.compress, p.backend)
    preflight.check(cfg, spec.facts.environ, spec.facts.gpus, warn=warn)
    registry.verify(cfg)               # bad or missing data fails once, here
    world = p.nprocs * (cfg.dist.nnodes if p.mode == "launch" else 1)
    run_dir = None        # another machine of a multi-node launch: node 0 names it (_meet_and_name_run)
    if p.gate is None or cfg.dist.node_rank == 0:
        choice = rundir.choose(cfg, world, commands.own_command())
        run_dir = choice.path
        spec = dataclasses.replace(spec, run_dir=run_dir)
        if choice.note:
            print(f"paddle_dist: {choice.note}", flush=True)
    ranks = f"{p.nprocs} rank{'s' * (p.nprocs != 1)}" + (f" on this machine ({world} in all)"
                                                          if world != p.nprocs else "")
    where = f"; outputs in {run_dir}" if run_dir else ""
    print(f"paddle_dist: starting {ranks} with {p.mode}{where}", flush=True)
    print(exposure.start_line(cfg), flush=True)
    if spec.node is None:      # under srun, Slurm starts the other machines' tasks itself
        tell_other_nodes(cfg, script, script_args, module)
    code, known = 0, {}       # known: the machines each meeting saw, by node_rank (for `_say_without`)
    # Node 0 listens at dist.master from its first meeting to the job's end: no attempt
    # leaves the port free for another process to take (host.KeptListener).
    with KeptListener(cfg.dist.master) as kept:
        for attempt in range(cfg.dist.max_restarts + 1):
            if attempt:
                print(f"paddle_dist: restart {attempt}/{cfg.dist.max_restarts} from the latest "
                      "checkpoint", flush=True)
            if cfg.dist.nnodes == 1:   # other machines' ranks may already be reporting
                rundir.clear_status(run_dir)
            code = _start(spec, attempt, known, kept)
            if code in FINAL:
                break
    return code


def isolate_if_asked(cfg: configlib.Config, module: str = "") -> None:
    """dist.isolate: move this launcher, before it starts anything, into a network namespace
    of the job's own (isolate.py); as a user other than root, by running this command again
    through isolate.py."""
    if not cfg.dist.isolate or isolate.isolated():
        return
    if cfg.dist.nnodes > 1 or cfg.dist.launcher == "mpirun" or cfg.dist.hostfile:
        raise UserError("dist.isolate=true keeps a job inside one machine's private loopback; a job on "
                        "several machines cannot use it: remove -o dist.isolate=true")
    if os.geteuid() != 0:
        rundir.check(cfg)       # inside, root's directories and other users' look alike
        module = module or commands.main_module()
        isolate.rerun_inside([sys.executable, *launcher.module_args(module), *sys.argv[1:]] if module else
                             [sys.executable, *sys.argv])
    try:
        isolate.enter()
    except isolate.Unavailable as e:
        raise UserError(f"dist.isolate=true: this machine refuses a private network namespace: {e}; "
                        "run without -o dist.isolate=true (docs/security.md)") from None


def _start(spec: JobSpec, attempt: int, known: Dict[int, Node], kept: Optional[KeptListener] = None) -> int:
    """One attempt: the ranks of the plan for this attempt's config (attempt_config), on the
    machines that met, when some of an elastic job's did not. `kept`: node 0's listener."""
    cfg = attempt_config(spec, attempt)
    p, run_dir = launcher.plan(spec, attempt), spec.run_dir
    if p.mode in ("launch", "mpirun"):
        met = None
        if p.gate is not None:
            code, met, run_dir = _meet_and_name_run(p.gate, cfg, run_dir, kept)
            if code:
                return code
            _say_without(met, cfg, known)
            spec = dataclasses.replace(spec, run_dir=run_dir)     # the one node 0 named
            # always: a machine left with one rank still starts it as a child, supervised
            # like any other attempt's (this process is the launcher, not a rank).
            cfg, p = attempt_config(spec, attempt, met), launcher.plan(spec, attempt, met, always=True)
            if p.gate is None:         # one machine left: its ranks meet on its loopback
                met.rendezvous.close()
                met = None
        logs = layout.Run(run_dir).launch_logs(cfg.dist.nnodes, cfg.dist.node_rank)
        return launcher.launch(p, run_dir=run_dir, met=met, log_dir=str(logs))
    # spawn needs paddle here anyway. It reads variables such as OMP_NUM_THREADS when
    # imported, and forked ranks keep this import: make it with the ranks' environment.
    old = varlib.export(p.env)
    try:
        from .. import worker
    finally:
        varlib.restore(old)
    return launcher.launch(p, worker.spawn_entry, (cfg.to_dict(),), run_dir=run_dir)


def _say_without(met: Meeting, cfg: configlib.Config, known: Dict[int, Node]) -> None:
    """An elastic job whose machines did not all meet goes on with those that did (their
    config: attempt_config): one line naming the absent ones. The ranks then continue the
    run's latest checkpoint on fewer ranks, with the data plan that keeps its global batch
    (trainer/sampling.py). `known`: every machine seen so far, by configured node_rank."""
    present = [r for r in range(cfg.dist.nnodes) if r not in met.absent]
    was = sum(known[r].nprocs for r in known)
    known.update({r: met.nodes[i] for i, r in enumerate(present)})
    if not met.absent:
        return
    absent = ", ".join(f"node_rank {r}" + (f" ({', '.join(dict.fromkeys(filter(None, (known[r].host, known[r].address))))})"
                                           if r in known else "") for r in met.absent)
    print(f"paddle_dist: going on without {absent}: {len(met.nodes)} of {cfg.dist.nnodes} machines "
          f"(dist.nnodes={cfg.dist.min_nnodes}:{cfg.dist.nnodes}), {met.world_size} rank{'s' * (met.world_size != 1)}"
          + (f" (were {was})" if was and was != met.world_size else "")
          + (f"; this machine is node_rank {met.node_rank} now" if met.node_rank != cfg.dist.node_rank else ""),
          flush=True)


def _meet_and_name_run(gate, cfg: configlib.Config, run_dir: Optional[Path], kept: Optional[KeptListener] = None):
    """Meet the other machines of a multi-node launch: (0, what they learnt, this machine's
    run directory), or (exit code, None, None) when they did not all come. Node 0 tells
    them its run's name; every other machine writes under a directory of that name
    (rundir.node_run_dir). Each clears its own ranks' status records, which an earlier
    attempt of the run may have left; node 0 also those of ranks beyond the job's world
    when an elastic job goes on with fewer machines (_say_without)."""
    node0 = gate.node_rank == 0
    code, met = launcher.wait_for_machines(dataclasses.replace(gate, run=run_dir.name if node0 else ""), kept)
    if code:
        return code, None, None
    if not node0:
        run_dir = rundir.node_run_dir(cfg, met.run)
        print(f"paddle_dist: this machine's outputs in {run_dir} (node 0's run {met.run or run_dir.name})",
              flush=True)
    beyond = [r for r in status.read_all(run_dir) if r >= met.world_size] if node0 and met.absent else []
    rundir.clear_status(run_dir, [*met.ranks_of(met.node_rank), *beyond])
    return 0, met, run_dir


def tell_other_nodes(cfg: configlib.Config, script: str, script_args: List[str], module: str = "") -> None:
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
    # The command as the user typed it on node 0 (python_args adds the ranks' safe-path mode).
    entry = ("-m", module) if module else (os.path.relpath(script),)
    for node in range(1, cfg.dist.nnodes):
        args = kept + ["-o", f"dist.node_rank={node}"]
        print("  " + " ".join(shlex.quote(a) for a in ["python", *entry] + args), flush=True)


def warn(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def warn_unsupported() -> None:
    """Once, in the launcher: this Paddle is not one paddle_dist supports (compat.py)."""
    compat.warn_unsupported(warn)

