"""How processes get started: one small class per engine, each with `detect(environ)`.

The classes read the mapping they are given; `env.detect()` hands them `os.environ`, so
env.py stays the only module that reads the environment.

Example:
    cluster = next(c for c in CLUSTER_ENVIRONMENTS if c.detect(environ))(environ)
    cluster.ranks()   # {'global_rank': 3, 'local_rank': 1, 'world_size': 4, ...}
"""

from __future__ import annotations

import re
import zlib
from typing import Dict, List, Mapping, Optional

class ClusterEnvironment:
    """One way processes get started. `detect(environ)` says whether it started this one."""

    name = "standalone"
    external = False   # started by an engine other than Paddle: see paddle_variables()

    def __init__(self, environ: Mapping[str, str]):
        self.env = environ

    @staticmethod
    def detect(environ: Mapping[str, str]) -> bool:
        return True

    def _int(self, key: str, default: int = 0) -> int:
        return int(self.env.get(key, default))

    def ranks(self) -> Dict[str, object]:
        return {}


class PaddleLaunch(ClusterEnvironment):
    """`python -m paddle.distributed.launch`: sets PADDLE_LOCAL_RANK, PADDLE_NNODES, PADDLE_MASTER."""

    name = "paddle_launch"

    @staticmethod
    def detect(environ):
        return "PADDLE_TRAINER_ID" in environ and "PADDLE_LOCAL_RANK" in environ

    def ranks(self):
        nnodes = self._int("PADDLE_NNODES", 1)
        local_size = self._int("PADDLE_LOCAL_SIZE", 1)
        return dict(
            global_rank=self._int("PADDLE_TRAINER_ID"),
            local_rank=self._int("PADDLE_LOCAL_RANK"),
            world_size=self._int("PADDLE_TRAINERS_NUM", 1),
            local_world_size=local_size,
            node_rank=self._int("PADDLE_TRAINER_ID") // max(local_size, 1),
            nnodes=nnodes,
            master=self.env.get("PADDLE_MASTER") or _first_endpoint(self.env),
        )


class PaddleSpawn(ClusterEnvironment):
    """`paddle.distributed.spawn`: only the legacy PADDLE_TRAINER_* variables, one machine."""

    name = "spawn"

    @staticmethod
    def detect(environ):
        return "PADDLE_TRAINER_ID" in environ and "PADDLE_TRAINERS_NUM" in environ

    def ranks(self):
        rank = self._int("PADDLE_TRAINER_ID")
        world = self._int("PADDLE_TRAINERS_NUM", 1)
        return dict(global_rank=rank, local_rank=rank, world_size=world,
                    local_world_size=world, master=_first_endpoint(self.env))


def _first_endpoint(environ: Mapping[str, str]) -> str:
    return environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]


# ---------------------------------------------------------------- other engines
RANK_FIELDS = ("global_rank", "local_rank", "world_size", "local_world_size", "node_rank",
               "nnodes", "master")


