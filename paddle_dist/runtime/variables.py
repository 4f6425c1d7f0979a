"""The variables a process hands its children and Paddle: NCCL and OpenMP settings for a
job's workers, loopback sockets for a job on one machine, a child's whole environment, and
the PADDLE_* variables `init_parallel_env()` reads for ranks that another engine started.

This process's own environment changes only through `export` (put back with `restore`);
a child gets a dict (`child_environ`).

Example:
    extra = worker_variables(cfg.dist.nccl, nprocs=4)   # {'OMP_NUM_THREADS': '2', ...}
    subprocess.Popen(argv, env=child_environ(extra))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .devices import DEVICE_FLAG, GpuInfo, probe_gpus
from .engines import EXTERNAL_ENGINES
from .env import USER_OMP_NUM_THREADS, DistEnv
from .paddle_import import OMP_CHOSEN
from ..errors import UserError
from ..security import rankgate

LOOPBACK = "lo"            # Linux's loopback interface
# dist.nccl's fields and the variables they set
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
    core run slower than one). The share is marked as paddle_dist's (`OMP_CHOSEN`), so that
    a rank's `import paddle` leaves out Paddle's warning about a count above 1."""
    user_set = (USER_OMP_NUM_THREADS is not None if environ is None
                else "OMP_NUM_THREADS" in environ)
    out = nccl_variables(nccl)
    if not user_set:
        cores = cpu_count or os.cpu_count() or 1
        out["OMP_NUM_THREADS"] = out[OMP_CHOSEN] = str(max(1, cores // max(nprocs, 1)))
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


@dataclass(frozen=True)
class HostFacts:
    """What plans depend on about this machine, read once by `host_facts()`."""

    environ: Dict[str, str]    # a copy of this process's environment
    gpus: GpuInfo
    cores: int


def host_facts() -> HostFacts:
    """What plans depend on about this machine: a copy of the environment, its GPUs and
    its CPU cores.

    Example:
        host = host_facts()
        launcher.plan(JobSpec(cfg, host, env, script="train.py"))
    """
    return HostFacts(dict(os.environ), probe_gpus(), os.cpu_count() or 1)


def port_range(environ: Mapping[str, str]) -> Tuple[int, int]:
    """PORT_RANGE ("low:high", the variable Paddle's launcher reads for its own ports) as
    (low, high), where the launcher picks the store's port; (0, 0), the kernel's pick, when
    it is unset or not a usable range.

    Example:
        port_range({"PORT_RANGE": "20000:20999"})     # (20000, 20999)
    """
    try:
        low, high = (int(part) for part in environ.get("PORT_RANGE", "").split(":"))
    except ValueError:
        return 0, 0
    return (low, high) if 0 < low <= high < 65536 else (0, 0)


def export(variables: Mapping[str, str], keep_existing: bool = False) -> Dict[str, Optional[str]]:
    """Set variables in this process (for Paddle, which reads them itself); return the old
    values. `keep_existing`: leave a variable the user already set alone."""
    if keep_existing:
        variables = {k: v for k, v in variables.items() if k not in os.environ}
    old = {k: os.environ.get(k) for k in variables}
    os.environ.update({k: str(v) for k, v in variables.items()})
    return old


def restore(old: Mapping[str, Optional[str]]) -> None:
    """Put back what `export` returned: the old values, a variable that was unset removed."""
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


def rank_variables(nprocs: int, selected: Sequence[str], port: Optional[int] = None,
                   host: str = "127.0.0.1") -> List[Dict[str, str]]:
    """Each rank's variables as Paddle 3.3's launcher sets them on one machine
    (distributed/launch/controllers/collective.py), but for where rank 0 serves the TCP
    store: the job's gate tells each rank once it is admitted (rankgate.store_variables),
    unless `port` is given. `selected`: FLAGS_selected_gpus per rank, empty on CPU.

    Example:
        rank_variables(2, ())[1]["PADDLE_TRAINER_ID"]   # '1'
    """
    out = []
    for rank in range(nprocs):
        variables = {
            "PADDLE_GLOBAL_SIZE": str(nprocs),
            "PADDLE_LOCAL_SIZE": str(nprocs), "PADDLE_GLOBAL_RANK": str(rank),
            "PADDLE_LOCAL_RANK": str(rank), "PADDLE_NNODES": "1",
            "PADDLE_TRAINER_ID": str(rank),
            "PADDLE_TRAINERS_NUM": str(nprocs), "PADDLE_RANK_IN_NODE": str(rank),
        }
        if port is not None:
            variables.update(rankgate.store_variables(rank, nprocs, host, port))
        if selected:
            variables["FLAGS_selected_gpus"] = selected[rank]
        else:
            variables["PADDLE_DISTRI_BACKEND"] = "gloo"
        out.append(variables)
    return out
