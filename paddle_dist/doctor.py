"""What this machine offers, for a bug report; and a pre-flight check for a job's config.

`report()` collects versions, CPU, memory, GPUs, the variables that steer Paddle, NCCL and
gloo, network interfaces, /dev/shm and proxies (passwords masked). `preflight()` turns the
usual causes of a start that hangs (a taken master port, a tiny /dev/shm, an HTTP proxy in
the way of the rendezvous, a socket interface that does not exist, GPUs that are not there)
into one-line problems; `check()` raises the first error for the launcher.

Every function takes the environment as a mapping (from `env.host_facts()`), so tests pass
their own.

Example:
    python -m paddle_dist.doctor                      # paste the output into an issue
    python -m paddle_dist.doctor --check -c configs/mnist_lenet.yaml -o dist.master=127.0.0.1:6170

    environ, gpus, cores = env.host_facts()
    for problem in preflight(cfg, environ, gpus):
        print(problem)                                # error: port 6170 of dist.master ...
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import platform
import re
import shutil
import socket
import subprocess
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Set, Tuple

from . import env as envlib
from . import netcheck
from .errors import UserError

ERROR, WARNING = "error", "warning"
SHM_PATH = "/dev/shm"
SHM_MIN = 1 << 30                 # below this, NCCL's shared-memory transport runs out
NVIDIA_SMI_TIMEOUT = 10.0         # seconds; a wedged driver makes nvidia-smi hang
TCP_LISTEN = "0A"                 # the `st` column of /proc/net/tcp (include/net/tcp_states.h)
PROXY_NAMES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
VARIABLE_PREFIXES = ("NCCL_", "GLOO_", "PADDLE_", "FLAGS_", "CUDA_", "OMP_", "MKL_")
VARIABLE_NAMES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
CHECK_HINT = "run python -m paddle_dist.doctor --check"
# USER:PASSWORD@ in a URL or a bare proxy address; greedy, so a password holding '@' is
# masked whole.
CREDENTIALS = re.compile(r"(^|://|,)[^/,\s]+@")
NO_PROXY_ENTRY = re.compile(r"(.*?)(?::(\d+))?")   # host[:port]

StatVfs = Callable[[str], Any]


class PreflightError(UserError):
    """The config cannot start on this machine; the message names the first reason."""


@dataclass(frozen=True)
class Problem:
    """One pre-flight finding: `severity` is "error" (the job would fail or hang) or
    "warning"; `message` says what is wrong and how to fix it, on one line."""

    severity: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


# ---------------------------------------------------------------- the report
def report(environ: Mapping[str, str], gpu_info: envlib.GpuInfo, cpu_count: int,
           statvfs: StatVfs = os.statvfs, shm_path: str = SHM_PATH) -> Dict[str, Any]:
    """Everything a bug report needs about this machine, as JSON-ready sections.

    Example:
        environ, gpus, cores = env.host_facts()
        report(environ, gpus, cores)["shm"]   # {'path': '/dev/shm', 'present': True, 'size': ...}
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
    """Python, OS and package versions; CUDA, cuDNN and NCCL as the Paddle build reports them
    (None for a CPU build)."""
    import paddle   # already imported by env.host_facts(); the report is not on a fast path

    from . import __version__

    v = paddle.version
    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "platform": platform.platform(),
        "kernel": platform.release(),
        "paddle": v.full_version,
        "paddle_commit": v.commit,
        "paddle_with_cuda": paddle.is_compiled_with_cuda(),
        "cuda": _build_version(v, "cuda"),
        "cudnn": _build_version(v, "cudnn"),
        "nccl": _build_version(v, "nccl"),
        "visualdl": _installed("visualdl"),
        "numpy": _installed("numpy"),
        "pyyaml": _installed("PyYAML"),
        "paddle_dist": __version__,
    }


def _build_version(version_module, name: str) -> Optional[str]:
    # A CPU build answers False for cuda()/cudnn() and '0' for nccl(); older builds lack nccl().
    value = getattr(version_module, name, lambda: None)()
    return None if value in (None, False, "", "0", "False") else str(value)


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


def gpu_facts(gpu_info: envlib.GpuInfo, environ: Mapping[str, str]) -> Dict[str, Any]:
    """What Paddle sees (count, names), what the driver lists (`nvidia-smi -L`), and
    CUDA_VISIBLE_DEVICES."""
    return {
        "count": gpu_info.count,
        "names": _gpu_names(gpu_info),
        "nvidia_smi": _nvidia_smi(environ),
        "CUDA_VISIBLE_DEVICES": environ.get("CUDA_VISIBLE_DEVICES"),
    }