class ExternalEngine(ClusterEnvironment):
    """A process that mpirun, srun or torchrun started. Subclasses give one property per
    concept and `ranks()` assembles them; `paddle_variables()` then translates them for
    Paddle, whose process group reads only its own variables."""

    external = True
    master_hint = "set MASTER_ADDR and MASTER_PORT on every rank"   # the fix when master is ""
    # The fix when a node has more ranks than GPUs for them (env.select_device).
    gpu_hint = "start at most one rank per GPU on each node, or give each rank one GPU"

    @property
    def node_rank(self) -> int:
        # Every engine here fills one machine before the next by default, so a node holds
        # consecutive ranks.
        return self.global_rank // max(self.local_world_size, 1)

    @property
    def nnodes(self) -> int:
        return -(-self.world_size // max(self.local_world_size, 1))   # ceil

    def ranks(self):
        return {field: getattr(self, field) for field in RANK_FIELDS}


def _master_pair(environ: Mapping[str, str]) -> str:
    """'MASTER_ADDR:MASTER_PORT' when both are set, else ''."""
    addr, port = environ.get("MASTER_ADDR", ""), environ.get("MASTER_PORT", "")
    return f"{addr}:{port}" if addr and port else ""


class OpenMPI(ExternalEngine):
    """`mpirun -n N` (`-H host:slots`, `--hostfile`): the OMPI_COMM_WORLD_* variables."""

    name = "openmpi"
    master_hint = ("set MASTER_ADDR and MASTER_PORT, e.g. mpirun -x MASTER_ADDR=host0 "
                   "-x MASTER_PORT=29500 ... (or -x PADDLE_MASTER=host0:29500)")
    gpu_hint = "start at most one rank per GPU on each node (mpirun -npernode N)"

    @staticmethod
    def detect(environ):
        return "OMPI_COMM_WORLD_RANK" in environ

    @property
    def global_rank(self):
        return self._int("OMPI_COMM_WORLD_RANK")

    @property
    def world_size(self):
        return self._int("OMPI_COMM_WORLD_SIZE", 1)

    @property
    def local_rank(self):
        return self._int("OMPI_COMM_WORLD_LOCAL_RANK")

    @property
    def local_world_size(self):
        return self._int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)

    # node_rank is NOT OMPI_COMM_WORLD_NODE_RANK: Open MPI defines that as this process's
    # rank among the processes of ALL jobs on this node (a local rank), not the node's
    # index; the inherited global // local size holds for mpirun's default mappings
    # (by slot, core or package), not for --map-by node.

    @property
    def master(self):
        # mpirun names no rendezvous address itself: MASTER_ADDR/MASTER_PORT (passed with
        # -x), else PADDLE_MASTER. When every rank is on this host (`mpirun -n 8 python
        # train.py`) nothing needs guessing: loopback, and a port derived from the MPI
        # job's id, the same on every rank and different for two jobs side by side.
        # Otherwise "" and paddle_variables() refuses: a guessed address would only hang.
        given = _master_pair(self.env) or self.env.get("PADDLE_MASTER", "")
        job = self.env.get("OMPI_MCA_ess_base_jobid") or self.env.get("PMIX_NAMESPACE", "")
        if given or not job or self.local_world_size != self.world_size:
            return given
        return f"127.0.0.1:{job_port(job)}"


def job_port(job: str) -> int:
    """A rendezvous port from a job's id: 20000-32767, below Linux's ephemeral ports.

    Example:
        job_port("1156907009")   # the same number on every rank of that mpirun
    """
    return 20000 + zlib.crc32(job.encode()) % 12768


# Slurm numbers ordinary job steps 0, 1, ... and keeps the values from 0xfffffff0
# (SLURM_MAX_NORMAL_STEP_ID) up for special steps: interactive 0xfffffffa, batch
# 0xfffffffb, extern 0xfffffffc (before Slurm 20.11: batch 0xfffffffe, extern 0xffffffff).
# slurmstepd writes SLURM_STEP_ID only when the id, read as a signed int, is >= 0, so a
# batch script - which does get SLURM_PROCID=0 and SLURM_NTASKS - has no SLURM_STEP_ID,
# while srun writes the unsigned value ("4294967290" for salloc's interactive step).
# Only a number below the limit is a task that srun started.
SLURM_MAX_NORMAL_STEP_ID = 0xFFFFFFF0


