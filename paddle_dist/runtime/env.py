"""Who this process is: `detect()` turns the variables a launcher left behind into a frozen
`DistEnv`; everything else in paddle_dist receives that object and never asks for ranks itself.

The runtime package is where paddle_dist reads and writes `os.environ`: this module (ranks,
the engine, a rank started by hand), devices.py (GPUs, FLAGS_selected_gpus), variables.py
(what children and Paddle get) and protocol.py (paddle_dist's own PADDLE_DIST_* variables).

Example:
    env = detect()
    if env.is_main:
        print(f"{env.world_size} ranks, device {env.device}")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from .devices import CPU, GpuInfo, probe_gpus, select_backend, select_device
from .engines import CLUSTER_ENVIRONMENTS
from .protocol import JOB, JOB_DIR, SUPERVISED, TOKEN_FILE
from ..errors import UserError

# `import paddle` sets OMP_NUM_THREADS=1 when it is unset, so whether the USER chose a
# value is only known before that: paddle_dist imports this module first.
USER_OMP_NUM_THREADS = os.environ.get("OMP_NUM_THREADS")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job. `global_rank` is unique in the job;
    `local_rank` is unique on this machine (Paddle's `ParallelEnv().local_rank` is NOT:
    it is the global rank)."""

    launcher: str = "standalone"   # standalone | paddle_launch | spawn | openmpi | slurm | torchrun
    global_rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    nnodes: int = 1
    master: str = ""               # host:port of the rendezvous; "" when standalone
    device: str = CPU              # "cpu" or "gpu:<index among the visible GPUs>"
    backend: str = "none"          # none (one process) | gloo | nccl
    supervised: bool = False       # started by paddle_dist's launcher, which reports failures
    job: str = ""                  # the job this rank was admitted to ("" when no gate admitted it)
    token_file: str = ""           # the file with that job's token
    job_dir: str = ""              # the job's private directory in /dev/shm ("" when no launcher made one)

    @property
    def is_main(self) -> bool:
        return self.global_rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def detect(gpus: str = "", backend: str = "auto", gpu_info: Optional[GpuInfo] = None,
           environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Describe this process: launcher, ranks, device and backend.

    Example:
        env = detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend)
    """
    environ = os.environ if environ is None else environ
    cluster = next(c for c in CLUSTER_ENVIRONMENTS if c.detect(environ))(environ)
    ranks = cluster.ranks()
    info = gpu_info if gpu_info is not None else probe_gpus()
    device = select_device(cluster.name, ranks.get("local_rank", 0), gpus, info, environ,
                           local_world_size=ranks.get("local_world_size", 1))
    world = ranks.get("world_size", 1)
    return DistEnv(launcher=cluster.name, device=device, supervised=environ.get(SUPERVISED) == "1",
                   backend=select_backend(backend, device, world), job=environ.get(JOB, ""),
                   token_file=environ.get(TOKEN_FILE, ""), job_dir=environ.get(JOB_DIR, ""), **ranks)


def hand_started(master: Optional[str], world_size: Optional[int], rank: Optional[int],
                 local_rank: Optional[int] = None,
                 environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The torchrun-style variables for a rank started by hand (`train.py --master H:P
    --world-size N --rank R [--local-rank L]`, the `tcp://` recipe): one process per
    command. `local_rank` (the rank's index among this machine's ranks, which picks its
    GPU) defaults to an inherited LOCAL_RANK, else 0.

    Example:
        hand_started("10.0.0.1:6170", 2, 1, local_rank=1)
        # {'RANK': '1', 'WORLD_SIZE': '2', 'MASTER_ADDR': '10.0.0.1', 'MASTER_PORT': '6170',
        #  'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
    """
    environ = os.environ if environ is None else environ
    if master is None or world_size is None or rank is None:
        raise UserError("a rank started by hand needs all of --master HOST:PORT, --world-size N "
                        "and --rank R")
    host, sep, port = master.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--master {master!r} must be host:port, e.g. 10.0.0.1:6170")
    if world_size < 1 or not 0 <= rank < world_size:
        raise UserError(f"--rank {rank} must be in 0 .. {world_size - 1} for --world-size {world_size}")
    local_rank = _hand_local_rank(local_rank, world_size, environ)
    # How many ranks share this machine is not known here, only that local ranks
    # 0 .. local_rank do: never fewer (an inherited LOCAL_WORLD_SIZE may say more).
    inherited = environ.get("LOCAL_WORLD_SIZE", "").strip()
    local_world_size = max(int(inherited) if inherited.isdigit() else 0, local_rank + 1)
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "MASTER_ADDR": host,
            "MASTER_PORT": port, "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size)}


def _hand_local_rank(given: Optional[int], world_size: int, environ: Mapping[str, str]) -> int:
    """--local-rank, else an inherited LOCAL_RANK, else 0; checked against the world size."""
    what = f"--local-rank {given}"
    if given is None:
        inherited = environ.get("LOCAL_RANK", "").strip()
        if inherited and not inherited.isdigit():
            raise UserError(f"LOCAL_RANK={inherited!r} (inherited) is not a local rank; "
                            "pass --local-rank L or unset LOCAL_RANK")
        given, what = int(inherited or 0), f"LOCAL_RANK={inherited} (inherited)"
    if not 0 <= given < world_size:
        raise UserError(f"{what} must be in 0 .. {world_size - 1} for --world-size {world_size} "
                        "(the rank's index among this machine's ranks, which picks its GPU)")
    return given


def check_started_outside(nprocs: Optional[int], env: DistEnv) -> None:
    """A rank that another engine started (srun, mpirun, Paddle's launcher) starts no
    others, so a `dist.nprocs` that disagrees with that engine would be silently ignored:
    refuse it, saying how to get that many ranks.

    Example:
        check_started_outside(8, DistEnv(launcher="slurm", local_world_size=1))   # UserError
    """
    # Under mpirun, dist.nprocs is mpirun's -n: the ranks of the whole job (mpirun_argv).
    whole = env.launcher == "openmpi"
    started = env.world_size if whole else env.local_world_size
    if nprocs is None or nprocs == started:
        return
    how = {"slurm": f"srun --ntasks-per-node={nprocs} (docs/slurm.md)",
           "openmpi": f"mpirun -n {nprocs}",
           "paddle_launch": f"--nproc_per_node {nprocs}"}.get(env.launcher, f"{nprocs} ranks per machine")
    where = "in all" if whole else "on this machine"
    raise UserError(f"dist.nprocs={nprocs}, but {env.launcher} started this job with {started} "
                    f"rank(s) {where}, and a rank started outside paddle_dist starts no others; "
                    f"drop dist.nprocs, or ask for {how}")