def _gpu_names(gpu_info: envlib.GpuInfo) -> List[str]:
    if not gpu_info.compiled_with_cuda or not gpu_info.count:
        return []
    import paddle

    try:
        return [paddle.device.cuda.get_device_name(i) for i in range(gpu_info.count)]
    except Exception as e:  # noqa: BLE001 - a broken driver is worth reporting, not a crash
        return [f"cannot query: {e}"]


def _nvidia_smi(environ: Mapping[str, str]) -> Optional[str]:
    """`nvidia-smi -L` output; None when the binary is not on PATH."""
    binary = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if binary is None:
        return None
    try:
        done = subprocess.run([binary, "-L"], capture_output=True, text=True,
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


def shm_facts(statvfs: StatVfs = os.statvfs, path: str = SHM_PATH) -> Dict[str, Any]:
    """Size and free bytes of /dev/shm, or `present: False`."""
    try:
        st = statvfs(path)
    except OSError:
        return {"path": path, "present": False}
    return {"path": path, "present": True, "size": st.f_frsize * st.f_blocks,
            "free": st.f_frsize * st.f_bavail}


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
        return [("path", value["path"]), ("size", _bytes(value["size"])),
                ("free", _bytes(value["free"]))]
    if section == "network":
        return [(name, ", ".join(addrs) or "(no IPv4 address)") for name, addrs in value.items()]
    if section in ("variables", "proxies") and not value:
        return [("(none set)", "")]
    return [(key, _bytes(v) if key == "memory_total" else _text(v)) for key, v in value.items()]


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


def _bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    exponent = min(3, (n.bit_length() - 1) // 10)   # KiB, MiB or GiB
    return f"{n / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"


# ---------------------------------------------------------------- pre-flight
def preflight(cfg, environ: Mapping[str, str], gpu_info: envlib.GpuInfo,
              interfaces: Optional[Mapping[str, List[str]]] = None, statvfs: StatVfs = os.statvfs,
              shm_path: str = SHM_PATH, shm_min: int = SHM_MIN) -> List[Problem]:
    """Problems that would make a job with `cfg` fail or hang on this machine, errors first.

    `interfaces` defaults to this machine's ({name: [ipv4, ...]}, as netcheck.interfaces()).

    Example:
        environ, gpus, _ = env.host_facts()
        preflight(load(None, ["dist.master=127.0.0.1:6170"]), environ, gpus)
        # [Problem('error', 'port 6170 of dist.master 127.0.0.1:6170 is taken by pid 1234 ...')]
    """
    table = netcheck.interfaces() if interfaces is None else interfaces
    problems = (gpu_problems(cfg, gpu_info, environ) + interface_problems(cfg, environ, table)
                + port_problems(cfg, table) + proxy_problems(cfg, environ)
                + shm_problems(cfg, gpu_info, environ, statvfs, shm_path, shm_min))
    return sorted(problems, key=lambda p: p.severity != ERROR)


def check(cfg, environ: Optional[Mapping[str, str]] = None,
          gpu_info: Optional[envlib.GpuInfo] = None, warn: Callable[[str], None] = print) -> None:
    """Raise a PreflightError (a UserError) naming the first pre-flight error on this
    machine; pass each warning to `warn`. Launchers call it before starting ranks.

    Example:
        check(cfg)   # PreflightError: port 6170 of dist.master ... (and 1 more; run ...)
    """
    if environ is None or gpu_info is None:
        environ, gpu_info, _ = envlib.host_facts()
    problems = preflight(cfg, environ, gpu_info)
    for problem in problems:
        if problem.severity != ERROR:
            warn(f"paddle_dist: {problem}")
    errors = [p for p in problems if p.severity == ERROR]
    if errors:
        more = f" (and {len(errors) - 1} more; {CHECK_HINT})" if len(errors) > 1 else ""
        raise PreflightError(errors[0].message + more)


def gpu_problems(cfg, gpu_info: envlib.GpuInfo, environ: Mapping[str, str]) -> List[Problem]:
    """`dist.gpus` names GPUs this build or machine cannot give (env.check_gpus's rules)."""
    try:
        envlib.check_gpus(cfg.dist.gpus, gpu_info, environ)
    except UserError as e:
        return [Problem(ERROR, str(e))]
    return []


def _uses_gpus(cfg, gpu_info: envlib.GpuInfo, environ: Mapping[str, str]) -> bool:
    d = cfg.dist
    return d.backend == "nccl" or bool(d.gpus) or (
        d.backend == "auto" and bool(envlib.visible_gpus(gpu_info, environ)))


# ------------------------------------------------ the master's port
def port_problems(cfg, interfaces: Mapping[str, List[str]]) -> List[Problem]:
    """On node 0, a dist.master on this machine whose port something else holds: Paddle's
    launcher would retry starting its rendezvous server there forever."""
    d = cfg.dist
    if d.node_rank != 0 or not d.master:
        return []
    host, _, port_text = d.master.rpartition(":")
    if not _is_local(host, interfaces):
        return []
    port = int(port_text)
    error = bind_error(port)
    if error is None:
        return []
    fix = "choose another port with -o dist.master=HOST:PORT"
    if error.errno != errno.EADDRINUSE:   # EACCES below 1024 without root, for one
        return [Problem(ERROR, f"cannot listen on port {port} of dist.master {d.master} "
                               f"({error.strerror}); {fix}")]
    holder = port_holder(port)
    who = f"pid {holder[0]} ({holder[1]})" if holder else "another process"
    return [Problem(ERROR, f"port {port} of dist.master {d.master} is taken by {who}; "
                           f"stop that process or {fix}")]


def _is_local(host: str, interfaces: Mapping[str, List[str]]) -> bool:
    host = host.strip("[]")
    if host in ("0.0.0.0", "localhost", "::", "::1") or host.startswith("127."):
        return True
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        return False   # unresolvable: netcheck.check reports it with its fix
    return ip.startswith("127.") or any(ip in addrs for addrs in interfaces.values())


def bind_error(port: int) -> Optional[OSError]:
    """Why a TCP server could not listen on `port` on all addresses, or None if it could.

    Like Paddle's rendezvous server (http.server, SO_REUSEADDR), so a port that is only
    in TIME_WAIT counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as e:
            return e
    return None


def port_holder(port: int, proc: str = "/proc") -> Optional[Tuple[int, str]]:
    """(pid, command line) of a process listening on TCP `port`, or None when there is none
    or it is not visible to us (another user's process, another PID namespace).

    Example:
        port_holder(6170)   # (1234, 'python -m http.server 6170')
    """
    inodes = _listening_inodes(port, Path(proc))
    return _socket_owner(inodes, Path(proc)) if inodes else None


def _listening_inodes(port: int, proc: Path) -> Set[str]:
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
            fields = row.split()
            if (len(fields) > 9 and fields[3] == TCP_LISTEN and fields[9] != "0"
                    and int(fields[1].rpartition(":")[2], 16) == port):
                found.add(fields[9])
    return found


def _socket_owner(inodes: Set[str], proc: Path) -> Optional[Tuple[int, str]]:
    links = {f"socket:[{inode}]" for inode in inodes}
    # Lowest pid first: after a fork parent and children share the socket; name the parent.
    for pid in sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit()):
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:   # gone, or another user's
            continue
        for fd in fds:
            try:
                if os.readlink(fd_dir / fd) in links:
                    return pid, _cmdline(proc / str(pid))
            except OSError:
                continue
    return None


def _cmdline(pid_dir: Path, limit: int = 200) -> str:
    try:
        words = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode(errors="replace") for w in words if w) or "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------ /dev/shm
def shm_problems(cfg, gpu_info: envlib.GpuInfo, environ: Mapping[str, str],
                 statvfs: StatVfs = os.statvfs, path: str = SHM_PATH,
                 minimum: int = SHM_MIN) -> List[Problem]:
    """A /dev/shm missing or with less than `minimum` bytes free: an error for GPU jobs
    (NCCL), a warning on CPU (only DataLoader workers use it there)."""
    if _uses_gpus(cfg, gpu_info, environ):
        severity, why = ERROR, "NCCL's shared-memory transport between local GPUs crashes or hangs"
    else:
        severity, why = WARNING, "DataLoader workers (num_workers > 0) die with a bus error"
    enlarge = f"docker run --shm-size=8g or mount -o remount,size=8G {path}"
    facts = shm_facts(statvfs, path)
    if not facts["present"]:
        return [Problem(severity, f"{path} does not exist: {why}; mount it: mount -t tmpfs "
                                  f"-o size=8G tmpfs {path} (docker: --shm-size=8g)")]
    if facts["free"] >= minimum:
        return []
    state = (f"{path} has {_bytes(facts['free'])} free of {_bytes(facts['size'])}, "
             f"below {_bytes(minimum)}")
    if facts["size"] >= minimum:   # big enough, but full: stale segments of earlier jobs
        return [Problem(severity, f"{state}: {why}; remove stale files there (ls -la {path}) "
                                  f"or enlarge it with {enlarge}")]
    return [Problem(severity, f"{state}: {why}; enlarge it with {enlarge}")]


# ------------------------------------------------ proxies
def proxy_problems(cfg, environ: Mapping[str, str]) -> List[Problem]:
    """A multi-node job whose rendezvous (HTTP, through httpx, which honours proxy
    variables) would go through a proxy. One machine does no HTTP rendezvous."""
    d = cfg.dist
    if d.nnodes < 2 or not d.master:
        return []
    host, _, port = d.master.rpartition(":")
    # httpx routes http:// URLs through http_proxy or all_proxy; https_proxy does not apply.
    setting = proxy_setting(environ, "http") or proxy_setting(environ, "all")
    if setting is None:
        return []
    no_name, no_value = proxy_setting(environ, "no") or ("no_proxy", "")
    if bypasses_proxy(host, int(port), no_value):
        return []
    keep = f",${no_name}" if no_value else ""
    ranges = [e.strip() for e in no_value.split(",") if "/" in e]
    note = (f" (httpx, which Paddle's launcher uses, ignores address ranges such as {ranges[0]})"
            if ranges else "")
    return [Problem(ERROR, f"{setting[0]} is set and dist.master host {host} is not in no_proxy"
                           f"{note}: the rendezvous would go through the proxy and hang; "
                           f"export no_proxy={host}{keep} or unset {setting[0]}")]


def proxy_setting(environ: Mapping[str, str], scheme: str) -> Optional[Tuple[str, str]]:
    """(variable name, value) of the `<scheme>_proxy` setting in effect, or None.

    As urllib.request.getproxies (which httpx uses): the lower-case variable wins, and
    setting it empty cancels the upper-case one.
    """
    lower = f"{scheme}_proxy"
    if lower in environ:
        return (lower, environ[lower]) if environ[lower] else None
    upper = lower.upper()
    return (upper, environ[upper]) if environ.get(upper) else None


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Whether `no_proxy` exempts http://host:port, by httpx's rules.

    Example:
        bypasses_proxy("10.0.0.1", 6170, "localhost,10.0.0.1")   # True
        bypasses_proxy("n1.lab", 6170, ".lab")                    # True (suffix)
        bypasses_proxy("10.0.0.1", 6170, "10.0.0.0/8")            # False: httpx has no ranges
    """
    host = host.lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        scheme, _, rest = entry.rpartition("://")
        if scheme not in ("", "http", "all"):
            continue                    # https://HOST exempts https:// URLs only
        name, entry_port = NO_PROXY_ENTRY.fullmatch(rest).groups()
        if not name or (entry_port and int(entry_port) != port):
            continue
        if _is_ipv4(name.split("/")[0]) or name == "localhost":
            hit = host == name.split("/")[0]
        elif name.startswith("."):
            hit = host.endswith(name)
        else:
            hit = host == name or host.endswith("." + name)
        if hit:
            return True
    return False


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


# ------------------------------------------------ the socket interface
def interface_problems(cfg, environ: Mapping[str, str],
                       interfaces: Mapping[str, List[str]]) -> List[Problem]:
    """NCCL_SOCKET_IFNAME (from dist.nccl.socket_ifname, else the environment) that selects
    no interface of this machine: NCCL finds no socket to bootstrap over."""
    spec, source = cfg.dist.nccl.socket_ifname, "dist.nccl.socket_ifname"
    if not spec:
        spec, source = environ.get("NCCL_SOCKET_IFNAME", ""), "NCCL_SOCKET_IFNAME"
    if not spec or any(netcheck.matches(name, spec) for name in interfaces):
        return []
    with_address = [n for n, addrs in interfaces.items() if addrs and n != netcheck.LOOPBACK]
    example = (with_address or list(interfaces) or ["eth0"])[0]
    return [Problem(ERROR, f"{source}={spec} selects no interface on this machine (interfaces: "
                           f"{', '.join(interfaces) or 'none'}); set -o dist.nccl.socket_ifname="
                           f"{example} (a prefix; =NAME for an exact name, ^NAME to exclude)")]


# ---------------------------------------------------------------- command line
def main(argv: Optional[List[str]] = None) -> int:
    """`python -m paddle_dist.doctor [--json] [--check [-c CONFIG] [-o KEY=VALUE ...]]`.
    Exit 0 when fine (warnings allowed), 1 when the pre-flight found an error."""
    from . import cli
    from . import config as configlib

    parser = cli._Parser(prog="python -m paddle_dist.doctor",
                         description="Print this machine's environment for a bug report, and "
                                     "check a config against it (--check).")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--check", action="store_true",
                        help="also run the pre-flight check for the config (-c, -o)")
    cli._common(parser)
    args = parser.parse_args(argv)
    if not args.check and (args.config or args.override):
        raise UserError("-c/-o only apply to the pre-flight check; add --check")
    cfg = configlib.load(args.config, args.override) if args.check else None
    environ, gpu_info, cores = envlib.host_facts()
    environ = shell_environ(environ)
    data = report(environ, gpu_info, cores)
    problems = preflight(cfg, environ, gpu_info) if cfg is not None else []
    _print(data, problems, args.json, args.check)
    return 1 if any(p.severity == ERROR for p in problems) else 0


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
    if checked:
        print()
        for problem in problems:
            print(problem)
        print(f"pre-flight: {errors} error(s)" if errors else "pre-flight: ok")


if __name__ == "__main__":
    from .cli import run

    run(main)