def _srun_step(step_id: str) -> bool:
    return step_id.isdigit() and int(step_id) < SLURM_MAX_NORMAL_STEP_ID


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list ('' for an empty one).

    Example:
        first_host("node[01-03,07],gpu5")   # 'node01'
        first_host("rack[1-2]-n[3-4]")      # 'rack1-n3'
    """
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):   # the first entry ends at a comma outside brackets
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    # Each bracket holds ranges and ids, "01-03,07": the first host takes the first of each.
    return re.sub(r"\[([^\]]*)\]", lambda m: re.split("[,-]", m.group(1))[0],
                  nodelist[:end].strip())


def tasks_per_node(spec: str) -> List[int]:
    """Expand Slurm's compressed per-node counts; unreadable parts are skipped.

    Example:
        tasks_per_node("2(x3),1")   # [2, 2, 2, 1]
    """
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match:
            counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


class Slurm(ExternalEngine):
    """Tasks that `srun` started: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID and the step's sizes.

    The SLURM_STEP_* variables describe this step exactly; the plain ones can describe the
    whole allocation (`srun --preserve-env`, or SLURM_NTASKS_PER_NODE inherited from
    `sbatch --ntasks-per-node` by a smaller step), so they are only the fallback."""

    name = "slurm"
    master_hint = ('set MASTER_ADDR and MASTER_PORT before srun, e.g. export MASTER_ADDR='
                   '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) MASTER_PORT=29500')
    gpu_hint = ("run at most one task per GPU on each node (--ntasks-per-node), or bind one "
                "GPU to each task: srun --gpus-per-task=1 --gpu-bind=single:1")

    @staticmethod
    def detect(environ):
        return ("SLURM_PROCID" in environ and "SLURM_NTASKS" in environ
                and _srun_step(environ.get("SLURM_STEP_ID", "")))

    @property
    def global_rank(self):
        return self._int("SLURM_PROCID")

    @property
    def world_size(self):
        return self._int("SLURM_STEP_NUM_TASKS", self._int("SLURM_NTASKS", 1))

    @property
    def local_rank(self):
        return self._int("SLURM_LOCALID")

    @property
    def node_rank(self):
        return self._int("SLURM_NODEID")

    @property
    def nnodes(self):
        return self._int("SLURM_STEP_NUM_NODES", self._int("SLURM_NNODES", 1))

    @property
    def local_world_size(self):
        counts = tasks_per_node(self.env.get("SLURM_STEP_TASKS_PER_NODE")
                                or self.env.get("SLURM_NTASKS_PER_NODE", ""))
        if counts:   # "4" or "4(x2)" name every node; "3,2" (srun -n 5 -N 2) each one
            return counts[min(self.node_rank, len(counts) - 1)]
        return max(self.world_size // max(self.nnodes, 1), 1)

    @property
    def master(self):
        """MASTER_ADDR/MASTER_PORT when set; else the step's first node, where Slurm puts
        task 0 (its name must resolve on every node), and a port derived from the job id."""
        host = self.env.get("MASTER_ADDR") or first_host(
            self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST", ""))
        if not host:
            return ""
        # Every task of the job computes the same port without talking to the others; jobs
        # sharing a node get different ports (unless their ids differ by a multiple of
        # 20000), and 12000-31999 stays below Linux's ephemeral range (32768-60999), where
        # outgoing connections take their ports. Two concurrent steps of one job on the
        # same first node collide: give each its own MASTER_PORT.
        port = self.env.get("MASTER_PORT") or str(12000 + self._int("SLURM_JOB_ID") % 20000)
        return f"{host}:{port}"


def srun_node_launcher(environ: Mapping[str, str], nprocs: Optional[int]) -> Optional[Dict[str, object]]:
    """The multi-node settings of an srun task that is to start its node's ranks itself:
    alone on its node in a step of one task per node, asked for `nprocs` > 1 ranks
    (`srun --ntasks-per-node=1 python train.py -o dist.nprocs=8`). Every task derives the
    same settings without talking to the others; None for any other process.

    Example:
        srun_node_launcher(environ_of_task_1_of_2_nodes, 8)
        # {'nnodes': 2, 'node_rank': 1, 'master': 'gpu07:16242'}
    """
    if not nprocs or nprocs < 2 or not Slurm.detect(environ):
        return None
    task = Slurm(environ)
    if task.local_world_size != 1 or task.world_size != task.nnodes:
        return None
    return {"nnodes": task.nnodes, "node_rank": task.node_rank, "master": task.master}


def as_launcher(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` without what makes it an srun task (SLURM_PROCID): seen through it, a node
    launcher is a process of its own, which starts the ranks; they still inherit every
    SLURM_* variable, but the launcher's variables come first (CLUSTER_ENVIRONMENTS)."""
    return {key: value for key, value in environ.items() if key != "SLURM_PROCID"}


