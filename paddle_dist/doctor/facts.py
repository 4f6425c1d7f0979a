"""What this machine offers, for a bug report; the pre-flight check's and the self-test's
command line.

`gather()` collects versions (Paddle's build, whether paddle_dist supports it, and whether
the CUDA libraries a GPU build opens load here: buildinfo.py), CPU, memory, GPUs, the
variables that steer Paddle, NCCL and gloo, network interfaces, /dev/shm and proxies
(passwords masked), and what a job exposes on the network (exposure.py); `--check` adds
the pre-flight of a job's config (preflight.py) and describes that job's exposure.

Every function takes the environment as a mapping (from `runtime/variables.host_facts()`),
so tests pass their own.

`--test` runs a short real job on this machine and prints a PASS/FAIL table (selftest.py).

Example:
    python -m paddle_dist.doctor                      # paste the output into an issue
    python -m paddle_dist.doctor --check -c configs/mnist_lenet.yaml -o dist.master=127.0.0.1:6170
    python -m paddle_dist.doctor --test --nprocs 2    # 2 CPU ranks (default: every visible GPU)
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path
from importlib import metadata
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import buildinfo, gpucode
from .. import compat
from ..security import exposure
from ..runtime import netcheck
from ..runtime import devices as devicelib, env as envlib, variables as varlib
from ..errors import UserError
from ..launch.preflight import ERROR, SHM_PATH, Problem, StatVfs, preflight, readable_bytes, shm_facts

NVIDIA_SMI_TIMEOUT = 10.0         # seconds; a wedged driver makes nvidia-smi hang
PROXY_NAMES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
VARIABLE_PREFIXES = ("NCCL_", "GLOO_", "PADDLE_", "FLAGS_", "CUDA_", "OMP_", "MKL_")
VARIABLE_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
# USER:PASSWORD@ in a URL or a bare proxy address; greedy, so a password holding '@' is
# masked whole.
CREDENTIALS = re.compile(r"(^|://|,)[^/,\s]+@")


# ---------------------------------------------------------------- the report
def gather(environ: Mapping[str, str], gpu_info: devicelib.GpuInfo, cpu_count: int,
           statvfs: StatVfs = os.statvfs, shm_path: str = SHM_PATH) -> Dict[str, Any]:
    """Everything a bug report needs about this machine, as JSON-ready sections.

    Example:
        host = varlib.host_facts()
        gather(host.environ, host.gpus, host.cores)["shm"]   # {'path': '/dev/shm', 'present': True, 'size': ...}
    """
    return {
        "versions": versions(),
        "cpu": cpu_facts(cpu_count),
        "gpus": gpu_facts(gpu_info, environ),
        "variables": relevant_variables(environ),
        "network": netcheck.interfaces(),
        "shm": shm_facts(statvfs, shm_path),
        "proxies": proxies(environ),
    }


def versions() -> Dict[str, Any]:
    """Python, OS and package versions; Paddle's build (CPU, or the CUDA and cuDNN it was
    built for: None for a CPU build), whether paddle_dist supports it, and whether the
    CUDA libraries a GPU build opens load here (`paddle_facts`)."""
    import paddle   # already imported by varlib.host_facts(); the report is not on a fast path

    from .. import __version__

    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "kernel": platform.release(),
        **paddle_facts(buildinfo.current(), buildinfo.site_packages()),
        "nccl": buildinfo.version_of(paddle.version, "nccl"),
        "paddle_with_cuda": paddle.is_compiled_with_cuda(),
        "paddle_commit": paddle.version.commit,
        "visualdl": _installed("visualdl"),
        "numpy": _installed("numpy"),
        "numpy_fix": compat.numpy_problem(paddle.__version__, _installed("numpy") or "0"),
        "pyyaml": _installed("PyYAML"),
        "paddle_dist": __version__,
    }


def paddle_facts(build: buildinfo.Build, site: Optional[Path],
                 loader: Callable[[str], str] = buildinfo.load_library) -> Dict[str, Any]:
    """The report's lines on Paddle's build: version, support, CUDA and cuDNN, where each
    library the build opens loads from (None where it does not), and one line on what to
    install when some are missing. `loader(name)` loads a library (OSError when it
    cannot), so a test can be a CUDA build on a machine without CUDA.

    Example:
        paddle_facts(buildinfo.Build("2.6.2", "11.8", "8.6.0"), None)["cuda_fix"]
        # 'pip install "nvidia-cudnn-cu11==8.6.*" nvidia-cublas-cu11 ... and export LD_LIBRARY_PATH=...'
    """
    found = buildinfo.probe(buildinfo.libraries(build), site, loader)
    return {
        "paddle": build.version,
        "paddle_supported": compat.is_supported(build.version),
        "paddle_supported_versions": compat.SUPPORTED,
        "paddle_build": build.describe(),
        "cuda": build.cuda,
        "cudnn": build.cudnn,
        "cuda_libraries": found,
        "cuda_fix": buildinfo.fix(build, found, site),
    }


def _installed(distribution: str) -> Optional[str]:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def cpu_facts(cpu_count: int, cpuinfo: str = "/proc/cpuinfo",
              meminfo: str = "/proc/meminfo") -> Dict[str, Any]:
    """CPU model, logical cores, the cores this process may run on, and total memory in bytes."""
    model = _first_field(_read(cpuinfo), ("model name", "Model", "Hardware"))
    return {
        "model": model or platform.processor() or None,
        "logical_cores": cpu_count,
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total": _meminfo_bytes(_read(meminfo), "MemTotal"),
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _first_field(text: str, keys: Tuple[str, ...]) -> Optional[str]:
    """The first `key : value` of /proc/cpuinfo whose key is one of `keys` (x86 says
    'model name', ARM 'Model' or 'Hardware')."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keys and value.strip():
            return value.strip()
    return None


