"""Pre-flight: the usual causes of a start that hangs, found before any rank starts.

A taken master port (naming the process that holds it), a tiny /dev/shm, an HTTP proxy in
the way of the rendezvous, a socket interface that does not exist and GPUs that are not
there become one-line problems; `check()` raises the first error for the launchers, and
`python -m paddle_dist.doctor --check` prints them all.

Every function takes the environment as a mapping (from `runtime/variables.host_facts()`),
so tests pass their own.

Example:
    host = varlib.host_facts()
    for problem in preflight(cfg, host.environ, host.gpus):
        print(problem)                                # error: port 6170 of dist.master ...
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from ..runtime import devices as devicelib, variables as varlib
from ..security import credentials, tls
from ..sync import transports
from ..runtime import netcheck
from ..runtime.engines import CLUSTER_ENVIRONMENTS
from ..errors import UserError
from ..procfs import port_holder
from .proxies import bypasses_proxy, proxy_setting
from ..schema import Config

ERROR, WARNING = "error", "warning"
SHM_PATH = "/dev/shm"
SHM_MIN = 1 << 30                 # below this, NCCL's shared-memory transport runs out
CHECK_HINT = "run python -m paddle_dist.doctor --check"

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


def preflight(cfg: Config, environ: Mapping[str, str], gpu_info: devicelib.GpuInfo,
              interfaces: Optional[Mapping[str, List[str]]] = None, statvfs: StatVfs = os.statvfs,
              shm_path: str = SHM_PATH, shm_min: int = SHM_MIN,
              route: Callable[[str, str], str] = netcheck.check) -> List[Problem]:
    """Problems that would make a job with `cfg` fail or hang on this machine, errors first.

    `interfaces` defaults to this machine's ({name: [ipv4, ...]}, as netcheck.interfaces());
    `route(master, socket_ifname)` is netcheck.check unless a test passes its own.

    Example:
        host = varlib.host_facts()
        preflight(load(None, ["dist.master=127.0.0.1:6170"]), host.environ, host.gpus)
        # [Problem('error', 'port 6170 of dist.master 127.0.0.1:6170 is taken by pid 1234 ...')]
    """
    table = netcheck.interfaces() if interfaces is None else interfaces
    problems = (refusals(cfg, environ, gpu_info, route, table)
                + port_problems(cfg, table) + proxy_problems(cfg, environ)
                + shm_problems(cfg, gpu_info, environ, statvfs, shm_path, shm_min))
    return sorted(problems, key=lambda p: p.severity != ERROR)


def refusals(cfg: Config, environ: Mapping[str, str], gpu_info: devicelib.GpuInfo,
             route: Callable[[str, str], str] = netcheck.check,
             interfaces: Optional[Mapping[str, List[str]]] = None) -> List[Problem]:
    """What the layers below refuse in `cfg`, each refusal one error, before the run
    directory or any rank exists:
    - sync.transport names a transport of sync/transports.py that can carry sync.compress
      (the transports are sync/'s own, so the config's schema does not list them);
    - dist.gpus names GPUs this build or machine can give (devices.check_gpus);
    - dist.nccl.socket_ifname (else NCCL_SOCKET_IFNAME) selects one of this machine's
      `interfaces` (netcheck.interfaces() unless given): else NCCL finds no socket to
      bootstrap over;
    - a multi-node job (dist.nnodes > 1, or an mpirun hostfile) with dist.master: the master
      resolves, this machine has a route to it, and dist.nccl.socket_ifname allows that
      route's interface (`route`: netcheck.check unless a test passes its own);
    - dist.token_file can be the job's token (readable, 0600, 64 hex digits: auth.read_token);
    - dist.tls_ca, tls_cert and tls_key are all given or none, and would pass the other
      side's checks (tls.check: readable, the key 0600, the certificate signed by the CA and
      valid now, node 0's naming dist.master's host).
    """
    d, found = cfg.dist, []
    with _refused(found):
        transports.check(cfg.sync.transport, cfg.sync.compress)
    with _refused(found):
        devicelib.check_gpus(d.gpus, gpu_info, environ)
    spec, source = d.nccl.socket_ifname, "dist.nccl.socket_ifname"
    if not spec:
        spec, source = environ.get("NCCL_SOCKET_IFNAME", ""), "NCCL_SOCKET_IFNAME"
    if spec:
        with _refused(found):
            netcheck.check_selects(spec, source, netcheck.interfaces() if interfaces is None else interfaces)
    if d.master and (d.nnodes > 1 or d.hostfile):
        with _refused(found):
            route(d.master, d.nccl.socket_ifname)
    if d.token_file:
        with _refused(found):
            credentials.token(d.token_file)
    with _refused(found):
        files = tls.configured(d.tls_ca, d.tls_cert, d.tls_key)
        if files:
            credentials.check_tls(files, d.master, serves=d.node_rank == 0)
    return found


@contextlib.contextmanager
def _refused(found: List[Problem]) -> Iterator[None]:
    """A UserError raised inside becomes one more error in `found`."""
    try:
        yield
    except UserError as e:
        found.append(Problem(ERROR, str(e)))


def check(cfg: Config, environ: Optional[Mapping[str, str]] = None,
          gpu_info: Optional[devicelib.GpuInfo] = None, warn: Callable[[str], None] = print) -> None:
    """Raise a PreflightError (a UserError) naming the first pre-flight error on this
    machine; pass each warning to `warn`. Launchers call it before starting ranks.

    Example:
        check(cfg)   # PreflightError: port 6170 of dist.master ... (and 1 more; run ...)
    """
    if environ is None or gpu_info is None:
        host = varlib.host_facts()
        environ, gpu_info = host.environ, host.gpus
    problems = preflight(cfg, environ, gpu_info)
    for problem in problems:
        if problem.severity != ERROR:
            warn(f"paddle_dist: {problem}")
    errors = [p for p in problems if p.severity == ERROR]
    if errors:
        more = f" (and {len(errors) - 1} more; {CHECK_HINT})" if len(errors) > 1 else ""
        raise PreflightError(errors[0].message + more)


def _uses_gpus(cfg: Config, gpu_info: devicelib.GpuInfo, environ: Mapping[str, str]) -> bool:
    d = cfg.dist
    return d.backend == "nccl" or bool(d.gpus) or (
        d.backend == "auto" and bool(devicelib.visible_gpus(gpu_info, environ)))


def _one_rank(cfg: Config, environ: Mapping[str, str]) -> bool:
    """Whether the job has one rank in all, counted as launcher.plan counts them: one per
    dist.gpus id, else dist.nprocs (default 1), on each of dist.nnodes machines; and this
    process is not one of several an engine started (doctor --check in each srun task).
    An mpirun job sized by its hostfile, or a config or environment that cannot be read,
    counts as several."""
    d = cfg.dist
    try:
        per_node = len(devicelib.parse_gpus(d.gpus)) or d.nprocs or 1
        cluster = next(c for c in CLUSTER_ENVIRONMENTS if c.detect(environ))(environ)
        engine_world = int(cluster.ranks().get("world_size", 1))
    except (UserError, ValueError):
        return False
    sized_by_hostfile = d.launcher == "mpirun" and bool(d.hostfile) and d.nprocs is None
    return per_node * d.nnodes == 1 and not sized_by_hostfile and engine_world <= 1


# ------------------------------------------------ the master's port
def port_problems(cfg: Config, interfaces: Mapping[str, List[str]]) -> List[Problem]:
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


# ------------------------------------------------ /dev/shm
def shm_problems(cfg: Config, gpu_info: devicelib.GpuInfo, environ: Mapping[str, str],
                 statvfs: StatVfs = os.statvfs, path: str = SHM_PATH,
                 minimum: int = SHM_MIN) -> List[Problem]:
    """A /dev/shm missing or with less than `minimum` bytes free: an error for GPU jobs of
    several ranks (NCCL), a warning on CPU or for one rank (no process group, so no NCCL:
    only DataLoader workers use it there)."""
    if _uses_gpus(cfg, gpu_info, environ) and not _one_rank(cfg, environ):
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
    state = (f"{path} has {readable_bytes(facts['free'])} free of {readable_bytes(facts['size'])}, "
             f"below {readable_bytes(minimum)}")
    if facts["size"] >= minimum:   # big enough, but full: stale segments of earlier jobs
        return [Problem(severity, f"{state}: {why}; remove stale files there (ls -la {path}) "
                                  f"or enlarge it with {enlarge}")]
    return [Problem(severity, f"{state}: {why}; enlarge it with {enlarge}")]


# ------------------------------------------------ proxies
def proxy_problems(cfg: Config, environ: Mapping[str, str]) -> List[Problem]:
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


# ------------------------------------------------ facts the checks share with the report
def shm_facts(statvfs: StatVfs = os.statvfs, path: str = SHM_PATH) -> Dict[str, Any]:
    """Size and free bytes of /dev/shm, or `present: False`."""
    try:
        st = statvfs(path)
    except OSError:
        return {"path": path, "present": False}
    return {"path": path, "present": True, "size": st.f_frsize * st.f_blocks,
            "free": st.f_frsize * st.f_bavail}


def readable_bytes(n: Optional[int]) -> str:
    """`n` bytes as people read them: "512 B", "1.5 GiB" ("-" when unknown)."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n} B"
    exponent = min(3, (n.bit_length() - 1) // 10)   # KiB, MiB or GiB
    return f"{n / 1024 ** exponent:.1f} {('KiB', 'MiB', 'GiB')[exponent - 1]}"
