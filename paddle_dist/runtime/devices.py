"""Which device a process trains on: the GPUs this build and machine offer, the one a rank
takes, and the backend that goes with it.

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
    info = probe_gpus()                                    # GpuInfo(True, 8) on 8 GPUs
    select_device("torchrun", 3, "", info, {}, local_world_size=8)   # 'gpu:3'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Mapping, Optional, Sequence, Tuple

from .. import compat
from .engines import EXTERNAL_ENGINES
from ..errors import DeviceError

CPU = "cpu"
# The GPUs `import paddle` builds device contexts for (positions among the visible GPUs);
# Paddle's launchers set it per rank.
DEVICE_FLAG = "FLAGS_selected_gpus"
# Where an inherited FLAGS_selected_gpus must go for each external engine's ranks.
UNSET_FLAG_WHERE = {"openmpi": "before mpirun", "slurm": "in the job script, before srun",
                    "torchrun": "before torchrun, or before each command that starts a rank by hand"}


@dataclass(frozen=True)
class GpuInfo:
    """What this Paddle build and machine offer; `probe_gpus()` fills it in."""

    compiled_with_cuda: bool = False
    count: int = 0


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
    if selected and launcher == "standalone" and requested:
        check_flag_against_gpus(gpus, requested, visible, flag)
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


def check_flag_against_gpus(gpus: str, requested: List[str], visible: List[str], flag: str) -> None:
    """A process no launcher started, with dist.gpus and a FLAGS_selected_gpus left in its
    environment (by a shell, a job script, an earlier launch): Paddle takes the flag's GPU
    (a position among the visible ones), so one line when it is not one dist.gpus names.

    Example:
        check_flag_against_gpus("0", ["0"], ["0", "1"], "1")   # DeviceError: ... selects GPU 1 ...
    """
    selected = flag.split(",")[0].strip()
    chosen = visible[int(selected)] if selected.isdigit() and int(selected) < len(visible) else selected
    if chosen not in requested:
        raise DeviceError(f"dist.gpus={gpus}, but FLAGS_selected_gpus={flag}, inherited from the environment, "
                          f"selects GPU {chosen}, which Paddle would use instead; unset FLAGS_selected_gpus "
                          "or drop dist.gpus")


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


def resolve_devices(nprocs: Optional[int], gpus: Sequence[str], visible: Sequence[str],
                    backend: str) -> Tuple[int, Tuple[str, ...]]:
    """(process count, GPU ids) for a job. `--gpus 0,1` alone means two processes;
    without `--gpus` on a GPU machine each process takes the next visible GPU.
    `nprocs=None` means "not given"."""
    if gpus:
        if nprocs is not None and nprocs != len(gpus):
            raise DeviceError(f"--nprocs {nprocs} does not match --gpus {','.join(gpus)} "
                              f"({len(gpus)} GPUs); one process runs per GPU, so drop --nprocs "
                              "or make them agree")
        return len(gpus), tuple(gpus)
    count = nprocs or 1
    if not visible or backend == "gloo":
        return count, ()
    if count > len(visible):
        raise DeviceError(f"{count} processes need {count} GPUs but {len(visible)} are visible "
                          f"({','.join(visible)}); use --nprocs {len(visible)} or fewer, "
                          "or dist.backend=gloo to train on CPU")
    return count, tuple(visible[:count])


@dataclass(frozen=True)
class JobDevices:
    """A job's devices on this machine as its launcher resolves them, once (job_devices)."""

    nprocs: int = 1                    # the ranks it starts here (mpirun: in the whole job)
    gpus: Tuple[str, ...] = ()         # their GPUs, physical ids; () on CPU
    visible: Tuple[str, ...] = ()      # the GPUs visible here (a rank's position among them)
    backend: str = "none"              # the process group's: gloo | nccl | none (one rank in all)


def job_devices(nprocs: Optional[int], gpus: str, backend: str, info: GpuInfo,
                environ: Mapping[str, str], slots: Optional[int] = None, nodes: int = 1) -> JobDevices:
    """dist.gpus checked against this machine, the ranks and their GPUs (`resolve_devices`;
    `slots`: an mpirun hostfile's count instead), and the backend of a job of those ranks
    on each of `nodes` machines (`select_backend`), in one place.

    Example:
        job_devices(None, "1,2", "auto", GpuInfo(True, 4), {})
        # JobDevices(nprocs=2, gpus=('1', '2'), visible=('0', '1', '2', '3'), backend='nccl')
    """
    requested = check_gpus(gpus, info, environ)
    visible = visible_gpus(info, environ)
    count, chosen = resolve_devices(nprocs, requested, visible, backend)
    count = count if slots is None else slots
    resolved = select_backend(backend, "gpu" if chosen else CPU, count * nodes)
    return JobDevices(count, chosen, tuple(visible), resolved)