def _meminfo_bytes(text: str, key: str) -> Optional[int]:
    value = _first_field(text, (key,))          # "32779804 kB"
    return int(value.split()[0]) * 1024 if value else None


def gpu_facts(gpu_info: devicelib.GpuInfo, environ: Mapping[str, str]) -> Dict[str, Any]:
    """What Paddle sees (count, names), what the driver lists (`nvidia-smi -L`),
    CUDA_VISIBLE_DEVICES, and whether the build has code for each GPU model (`code`:
    gpucode's lines; `code_fits`: False when it has none for one)."""
    verdicts = gpu_code(gpu_info, environ)
    return {
        "count": gpu_info.count,
        "names": _gpu_names(gpu_info),
        "nvidia_smi": _nvidia_smi(environ),
        "CUDA_VISIBLE_DEVICES": environ.get("CUDA_VISIBLE_DEVICES"),
        "code": [line for _, line in verdicts],
        "code_fits": all(fits for fits, _ in verdicts),
    }


def gpu_code(gpu_info: devicelib.GpuInfo, environ: Mapping[str, str]) -> List[Tuple[bool, str]]:
    """gpucode's verdict for each GPU model here; [] on a CPU build."""
    if not gpu_info.compiled_with_cuda:
        return []
    import paddle

    try:
        found = gpucode.capabilities(paddle, gpu_info.count, lambda: _nvidia_smi(
            environ, ["--query-gpu=name,compute_cap", "--format=csv,noheader"]))
        return gpucode.lines(gpucode.build_code(paddle), found)
    except Exception as e:  # noqa: BLE001 - a broken driver is worth reporting, not a crash
        return [(True, f"cannot tell which GPUs this build has code for: {e}")]


def _gpu_names(gpu_info: devicelib.GpuInfo) -> List[str]:
    if not gpu_info.compiled_with_cuda or not gpu_info.count:
        return []
    import paddle

    try:
        return [paddle.device.cuda.get_device_name(i) for i in range(gpu_info.count)]
    except Exception as e:  # noqa: BLE001 - a broken driver is worth reporting, not a crash
        return [f"cannot query: {e}"]


def _nvidia_smi(environ: Mapping[str, str], args: Sequence[str] = ("-L",)) -> Optional[str]:
    """`nvidia-smi -L` output (or of `args`); None when the binary is not on PATH."""
    binary = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, *args], capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"no answer within {NVIDIA_SMI_TIMEOUT:g} s (driver hung?)"
    except OSError as e:
        return f"cannot run: {e}"
    return (done.stdout + done.stderr).strip() or f"exit code {done.returncode}, no output"


def relevant_variables(environ: Mapping[str, str]) -> Dict[str, str]:
    """The variables Paddle, NCCL, gloo, CUDA and OpenMP read, sorted, credentials masked."""
    return {name: mask_credentials(environ[name]) for name in sorted(environ)
            if name.startswith(VARIABLE_PREFIXES) or name in VARIABLE_NAMES}


def proxies(environ: Mapping[str, str]) -> Dict[str, str]:
    """Proxy variables that are set, in both cases, with USER:PASSWORD@ masked."""
    names = [n for lower in PROXY_NAMES for n in (lower, lower.upper())]
    return {n: mask_credentials(environ[n]) for n in names if n in environ}


def mask_credentials(value: str) -> str:
    """Hide what precedes '@' in a URL's authority.

    Example:
        mask_credentials("http://bob:s3cret@proxy:3128")   # 'http://***@proxy:3128'
    """
    return CREDENTIALS.sub(r"\1***@", value)


# ---------------------------------------------------------------- printing the report
def format_report(d: Mapping[str, Any]) -> str:
    """The report as a fenced text block with one section per topic and aligned keys, to
    paste into a GitHub issue as it is."""
    blocks = [_section(name, _rows(name, value)) for name, value in d.items()]
    return "### paddle_dist environment\n```text\n" + "\n\n".join(blocks) + "\n```"


