"""The environment layer: the ONLY module that reads or writes `os.environ`.

`detect()` turns the variables a launcher left behind into a frozen `DistEnv`; everything
else in paddle_dist receives that object and never asks for ranks itself.

Device rule (Paddle's own, made explicit): `--gpus` / `dist.gpus` name physical GPU ids,
as nvidia-smi shows them. When `CUDA_VISIBLE_DEVICES` is set, every id must be in it,
and a process uses the id's POSITION in that list, because CUDA renumbers the visible
devices from 0 (`CUDA_VISIBLE_DEVICES=4,5 --gpus 5` -> device `gpu:1`). Without GPUs, or
with the CPU build of Paddle, training runs on CPU with the gloo backend.

Which GPU a rank takes (`select_device`): Paddle's launchers name it (FLAGS_selected_gpus).
Otherwise, from the GPUs the process may use (`--gpus`, else the visible ones):
- exactly one visible and none requested: that one, `gpu:0`, whatever the local rank - the
  engine bound the task to it (`srun --gpus-per-task=1 --gpu-bind=single:1`, a per-rank
  CUDA_VISIBLE_DEVICES);
- several: the local rank picks (`srun --gpus-per-node=8` with 8 tasks, every task sees 8);
- fewer than the ranks on this node: a DeviceError saying how to give each rank its own.
Under srun, mpirun or torchrun a FLAGS_selected_gpus can only be inherited, and Paddle
builds its device contexts at import for the GPUs it lists alone: one that leaves out the
rank's GPU is a DeviceError saying to unset it (`check_inherited_flag`).

Example:
    env = detect()
    if env.is_main:
        print(f"{env.world_size} ranks, device {env.device}")
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from .. import compat
from .engines import CLUSTER_ENVIRONMENTS, EXTERNAL_ENGINES
from ..errors import DeviceError, UserError

CPU = "cpu"
LOOPBACK = "lo"            # Linux's loopback interface
SUPERVISED = "PADDLE_DIST_SUPERVISED"   # set for the ranks that paddle_dist's launcher starts
# `python -m paddle_dist.launch -c CONFIG -o KEY=VALUE ... script.py`: for the script's
# paddle_dist.load_config() and fit() (launch_options()).
LAUNCH_CONFIG, LAUNCH_OVERRIDES = "PADDLE_DIST_CONFIG", "PADDLE_DIST_OVERRIDES"
# `python -m paddle_dist.launch script.py`: a file where the script's fit() (rank 0) writes
# the run directory it chose, so that the launcher can read the ranks' status records and
# name the command that continues the run (run_pointer()).
RUN_POINTER = "PADDLE_DIST_RUN_POINTER"
# A rank that paddle_dist's launcher admitted (rankgate.py): the job, and the path of the
# file holding its token (never the token), for the rank's attestation (attest.py).
JOB, TOKEN_FILE = "PADDLE_DIST_JOB", "PADDLE_DIST_TOKEN_FILE"
# The job's private directory in /dev/shm, made by its launcher (private.py).
JOB_DIR = "PADDLE_DIST_JOB_DIR"

# The GPUs `import paddle` builds device contexts for (positions among the visible GPUs);
# Paddle's launchers set it per rank.
DEVICE_FLAG = "FLAGS_selected_gpus"
# Where an inherited FLAGS_selected_gpus must go for each external engine's ranks.
UNSET_FLAG_WHERE = {"openmpi": "before mpirun", "slurm": "in the job script, before srun",
                    "torchrun": "before torchrun, or before each command that starts a rank by hand"}

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


@dataclass(frozen=True)
class GpuInfo:
    """What this Paddle build and machine offer; `probe_gpus()` fills it in."""

    compiled_with_cuda: bool = False
    count: int = 0




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


def probe_gpus() -> GpuInfo:
    """The GPUs Paddle can use. A CPU build is recognised from its version file, without
    `import paddle` (about a second): a launcher that starts ranks need not import it."""
    if _build_is_cpu_only():
        return GpuInfo(False, 0)
    import paddle

    if not paddle.is_compiled_with_cuda():
        return GpuInfo(False, 0)
    return GpuInfo(True, paddle.device.cuda.device_count())


def _build_is_cpu_only() -> bool:
    """True when paddle/version/__init__.py says the build has neither CUDA nor ROCm
    (`cuda_version = 'False'`, `hip_version = 'False'`); False when unsure."""
    found = compat.build_fields()
    return found.get("cuda_version") == "False" and found.get("hip_version", "False") == "False"


# ---------------------------------------------------------------- devices
def parse_gpus(spec: str) -> List[str]:
    """'0,1' -> ['0', '1']; malformed or duplicated ids are a DeviceError."""
    if spec is None or str(spec).strip() == "":
        return []
    ids = [part.strip() for part in str(spec).split(",")]
    for gpu in ids:
        if not gpu.isdigit():
            raise DeviceError(f"--gpus {spec!r} is malformed: {gpu!r} is not a GPU id; "
                              "use comma-separated ids such as 0,1")
    dupes = sorted({g for g in ids if ids.count(g) > 1})
    if dupes:
        raise DeviceError(f"--gpus {spec!r} names GPU {','.join(dupes)} more than once; "
                          "give each GPU once")
    return ids


def visible_gpus(info: GpuInfo, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Physical ids this process can use, in CUDA's order."""
    environ = os.environ if environ is None else environ
    if not info.compiled_with_cuda or info.count == 0:
        return []
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None or listed.strip() in ("", "all"):
        return [str(i) for i in range(info.count)]
    return [x.strip() for x in listed.split(",") if x.strip()][: info.count]


