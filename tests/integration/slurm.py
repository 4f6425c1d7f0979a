"""Real Slurm clusters for the tests: `slurm_cluster`, one node, for the session, and
`slurm_two_nodes_cluster`, two nodes, for a test module (`slurm` and `slurm_two_nodes`:
the same, cleaned after each test).

munged, slurmctld and the slurmds run in the foreground as children of the test process,
with everything they write (munge key and socket, slurm.conf, state, spool, logs, pid
files) under one temporary directory; /etc is left alone. Clients (srun, sbatch, scontrol)
find the cluster through SLURM_CONF, which only the commands' own environment carries
(`cluster.env`). At the end jobs are cancelled, the daemons stopped by the pids in their
pid files, and the directory removed. Without root or without the binaries (Debian:
slurmd slurmctld slurm-client munge, which `make system-deps` installs as root) the tests
skip, saying why.

Two nodes: tests/integration/netns.py's hosts, slurmctld and node `nodea` in namespace A
(198.18.0.1), `nodeb` in B (198.18.0.2), munged in neither (its socket is a path both
reach). Clients run inside A: `cluster.cmd(argv)` prefixes what enters A (`client` does).
A test may down a node (`cluster.set_node(NODE_B, "DOWN")`); it is resumed after the test.

Use it from a test module (import slurm_cluster too, slurm_two_nodes_cluster for two nodes):
    def test_x(slurm):
        procs.run(["srun", "-n", "2", "hostname"], env=slurm.env)

    def test_y(slurm_two_nodes):
        procs.run(slurm_two_nodes.cmd(["srun", "-N", "2", "hostname", "-I"]), env=slurm_two_nodes.env)
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

from .. import stopping
from ..oracles import free_port
from .netns import make_two_hosts
from .procs import ROOT

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
PARTITION = "pdtest"
START_TIMEOUT_S = 30       # the node registers and turns idle within a few seconds here
STOP_TIMEOUT_S = 20
NODE_A, NODE_B = "nodea", "nodeb"   # the two-node cluster's nodes


class Unavailable(Exception):
    """A Slurm cluster cannot run on this machine; the message says why and how to fix it."""



def slurm_conf(root: Path, host: str, cpus: int, nodes: Dict[str, str], ctld_addr: str) -> str:
    """A slurm.conf for `nodes` (name: address), slurmctld on `host` at `ctld_addr`: no
    cgroups (linuxproc, task/none), no accounting, state, spool and logs under `root` (a
    slurmd's by its node name, %n), free ports, and a random first job id: the rendezvous
    port paddle_dist derives from it then differs from another cluster's on this machine."""
    node_lines = "".join(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN\n"
                         for name, addr in nodes.items())
    return f"""\
ClusterName=pdtest
SlurmctldHost={host}({ctld_addr})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=30
SchedulerParameters=sched_min_interval=0
FirstJobId={random.randint(1000, 900000)}
{node_lines}\
PartitionName={PARTITION} Nodes={",".join(nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@dataclass
class Cluster:
    """A running cluster: `env` is the environment for its clients (SLURM_CONF, and the
    test's Python first on PATH, so that a job's `python` is this one). `nodes` maps each
    node to its address, `prefixes` a node to what runs a command on its host (nsenter
    into namespace B; none: this machine). Clients run on the first node's host."""

    root: Path
    host: str
    env: Dict[str, str]
    nodes: Dict[str, str] = field(default_factory=dict)
    prefixes: Dict[str, List[str]] = field(default_factory=dict)
    daemons: Dict[str, subprocess.Popen] = field(default_factory=dict)
    pid_files: Dict[str, Path] = field(default_factory=dict)

    def cmd(self, argv: List[str], node: str = "") -> List[str]:
        """`argv` as run on `node`'s host (default the first node's, where clients run).

        Example:
            procs.run(cluster.cmd(["srun", "-N", "2", "hostname", "-I"]), env=cluster.env)
        """
        return self.prefixes.get(node or next(iter(self.nodes)), []) + list(argv)

    def client(self, args: List[str], timeout: float = 30,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command (bounded), with `env` added to the cluster's; its
        output as text. (sbatch passes its environment on to the job.)"""
        return subprocess.run(self.cmd(args), env={**os.environ, **self.env, **(env or {})}, text=True,
                              timeout=timeout, capture_output=True, cwd=str(ROOT))

    def job(self, job_id: str) -> Dict[str, str]:
        """`scontrol show job` as a dict (JobState, ExitCode, Restarts, ...); {} when unknown."""
        out = self.client(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_for(self, predicate, what: str, timeout: float = 60, poll_s: float = 0.1):
        """Poll `predicate()` until it returns something true (bounded); return that."""
        deadline = time.monotonic() + timeout
        while True:
            found = predicate()
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")
            time.sleep(poll_s)

    def jobs(self) -> List[str]:
        return self.client(["squeue", "-h", "-o", "%i"]).stdout.split()

    def steps_running(self) -> List[str]:
        """The job steps the slurmds still run: each slurmstepd keeps a socket in its spool."""
        return [p.name for node in self.nodes for p in (self.root / "spool" / node).glob(f"{node}_*")]

    def drain(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Cancel every job and wait until no job and no step is left."""
        if self.jobs():
            self.client(["scancel", f"--partition={PARTITION}"])
        self.wait_for(lambda: not self.jobs() and not self.steps_running(),
                      "the cluster's jobs to end", timeout)

    def node_states(self) -> Dict[str, str]:
        """Each node's state as sinfo says it (idle, mixed, down, idle*: not responding)."""
        out = self.client(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def set_node(self, node: str, state: str) -> None:
        """`scontrol update NodeName=node State=state` (DOWN, RESUME, ...): it must succeed."""
        args = ["scontrol", "update", f"NodeName={node}", f"State={state}", "Reason=test"]
        result = self.client(args)
        assert result.returncode == 0, f"{' '.join(args)}: {result.stderr}"

    def wait_idle(self, timeout: float = START_TIMEOUT_S) -> None:
        """Wait (bounded) until every node is idle; fail when a daemon has died meanwhile."""
        def idle():
            dead = [name for name, proc in self.daemons.items() if proc.poll() is not None]
            assert not dead, f"{', '.join(dead)} exited\n{self.logs()}"
            return set(self.node_states().values()) == {"idle"}
        self.wait_for(idle, "every node to be idle", timeout, poll_s=0.2)

    def logs(self) -> str:
        paths = [self.root / "slurmctld.log"] + [self.root / f"slurmd.{node}.log" for node in self.nodes]
        return "\n".join(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:])
                         for path in paths if path.exists())


def find(program: str) -> Optional[str]:
    """A program's path; daemons live in /usr/sbin, which a user's PATH may lack."""
    return shutil.which(program, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")


def check_available() -> None:
    """Raise Unavailable unless this process may run a cluster here."""
    missing = [b for b in DAEMONS + CLIENTS if find(b) is None]
    if missing:
        raise Unavailable(f"needs Slurm and munge ({', '.join(missing)} not found): apt-get install "
                          "slurmd slurmctld slurm-client munge (make test installs them as root)")
    if os.geteuid() != 0:
        raise Unavailable("a Slurm cluster for the tests needs root (munged runs as the munge "
                          "user, slurmd as root)")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        raise Unavailable("no munge user: reinstall the munge package") from None


def _munge_key(munge_dir: Path, user: pwd.struct_passwd) -> Path:
    """A fresh 1024-bit key, owned by munge and readable by it alone (munged refuses others)."""
    key = munge_dir / "munge.key"
    key.write_bytes(os.urandom(128))
    os.chown(key, user.pw_uid, user.pw_gid)
    key.chmod(0o400)
    return key


def _start(cluster: Cluster, name: str, args: List[str], pid_file: Path,
           user: Optional[str] = None) -> None:
    log = open(cluster.root / f"{name}.out", "wb")
    with log:
        cluster.daemons[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True, user=user,
                                                 env=dict(os.environ, **cluster.env))
    cluster.pid_files[name] = pid_file


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{proc.args[0]} did not start (exit {proc.poll()}); "
                                 f"see {path.parent}")
        time.sleep(0.05)


def prepare(root: Path, nodes: Optional[Dict[str, str]] = None,
            prefixes: Optional[Dict[str, List[str]]] = None) -> Cluster:
    """Write the munge key and slurm.conf under `root`; nothing starts yet. `nodes`: name
    to address (default: this host's name at 127.0.0.1); slurmctld runs beside the first.
    `prefixes`: what runs a command on a node's host (default nothing)."""
    host = socket.gethostname().split(".")[0]
    nodes = nodes or {host: "127.0.0.1"}
    munge_user = pwd.getpwnam("munge")
    munge_dir = root / "munge"
    munge_dir.mkdir()
    munge_dir.chmod(0o755)   # the socket needs x for all; the key itself is 0400
    os.chown(munge_dir, munge_user.pw_uid, munge_user.pw_gid)
    _munge_key(munge_dir, munge_user)
    for sub in ["state", "spool"] + [f"spool/{node}" for node in nodes]:
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host, os.cpu_count() or 1, nodes, next(iter(nodes.values()))))
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return Cluster(root=root, host=host, env={"SLURM_CONF": str(conf), "PATH": path},
                   nodes=dict(nodes), prefixes=dict(prefixes or {}))