def _rows(section: str, value: Mapping[str, Any]) -> List[Tuple[str, str]]:
    if section == "shm":
        if not value.get("present"):
            return [("path", f"{value['path']} (missing)")]
        return [("path", value["path"]), ("size", readable_bytes(value["size"])),
                ("free", readable_bytes(value["free"]))]
    if section == "network":
        return [(name, ", ".join(addrs) or "(no IPv4 address)") for name, addrs in value.items()]
    if section in ("variables", "proxies") and not value:
        return [("(none set)", "")]
    if section == "versions":
        return [row for key, v in value.items() for row in _version_rows(key, v)]
    return [(key, readable_bytes(v) if key == "memory_total" else _text(v)) for key, v in value.items()]


def _version_rows(key: str, value: Any) -> List[Tuple[str, str]]:
    """One row per version fact; the CUDA libraries one line each (left out for a CPU
    build, which opens none), the fix only when there is something to fix."""
    if key == "cuda_libraries":
        width = max((len(name) for name in value), default=0)
        lines = [f"{name:<{width}}  {path or 'missing'}" for name, path in value.items()]
        return [(key, "\n".join(lines))] if lines else []
    if key in ("cuda_fix", "numpy_fix"):
        return [(key, value)] if value else []
    return [(key, _text(value))]


def _section(title: str, rows: List[Tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    lines = [title]
    for key, text in rows:
        first, *rest = text.splitlines() or [""]
        lines.append(f"  {key:<{width}}  {first}".rstrip())
        lines += [f"  {'':<{width}}  {more}" for more in rest]
    return "\n".join(lines)


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "-"
    return str(value)


# ---------------------------------------------------------------- command line
def main(argv: Optional[List[str]] = None) -> int:
    """`python -m paddle_dist.doctor [--json] [--check [-c CONFIG] [-o KEY=VALUE ...]]` and
    `... --test [--nprocs N] [--gpus LIST]`. Exit 0 when fine (warnings allowed, checks
    skipped), 1 when the pre-flight found an error or a self-test check failed."""
    args = _parser().parse_args(argv)
    if not args.check and (args.config or args.override):
        raise UserError("-c/-o only apply to the pre-flight check; add --check")
    if not args.test and (args.nprocs is not None or args.gpus is not None):
        raise UserError("--nprocs/--gpus only apply to the self-test; add --test")
    if args.test:
        if args.check:
            raise UserError("--test and --check are separate runs; give one of them")
        from . import selftest

        return selftest.run(args.nprocs, args.gpus, args.json)
    from .. import config as configlib

    cfg = configlib.load(args.config, args.override) if args.check else None
    host = varlib.host_facts()
    environ = shell_environ(host.environ)
    data = gather(environ, host.gpus, host.cores)
    data["exposure"] = dict(exposure.rows(cfg or configlib.load(None, [])))   # of the job checked, else the demo's
    problems = preflight(cfg, environ, host.gpus) if cfg is not None else []
    if not data["gpus"]["code_fits"]:       # nothing would run: as bad as a pre-flight error
        problems += [Problem(ERROR, line) for line in data["gpus"]["code"] if gpucode.NO_CODE in line]
    _print(data, problems, args.json, args.check)
    return 1 if any(p.severity == ERROR for p in problems) else 0


def _parser():
    from ..options import ArgParser, add_config_options

    parser = ArgParser(prog="python -m paddle_dist.doctor",
                       description="Print this machine's environment for a bug report, check a "
                                   "config against it (--check), or run a short real job on it "
                                   "and print a PASS/FAIL table (--test).")
    parser.add_argument("--json", action="store_true", help="print the report (or the self-test) as JSON")
    parser.add_argument("--check", action="store_true",
                        help="also run the pre-flight check for the config (-c, -o)")
    add_config_options(parser)
    test = parser.add_argument_group("self-test")
    test.add_argument("--test", action="store_true",
                      help="run a short real job (all-reduce per dtype, gradient sync against a "
                           "one-process replay, checkpoint and RNG, AMP on GPUs, export and "
                           "predict) and print a PASS/FAIL table; exit 1 if a check failed")
    test.add_argument("--nprocs", type=int, default=None,
                      help="ranks for --test (default: one per visible GPU, else 2 CPU ranks)")
    test.add_argument("--gpus", default=None, help="GPU ids for --test, e.g. 0,1 (default: every visible GPU)")
    return parser


def shell_environ(environ: Mapping[str, str]) -> Dict[str, str]:
    """`environ` without the OMP_NUM_THREADS=1 that `import paddle` sets when the shell did
    not, so the report does not pass it off as the user's choice."""
    out = dict(environ)
    if envlib.USER_OMP_NUM_THREADS is None:
        out.pop("OMP_NUM_THREADS", None)
    return out


def _print(data: Dict[str, Any], problems: List[Problem], as_json: bool, checked: bool) -> None:
    errors = sum(p.severity == ERROR for p in problems)
    if as_json:
        if checked:
            found = [asdict(p) for p in problems]
            data = dict(data, preflight={"errors": errors, "problems": found})
        print(json.dumps(data, indent=2))
        return
    print(format_report(data))
    if checked or problems:          # without --check: the build's missing GPU code alone
        print()
        for problem in problems:
            print(problem)
    if checked:
        print(f"pre-flight: {errors} error(s)" if errors else "pre-flight: ok")