class TorchrunStyle(ExternalEngine):
    """Ranks started with torch's variables: RANK, WORLD_SIZE, MASTER_ADDR[, MASTER_PORT,
    LOCAL_RANK, LOCAL_WORLD_SIZE] - by hand, by a script, or by torchrun."""

    name = "torchrun"
    master_hint = ("set MASTER_ADDR and MASTER_PORT on every rank, e.g. MASTER_ADDR=host0 "
                   "MASTER_PORT=29500")
    gpu_hint = "start at most one rank per GPU on each node (torchrun --nproc-per-node N)"

    @staticmethod
    def detect(environ):
        return all(key in environ for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))

    @property
    def global_rank(self):
        return self._int("RANK")

    @property
    def world_size(self):
        return self._int("WORLD_SIZE", 1)

    @property
    def local_rank(self):
        return self._int("LOCAL_RANK")

    @property
    def local_world_size(self):
        return self._int("LOCAL_WORLD_SIZE", 1)

    @property
    def node_rank(self):   # torchrun's GROUP_RANK is the node's index
        return self._int("GROUP_RANK") if "GROUP_RANK" in self.env else super().node_rank

    @property
    def nnodes(self):
        return self._int("GROUP_WORLD_SIZE") if "GROUP_WORLD_SIZE" in self.env else super().nnodes

    @property
    def master(self):
        host = self.env.get("MASTER_ADDR", "")
        if not host:
            return ""
        port = int(self.env.get("MASTER_PORT") or 29500)   # torch's default
        # With TORCHELASTIC_USE_AGENT_STORE=True, torchrun's agent on node 0 already serves
        # its own TCP store at MASTER_PORT (torch workers join it as clients), so Paddle's
        # store - which rank 0 binds there - takes the next port, the same on every rank.
        if self.env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            port += 1
        return f"{host}:{port}"


class Torchrun(TorchrunStyle):
    """Workers of torchrun itself, which also sets TORCHELASTIC_RUN_ID."""

    @staticmethod
    def detect(environ):
        return TorchrunStyle.detect(environ) and "TORCHELASTIC_RUN_ID" in environ


# The first class whose detect() holds describes this process. Rule: the launcher that
# started THIS process comes first; the variables of engines around it are inherited and
# describe something else.
# - PaddleLaunch, PaddleSpawn: Paddle's own variables are the most specific. A process that
#   Paddle launched may sit inside an srun/mpirun allocation, and Paddle's values are the
#   ones its process group will use. A launched process carries the spawn variables too.
# - Torchrun (TORCHELASTIC_RUN_ID set): in `srun torchrun ...` every worker inherits its
#   agent's SLURM_PROCID, which numbers nodes, not workers. Nothing launches inside torchrun.
# - OpenMPI: mpirun inside a Slurm allocation starts its daemons with srun, so every rank
#   carries the SLURM_* of that daemon step; OMPI_* describe the actual ranks.
# - Slurm: srun tasks (not a batch script: see SLURM_MAX_NORMAL_STEP_ID).
# - TorchrunStyle: RANK/WORLD_SIZE/MASTER_ADDR set by hand. After Slurm, because a batch
#   script may export them job-wide - the same RANK in every srun task.
# - ClusterEnvironment: everything else is a standalone process.
CLUSTER_ENVIRONMENTS = (PaddleLaunch, PaddleSpawn, Torchrun, OpenMPI, Slurm, TorchrunStyle,
                        ClusterEnvironment)
EXTERNAL_ENGINES = {c.name: c for c in CLUSTER_ENVIRONMENTS if c.external}
