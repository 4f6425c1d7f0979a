"""Who this process is, its set-up and its watching (launchers read the first part too).

- env: `detect()` -> a frozen `DistEnv` (ranks, engine, device, backend); a rank started by hand;
- engines: one class per engine (Paddle's launchers, mpirun, srun, torchrun), detected in order;
- devices: the GPUs this build and machine offer, the one a rank takes, the backend;
- variables: what children and Paddle get (NCCL, OpenMP, loopback, PADDLE_*); `host_facts()`;
- protocol: paddle_dist's own PADDLE_DIST_* variables, from its launcher to the ranks;
- netcheck: the route and interface to the master; gloocheck: why a process group did not form;
- process: `setup()` (device, process group, seeds); seedorder: a model built before the seed;
  monitor, watchdog, _deadline: status,
  stop requests, phases and the hang watchdog; inject: fault injection;
- paddle_import: `import paddle` with the garbage collector paused (a third less CPU per rank);
- scripthooks/: what a plain script's ranks get under `python -m paddle_dist.launch`
  (its DataParallel's BatchNorm statistics: --sync-buffers, or a warning).

This face imports no paddle (the launcher's start-up time depends on it): `process` does.

Example:
    from paddle_dist.runtime import detect
    env = detect()
    print(env.global_rank, env.local_rank, env.device)   # 0 0 cpu
"""

from .devices import GpuInfo, probe_gpus
from .env import DistEnv, detect, hand_started
from .protocol import launch_options
from .variables import HostFacts, host_facts

__all__ = ["DistEnv", "GpuInfo", "HostFacts", "detect", "hand_started", "host_facts", "launch_options",
           "probe_gpus"]
