"""A job resolved once, before anything is planned or started: `resolve()` turns the config,
the program the ranks run and this host's facts into one frozen `JobSpec`, and
`attempt_config()` derives, in one place, the config each attempt's ranks run.

What `resolve()` fills in: an srun task alone on its node that starts its node's ranks
(engines.srun_node_launcher), the route to the master and this machine's address on it
(dist.host), mpirun's master. Nothing patches the config afterwards.

Example:
    spec = resolve(configlib.load(None, ["dist.nprocs=2"]), script="train.py")
    launcher.plan(spec).argv
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

from .. import config as configlib
from ..errors import UserError
from ..runs.topology import Meeting
from ..runtime import devices as devicelib, engines, netcheck, variables as varlib
from ..runtime.env import DistEnv, detect
from ..runtime.variables import HostFacts
from ..security import private, rankgate
from . import mpirun


@dataclass(frozen=True)
class JobSpec:
    """A job resolved once (module docstring)."""

    cfg: configlib.Config         # with what this host decides filled in; nothing patches it later
    facts: HostFacts              # the environment, GPUs and cores, read once
    here: DistEnv                 # who this process is (a launcher: standalone)
    node: Optional[dict] = None   # an srun task that starts its node's ranks (engines.srun_node_launcher)
    run_dir: Optional[Path] = None    # chosen once the plan says how many ranks; another machine
                                      # of a multi-node launch learns it when it meets node 0
    script: str = ""              # what each rank runs: `python script script_args`,
    module: str = ""              # or `python -m module script_args`
    script_args: Tuple[str, ...] = ()
    builtin: bool = False         # the built-in job: its ranks run the attempt's config, which
                                  # the plan hands them (worker.run_resolved), not their -c/-o
    devices: Optional[devicelib.JobDevices] = None   # its ranks here, their GPUs and backend:
                                  # resolved when the spec is made, from cfg and facts (_devices)

    def __post_init__(self):
        # Once, here: every attempt's plan takes them (no attempt changes the launcher, its
        # hostfile, the ranks asked for, their GPUs or the backend).
        if self.devices is None and self.facts is not None:
            object.__setattr__(self, "devices", _devices(self.cfg, self.facts))


def resolve(cfg: configlib.Config, script: str = "", module: str = "",
            script_args: Sequence[str] = (), builtin: bool = False) -> JobSpec:
    """The job that `cfg` asks for on this host, its ranks running `script` (or `-m module`)
    with `script_args` (`builtin`: the built-in job), resolved once (module docstring)."""
    private.closed_umask(cfg.output.share)
    facts = varlib.host_facts()
    node = engines.srun_node_launcher(facts.environ, cfg.dist.nprocs)
    here = detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend, gpu_info=facts.gpus,
                  environ=engines.as_launcher(facts.environ) if node else facts.environ)
    if node is not None:
        cfg = _as_node_launcher(cfg, node)
    if here.launcher == "standalone":
        cfg = _with_master(cfg)
    return JobSpec(cfg, facts, here, node, script=script, module=module, script_args=tuple(script_args),
                   builtin=builtin)


def _devices(cfg: configlib.Config, facts: HostFacts) -> devicelib.JobDevices:
    """The job's ranks on this machine, their GPUs and backend (devices.job_devices): an
    mpirun job without dist.nprocs runs its hostfile's slots; Paddle's launcher runs the
    ranks on each of dist.nnodes machines."""
    d = cfg.dist
    sized_by_hostfile = d.launcher == "mpirun" and d.nprocs is None and d.hostfile
    slots = mpirun.hostfile_slots(d.hostfile) if sized_by_hostfile else None
    nodes = d.nnodes if d.launcher == "launch" else 1
    return devicelib.job_devices(d.nprocs, d.gpus, d.backend, facts.gpus, facts.environ, slots, nodes)


def attempt_config(spec: JobSpec, attempt: int = 0, met: Optional[Meeting] = None) -> configlib.Config:
    """The config that an attempt's ranks run, derived from the resolved one here and only
    here: the run directory; after a restart, the latest checkpoint (whatever resume said
    first) and no injected fault (testing: the first attempt's only); when an elastic job's
    machines did not all meet, the ones that did, renumbered (topology.Meeting.of)."""
    changes: Dict[str, object] = {}
    if spec.run_dir is not None:
        changes["output.run_dir"] = str(spec.run_dir)
    if attempt:
        changes.update({"checkpoint.resume": "auto", "faults.inject": ""})
    if met is not None and met.absent:       # in this order: each step a valid config
        changes.update({"dist.node_rank": met.node_rank, "dist.min_nnodes": 0, "dist.nnodes": len(met.nodes)})
    return configlib.derived(spec.cfg, changes)


def _with_master(cfg: configlib.Config) -> configlib.Config:
    """A launcher's config with where the machines meet: the route to dist.master checked,
    and this machine's address on it (Paddle's launcher guesses it from the host name);
    mpirun's master on the hostfile's first host, at a free port, unless given."""
    d = cfg.dist
    if d.master and (d.nnodes > 1 or (d.hostfile and d.launcher == "mpirun")):
        netcheck.check(d.master, d.nccl.socket_ifname)
        if d.nnodes > 1 and not d.host:
            address = netcheck.route_to(d.master.rpartition(":")[0])[0]
            cfg = configlib.replace_key(cfg, "dist.host", address)
    if d.launcher == "mpirun" and not d.master:
        first = mpirun.hostfile_first_host(d.hostfile) if d.hostfile else "127.0.0.1"
        cfg = configlib.replace_key(cfg, "dist.master", f"{first}:{rankgate.free_port()}")
    return cfg


def _as_node_launcher(cfg: configlib.Config, node: dict) -> configlib.Config:
    """An srun task alone on its node, asked for dist.nprocs ranks, starts them as a
    multi-node launch does (engines.srun_node_launcher): Slurm says how many nodes, which
    one this is and, unless dist.master does, where node 0 is."""
    for key, default in (("nnodes", 1), ("node_rank", 0)):
        given = getattr(cfg.dist, key)
        elastic = key == "nnodes" and 0 < cfg.dist.min_nnodes <= node[key] <= given
        if given not in (node[key], default) and not elastic:
            raise UserError(f"dist.{key}={given}, but srun started this task as node_rank "
                            f"{node['node_rank']} of {node['nnodes']} nodes; drop dist.{key}")
    # In this order: each step is a valid config (more nodes need the master first).
    changes = {"dist.master": cfg.dist.master or node["master"], "dist.launcher": "launch",
               "dist.nnodes": node["nnodes"], "dist.node_rank": node["node_rank"]}
    cfg = configlib.derived(cfg, changes)
    print(f"paddle_dist: srun task of node {cfg.dist.node_rank} of {cfg.dist.nnodes}: it starts this "
          f"node's {cfg.dist.nprocs} ranks (master {cfg.dist.master})", flush=True)
    return cfg