def check_gpus(spec: str, info: GpuInfo, environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """Validate requested GPU ids against the build and `CUDA_VISIBLE_DEVICES`; return them."""
    environ = os.environ if environ is None else environ
    ids = parse_gpus(spec)
    if not ids:
        return []
    if not info.compiled_with_cuda:
        raise DeviceError(f"GPUs {spec} were requested but this Paddle build has no CUDA "
                          "(CPU paddlepaddle); install paddlepaddle-gpu, or drop --gpus to train on CPU")
    visible = visible_gpus(info, environ)
    missing = [g for g in ids if g not in visible]
    if missing:
        seen = ",".join(visible) or "none"
        where = ("CUDA_VISIBLE_DEVICES=" + environ["CUDA_VISIBLE_DEVICES"]
                 if environ.get("CUDA_VISIBLE_DEVICES") else f"{info.count} GPU(s) on this machine")
        raise DeviceError(f"GPU {','.join(missing)} is not visible (visible: {seen}; {where}); "
                          "pick --gpus from the visible ids")
    return ids


def select_device(launcher: str, local_rank: int, gpus: str, info: GpuInfo,
                  environ: Mapping[str, str], local_world_size: int = 1) -> str:
    """'cpu' or 'gpu:<n>' for this process (n counts among the visible GPUs); the rule is in
    the module docstring.

    Example:
        # `srun --gpus-per-task=1 --gpu-bind=single:1`, the task of local rank 5:
        select_device("slurm", 5, "", GpuInfo(True, 1), {"CUDA_VISIBLE_DEVICES": "5"}, 8)  # 'gpu:0'
    """
    requested = check_gpus(gpus, info, environ)
    visible = visible_gpus(info, environ)
    if not visible:
        return CPU
    flag = environ.get(DEVICE_FLAG, "")
    selected = flag.split(",")[0].strip()
    if selected and launcher not in EXTERNAL_ENGINES:
        # paddle.distributed.launch passes a position in the visible list, spawn the
        # physical id itself (spawn.py, "use absolute gpu card id").
        if launcher == "spawn" and selected in visible:
            return f"gpu:{visible.index(selected)}"
        return f"gpu:{int(selected)}"
    device = _by_local_rank(launcher, local_rank, requested, visible, local_world_size)
    if launcher in EXTERNAL_ENGINES:
        check_inherited_flag(launcher, local_rank, device, flag)
    return device


def _by_local_rank(launcher: str, local_rank: int, requested: List[str], visible: List[str],
                   local_world_size: int) -> str:
    """The GPU a rank takes when no Paddle launcher named one (module docstring)."""
    if not requested and len(visible) == 1:
        # The engine gave this task its own GPU. (One GPU that several tasks share looks
        # the same from here; NCCL then refuses: "Duplicate GPU detected".)
        return "gpu:0"
    pool = requested or visible
    ranks_here = max(local_world_size, local_rank + 1)
    if ranks_here > len(pool):
        raise DeviceError(gpu_shortage(launcher, ranks_here, pool, bool(requested)))
    return f"gpu:{visible.index(pool[local_rank])}"


def check_inherited_flag(launcher: str, local_rank: int, device: str, flag: str) -> None:
    """Refuse a FLAGS_selected_gpus that leaves out the GPU a rank of srun, mpirun or
    torchrun takes. Only Paddle's launchers set it; under another engine it is inherited
    (srun passes the submitting shell's environment to every task), and `import paddle`
    has already built its device contexts for the GPUs it lists alone, so the rank's first
    operation on its own GPU would fail ("Place(gpu:1) is not supported"). A flag that
    lists the rank's GPU (all of them, say) is harmless.

    Example:
        check_inherited_flag("slurm", 1, "gpu:1", "0")   # DeviceError: unset FLAGS_selected_gpus ...
    """
    listed = [part.strip() for part in flag.split(",") if part.strip()]
    index = device.split(":")[1]
    if not listed or any(part.isdigit() and int(part) == int(index) for part in listed):
        return
    where = UNSET_FLAG_WHERE.get(launcher, "before the ranks start")
    raise DeviceError(f"{DEVICE_FLAG}={flag.strip()} was inherited by this {launcher} rank (only "
                      f"Paddle's launchers set it), so Paddle can use only gpu:{','.join(listed)} "
                      f"here, but local rank {local_rank} takes {device}; unset {DEVICE_FLAG} "
                      f"{where} (`unset {DEVICE_FLAG}`)")


def gpu_shortage(launcher: str, ranks_here: int, pool: List[str], requested: bool) -> str:
    """The one-line error for more ranks on a node than GPUs to give them, with the fix."""
    what = "requested with --gpus" if requested else "visible to each rank"
    engine = EXTERNAL_ENGINES.get(launcher)
    fix = engine.gpu_hint if engine else "start at most one rank per GPU"
    return (f"{ranks_here} ranks on this node but only {len(pool)} GPUs ({','.join(pool)}) "
            f"{what}, and each rank needs its own; {fix}")


def select_backend(backend: str, device: str, world_size: int) -> str:
    """gloo on CPU, nccl on GPU unless asked otherwise; nccl without a GPU is an error."""
    if backend == "nccl" and not device.startswith("gpu"):
        raise DeviceError("dist.backend=nccl needs GPUs, but this process runs on CPU; "
                          "use dist.backend=auto (gloo on CPU) or select GPUs with --gpus")
    if world_size < 2:
        return "none"
    if backend != "auto":
        return backend
    return "nccl" if device.startswith("gpu") else "gloo"


# ---------------------------------------------------------------- variables for children
NCCL_KEYS = {
    "socket_ifname": "NCCL_SOCKET_IFNAME",
    "ib_hca": "NCCL_IB_HCA",
    "ib_disable": "NCCL_IB_DISABLE",
    "p2p_disable": "NCCL_P2P_DISABLE",
    "debug": "NCCL_DEBUG",
    "debug_subsys": "NCCL_DEBUG_SUBSYS",
}


def nccl_variables(nccl) -> Dict[str, str]:
    """The NCCL_* variables a `dist.nccl` config block asks for (unset fields are left out).

    Example:
        nccl_variables(cfg.dist.nccl)  # {'NCCL_SOCKET_IFNAME': 'eth0', 'NCCL_DEBUG': 'INFO'}
    """
    out = {}
    for key, var in NCCL_KEYS.items():
        value = getattr(nccl, key)
        if value is None or value == "":
            continue
        out[var] = ("1" if value else "0") if isinstance(value, bool) else str(value)
    out.update({k: str(v) for k, v in nccl.extra.items()})
    return out


def worker_variables(nccl, nprocs: int, cpu_count: Optional[int] = None,
                     environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """Variables every worker of a job gets: NCCL settings, and one OpenMP thread share
    per rank on CPU unless the user chose OMP_NUM_THREADS (two ranks each grabbing every
    core run slower than one)."""
    user_set = (USER_OMP_NUM_THREADS is not None if environ is None
                else "OMP_NUM_THREADS" in environ)
    out = nccl_variables(nccl)
    if not user_set:
        cores = cpu_count or os.cpu_count() or 1
        out["OMP_NUM_THREADS"] = str(max(1, cores // max(nprocs, 1)))
    return out


def loopback_variables(nccl, environ: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """For a job on one machine: gloo's and NCCL's sockets on the loopback interface, so
    that no rank listens for gradient traffic on an address other machines reach (by
    default gloo takes the address of the host name, NCCL the first interface that is not
    loopback). What the user chose (the variables, or dist.nccl.socket_ifname) is kept.

    Example:
        loopback_variables(cfg.dist.nccl, {})   # {'GLOO_SOCKET_IFNAME': 'lo', 'NCCL_SOCKET_IFNAME': 'lo'}
    """
    environ = os.environ if environ is None else environ
    out = {}
    if "GLOO_SOCKET_IFNAME" not in environ:
        out["GLOO_SOCKET_IFNAME"] = LOOPBACK
    if "NCCL_SOCKET_IFNAME" not in environ and not nccl.socket_ifname:
        out["NCCL_SOCKET_IFNAME"] = LOOPBACK
    return out


def child_environ(extra: Mapping[str, str]) -> Dict[str, str]:
    """A full environment for a child process: ours plus `extra`, without an inherited
    FLAGS_selected_gpus. The children are ranks the launcher places: it names each GPU
    rank's device in `extra` (rank_variables), Paddle's launcher names its ranks' own, and
    mpirun's ranks take theirs by local rank, where an inherited flag that leaves that
    GPU out stops them (check_inherited_flag); mpirun hands its whole environment to the
    ranks on its own machine."""
    env = {name: value for name, value in os.environ.items() if name != DEVICE_FLAG}
    env.update(extra)
    return env


def host_facts():
    """What plans depend on about this machine: (environment copy, GPUs, CPU cores).

    Example:
        environ, gpus, cores = host_facts()
        launcher.plan(cfg, env, environ=environ, gpu_info=gpus, cpu_count=cores)
    """
    return dict(os.environ), probe_gpus(), os.cpu_count() or 1


def export(variables: Mapping[str, str], keep_existing: bool = False) -> Dict[str, Optional[str]]:
    """Set variables in this process (for Paddle, which reads them itself); return the old
    values. `keep_existing`: leave a variable the user already set alone."""
    if keep_existing:
        variables = {k: v for k, v in variables.items() if k not in os.environ}
    old = {k: os.environ.get(k) for k in variables}
    os.environ.update({k: str(v) for k, v in variables.items()})
    return old


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


def restore(old: Mapping[str, Optional[str]]) -> None:
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _master_host_port(env: DistEnv) -> Tuple[str, int]:
    """Split `env.master`; a missing or malformed one is a UserError naming the engine."""
    hint = EXTERNAL_ENGINES[env.launcher].master_hint
    if not env.master:
        raise UserError(f"{env.launcher} started {env.world_size} ranks but no rendezvous "
                        f"address is known for Paddle's process group; {hint}")
    host, _, port = env.master.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"the rendezvous address {env.master!r} ({env.launcher}) is not "
                        f"host:port with a port 1-65535; {hint}")
    return host, int(port)


def paddle_variables(env: DistEnv) -> Dict[str, str]:
    """The variables `paddle.distributed.init_parallel_env()` reads, for ranks that another
    engine (mpirun, srun, torchrun) started. Empty for Paddle's own launchers, which set
    them, for a standalone process and for a single rank (no process group).

    Example:
        # rank 1 of `mpirun -n 2 -x MASTER_ADDR=h0 -x MASTER_PORT=29500 python train.py`:
        paddle_variables(detect())
        # {'PADDLE_TRAINER_ID': '1', 'PADDLE_TRAINERS_NUM': '2', 'PADDLE_MASTER': 'h0:29500', ...}
    """
    if env.launcher not in EXTERNAL_ENGINES or env.world_size < 2:
        return {}
    host, port = _master_host_port(env)
    # What Paddle 3.3 reads (distributed/parallel.py):
    # - init_parallel_env requires PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM and
    #   PADDLE_CURRENT_ENDPOINT to exist (and FLAGS_selected_gpus on CUDA, which
    #   prepare_process_group sets from env.device).
    # - Its process-group path takes the rendezvous from MASTER_ADDR + MASTER_PORT first,
    #   then PADDLE_MASTER, then the first PADDLE_TRAINER_ENDPOINTS entry: rank 0 serves a
    #   TCP store there. All of them get our master, so whichever Paddle reads agrees
    #   (torchrun's MASTER_PORT, for one, is taken by its agent: see TorchrunStyle.master).
    # - PADDLE_CURRENT_ENDPOINT is only checked for existence there; nothing binds it, so a
    #   well-formed label serves: the master host, master port + 1 + global rank (wrapped
    #   into 1..65535).
    # - PADDLE_TRAINER_ENDPOINTS: every rank's endpoint cannot be known without talking.
    #   Only ParallelEnv().trainer_endpoints reads it, and on this path only
    #   paddle.utils.download uses it: one rank per host in the list downloads and the
    #   others wait for the file, so a made-up list naming wrong hosts could make a rank wait
    #   forever, while this rank's own endpoint alone just lets each rank download itself.
    # - The local rank and sizes are what Paddle's launcher sets too (fleet's role maker
    #   reads PADDLE_RANK_IN_NODE), so a later detect() in this process sees the same ranks.
    current = f"{host}:{(port + env.global_rank) % 65535 + 1}"
    return {
        "PADDLE_TRAINER_ID": str(env.global_rank),
        "PADDLE_TRAINERS_NUM": str(env.world_size),
        "PADDLE_MASTER": f"{host}:{port}",
        "MASTER_ADDR": host,
        "MASTER_PORT": str(port),
        "PADDLE_CURRENT_ENDPOINT": current,
        "PADDLE_TRAINER_ENDPOINTS": current,
        "PADDLE_RANK_IN_NODE": str(env.local_rank),
        "PADDLE_LOCAL_RANK": str(env.local_rank),
        "PADDLE_LOCAL_SIZE": str(env.local_world_size),
        "PADDLE_NNODES": str(env.nnodes),
    }


def store_endpoint() -> Tuple[str, int]:
    """Where `init_parallel_env` finds rank 0's TCP store, in Paddle 3.3's order
    (distributed/parallel.py): MASTER_ADDR + MASTER_PORT, PADDLE_MASTER, then the first
    PADDLE_TRAINER_ENDPOINTS entry. ("", 0) when none is set."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        endpoint = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    else:
        endpoint = (os.environ.get("PADDLE_MASTER")
                    or os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0])
    host, _, port = endpoint.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else ("", 0)


def prepare_process_group(env: DistEnv, nccl) -> None:
    """Export what Paddle reads before `init_parallel_env`: backend, NCCL settings, the
    device flag, and the ranks of a process another engine started (`paddle_variables`).
    Done in the worker too, so a bare `paddle.distributed.launch` gets them."""
    variables = nccl_variables(nccl)
    variables.update(paddle_variables(env))   # may refuse: nothing is exported then
    if env.backend != "none":
        variables["PADDLE_DISTRI_BACKEND"] = env.backend
    if env.device.startswith("gpu"):
        variables["FLAGS_selected_gpus"] = env.device.split(":")[1]
    export(variables)


def launch_variables(config: Optional[str], overrides: List[str]) -> Dict[str, str]:
    """What `python -m paddle_dist.launch` hands the script's ranks of its -c and -o."""
    out = {LAUNCH_OVERRIDES: json.dumps(list(overrides))} if overrides else {}
    if config:
        out[LAUNCH_CONFIG] = config
    return out


def launch_options(environ: Optional[Mapping[str, str]] = None) -> Tuple[Optional[str], List[str]]:
    """(config path or None, overrides) given to `python -m paddle_dist.launch` for this
    script; (None, []) otherwise.

    Example:
        launch_options({"PADDLE_DIST_OVERRIDES": '["train.epochs=1"]'})   # (None, ['train.epochs=1'])
    """
    environ = os.environ if environ is None else environ
    try:
        overrides = json.loads(environ.get(LAUNCH_OVERRIDES, "[]"))
    except ValueError:
        overrides = []
    return environ.get(LAUNCH_CONFIG) or None, [str(item) for item in overrides]


def run_pointer(environ: Optional[Mapping[str, str]] = None) -> str:
    """The file in which rank 0 of a `fit()` under `python -m paddle_dist.launch` writes its
    run directory ("" when no paddle_dist launcher asked for it).

    Example:
        run_pointer({"PADDLE_DIST_RUN_POINTER": "log/run_dir"})   # 'log/run_dir'
    """
    environ = os.environ if environ is None else environ
    return environ.get(RUN_POINTER, "")