def _refused(cluster: Cluster) -> str:
    """Why a slurmd after the first exited at its start while the first runs ("" if none did):
    its log's last two errors (a Slurm built to allow one slurmd a host may say so)."""
    exited = [node for node in cluster.nodes if cluster.daemons[f"slurmd.{node}"].poll() is not None]
    if not exited or exited[0] == next(iter(cluster.nodes)):
        return ""
    log = cluster.root / f"slurmd.{exited[0]}.log"
    errors = [line.strip() for line in (log.read_text() if log.exists() else "").splitlines() if "error" in line]
    return (f"slurmd would not run a second daemon ({exited[0]}) on this host: "
            f"{'; '.join(errors[-2:]) or 'it exited, saying nothing'}")


def start(cluster: Cluster) -> None:
    """Start munged, slurmctld and a slurmd for each node; return once every node is idle.
    Raises Unavailable when a second slurmd exits at its start (see _refused)."""
    root, munge_dir = cluster.root, cluster.root / "munge"
    key, conf = munge_dir / "munge.key", root / "slurm.conf"
    _start(cluster, "munged", [
        find("munged"), "-F", f"--key-file={key}", f"--socket={munge_dir}/socket",
        f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
        f"--seed-file={munge_dir}/munged.seed"], munge_dir / "munged.pid", user="munge")
    _wait_for_file(munge_dir / "socket", cluster.daemons["munged"], 10)
    _start(cluster, "slurmctld", cluster.cmd([find("slurmctld"), "-D", "-f", str(conf)]),
           root / "slurmctld.pid")
    _wait_for_file(root / "slurmctld.pid", cluster.daemons["slurmctld"], 10)
    for node in cluster.nodes:
        _start(cluster, f"slurmd.{node}", cluster.cmd([find("slurmd"), "-D", "-f", str(conf), "-N", node],
                                                      node), root / f"slurmd.{node}.pid")
    try:
        cluster.wait_idle()
    except AssertionError:
        if _refused(cluster):
            raise Unavailable(_refused(cluster)) from None
        raise


def _pid_from_file(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop(cluster: Cluster) -> List[str]:
    """Stop the daemons in the reverse order of their start (the slurmds, slurmctld, then
    munged) by their pid files, SIGKILL after a bound; return the names of any that needed it."""
    forced = []
    for name in reversed(list(cluster.daemons)):
        proc = cluster.daemons[name]
        pid = _pid_from_file(cluster.pid_files[name])
        # The pid file names the daemon itself; in the foreground that is our child
        # (nsenter execs it), so the two agree. Anything else in the file (a stale one)
        # is not ours to signal.
        if proc.poll() is None:
            os.kill(pid if pid == proc.pid else proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            forced.append(name)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
    return forced


@contextlib.contextmanager
def running(nodes: Optional[Dict[str, str]] = None,
            prefixes: Optional[Dict[str, List[str]]] = None) -> Iterator[Cluster]:
    """A cluster (see prepare) under a fresh temporary directory for the block; then its
    jobs cancelled, its daemons stopped and the directory removed, whatever happens."""
    root = Path(tempfile.mkdtemp(prefix="paddle_dist-slurm-"))
    root.chmod(0o755)   # munged checks every directory above its key and socket
    cluster, forced = None, []
    record = stopping.hold(folder=str(root))    # the daemons' command lines all name root
    try:
        cluster = prepare(root, nodes, prefixes)
        start(cluster)
        yield cluster
    finally:
        try:
            if cluster and "slurmctld" in cluster.daemons:
                cluster.drain()
        finally:
            forced = stop(cluster) if cluster else []
            shutil.rmtree(root, ignore_errors=True)
            stopping.release(record)
    assert not forced, f"Slurm daemons that ignored SIGTERM: {forced}"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """A one-node cluster for the whole session (see the module docstring)."""
    try:
        check_available()
        with running() as cluster:
            yield cluster
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def slurm(slurm_cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster, drained after the test: a test that fails or times out
    leaves no job running into the next one."""
    yield slurm_cluster
    slurm_cluster.drain()


@pytest.fixture(scope="module")
def slurm_two_nodes_cluster() -> Iterator[Cluster]:
    """A two-node cluster for a test module (see the module docstring)."""
    try:
        check_available()
        if find("nsenter") is None:
            raise Unavailable("two Slurm nodes need nsenter (apt-get install util-linux)")
    except Unavailable as e:
        pytest.skip(str(e))
    with make_two_hosts() as hosts:     # skips where namespaces cannot be built
        # nsenter, not `ip netns exec` (hosts.cmd): that mounts a fresh /sys, without the
        # cgroup file systems slurmd needs (it exits: "No filesystem mounted on /sys/fs/cgroup").
        enter = {node: ["nsenter", f"--net=/var/run/netns/{ns}"] for node, ns in ((NODE_A, hosts.a), (NODE_B, hosts.b))}
        try:
            with running({NODE_A: hosts.ip_a, NODE_B: hosts.ip_b}, enter) as cluster:
                yield cluster
        except Unavailable as e:
            pytest.skip(str(e))


@pytest.fixture
def slurm_two_nodes(slurm_two_nodes_cluster: Cluster) -> Iterator[Cluster]:
    """The module's two-node cluster; after the test its jobs are cancelled and a node
    the test set DOWN (or drained) is resumed, so the next test finds both idle."""
    cluster = slurm_two_nodes_cluster
    yield cluster
    cluster.drain()
    for node, state in cluster.node_states().items():
        if state.startswith(("down", "drain")):
            cluster.set_node(node, "RESUME")
    cluster.wait_idle()
