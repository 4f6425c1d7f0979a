"""The `slurm_cluster` fixture: a real one-node Slurm cluster for the test session.

munged, slurmctld and slurmd run in the foreground as children of the test process, with
everything they write (munge key and socket, slurm.conf, state, spool, logs, pid files)
under one temporary directory; /etc is left alone. Clients (srun, sbatch, scontrol) find
the cluster through SLURM_CONF, which only the commands' own environment carries
(`cluster.env`). The cluster starts when the first test asks for it and stops at the end
of the session: jobs are cancelled, the daemons stopped by the pids in their pid files,
and the directory removed. Without root or without the binaries (Debian: slurmd
slurmctld slurm-client munge, which `make system-deps` installs as root) the tests skip,
saying why.

Use it from a test module:
    from .slurm import slurm  # noqa: F401  (the fixture)

    def test_x(slurm):
        procs.run(["srun", "-n", "2", "hostname"], env=slurm.env)
"""

from __future__ import annotations

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

from .procs import ROOT

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "scontrol", "scancel", "sinfo", "squeue")
PARTITION = "pdtest"
START_TIMEOUT_S = 30       # the node registers and turns idle within a few seconds here
STOP_TIMEOUT_S = 20


class Unavailable(Exception):
    """A Slurm cluster cannot run on this machine; the message says why and how to fix it."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, host: str, cpus: int) -> str:
    """A one-node slurm.conf: no cgroups (linuxproc, task/none), no accounting, state,
    spool and logs under `root`, free ports, and a random first job id: the rendezvous
    port paddle_dist derives from the job id then differs from another cluster's on this
    machine (two test sessions side by side)."""
    return f"""\
ClusterName=pdtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
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
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


@dataclass
class Cluster:
    """A running cluster: `env` is the environment for its clients (SLURM_CONF, and the
    test's Python first on PATH, so that a job's `python` is this one)."""

    root: Path
    host: str
    env: Dict[str, str]
    daemons: Dict[str, subprocess.Popen] = field(default_factory=dict)

    def client(self, args: List[str], timeout: float = 30,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command (bounded), with `env` added to the cluster's; its
        output as text. (sbatch passes its environment on to the job.)"""
        return subprocess.run(args, env={**os.environ, **self.env, **(env or {})}, text=True,
                              timeout=timeout,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))

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
        out = self.client(["squeue", "-h", "-o", "%i"]).stdout
        return out.split()

    def steps_running(self) -> List[str]:
        """The job steps slurmd still runs: each slurmstepd keeps a socket in the spool."""
        spool = self.root / "spool"
        return [p.name for p in spool.glob(f"{self.host}_*")] if spool.is_dir() else []

    def drain(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Cancel every job and wait until no job and no step is left."""
        if self.jobs():
            self.client(["scancel", f"--partition={PARTITION}"])
        self.wait_for(lambda: not self.jobs() and not self.steps_running(),
                      "the cluster's jobs to end", timeout)

    def node_state(self) -> str:
        return self.client(["sinfo", "-h", "-n", self.host, "-o", "%T"]).stdout.strip()

    def logs(self) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = self.root / name
            if path.exists():
                parts.append(f"--- {name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)


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


def _start(cluster: Cluster, name: str, args: List[str], user: Optional[str] = None) -> None:
    log = open(cluster.root / f"{name}.out", "wb")
    with log:
        cluster.daemons[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                                 start_new_session=True, user=user,
                                                 env=dict(os.environ, **cluster.env))


def _wait_for_file(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{proc.args[0]} did not start (exit {proc.poll()}); "
                                 f"see {path.parent}")
        time.sleep(0.05)


def prepare(root: Path) -> Cluster:
    """Write the munge key and slurm.conf under `root`; nothing starts yet."""
    host = socket.gethostname().split(".")[0]
    munge_user = pwd.getpwnam("munge")
    munge_dir = root / "munge"
    munge_dir.mkdir()
    munge_dir.chmod(0o755)   # the socket needs x for all; the key itself is 0400
    os.chown(munge_dir, munge_user.pw_uid, munge_user.pw_gid)
    key = _munge_key(munge_dir, munge_user)
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host, os.cpu_count() or 1))
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return Cluster(root=root, host=host, env={"SLURM_CONF": str(conf), "PATH": path})


def start(cluster: Cluster) -> None:
    """Start munged, slurmctld and slurmd; return once the node is idle."""
    root, munge_dir = cluster.root, cluster.root / "munge"
    key, conf = munge_dir / "munge.key", root / "slurm.conf"
    _start(cluster, "munged", [
        find("munged"), "-F", f"--key-file={key}", f"--socket={munge_dir}/socket",
        f"--pid-file={munge_dir}/munged.pid", f"--log-file={munge_dir}/munged.log",
        f"--seed-file={munge_dir}/munged.seed"], user="munge")
    _wait_for_file(munge_dir / "socket", cluster.daemons["munged"], 10)
    _start(cluster, "slurmctld", [find("slurmctld"), "-D", "-f", str(conf)])
    _wait_for_file(root / "slurmctld.pid", cluster.daemons["slurmctld"], 10)
    _start(cluster, "slurmd", [find("slurmd"), "-D", "-f", str(conf)])
    cluster.wait_for(lambda: cluster.node_state() == "idle", "the node to be idle", START_TIMEOUT_S,
                     poll_s=0.2)


def _pid_from_file(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def stop(cluster: Cluster) -> List[str]:
    """Stop the daemons (slurmd, slurmctld, then munged) by their pid files, SIGKILL after
    a bound; return the names of any that needed it."""
    pid_files = {"slurmd": cluster.root / "slurmd.pid", "slurmctld": cluster.root / "slurmctld.pid",
                 "munged": cluster.root / "munge" / "munged.pid"}
    forced = []
    for name in ("slurmd", "slurmctld", "munged"):
        proc = cluster.daemons.get(name)
        if proc is None:
            continue
        pid = _pid_from_file(pid_files[name])
        # The pid file names the daemon itself; in the foreground that is our child, so the
        # two agree. Anything else in the file (a stale one) is not ours to signal.
        if proc.poll() is None:
            os.kill(pid if pid == proc.pid else proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            forced.append(name)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
    return forced


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    """A one-node cluster for the whole session (see the module docstring)."""
    try:
        check_available()
    except Unavailable as e:
        pytest.skip(str(e))
    root = Path(tempfile.mkdtemp(prefix="paddle_dist-slurm-"))
    root.chmod(0o755)   # munged checks every directory above its key and socket
    cluster = Cluster(root=root, host="", env={})
    try:
        cluster = prepare(root)
        start(cluster)
        yield cluster
    finally:
        try:
            if "slurmctld" in cluster.daemons:
                cluster.drain()
        finally:
            forced = stop(cluster)
            shutil.rmtree(root, ignore_errors=True)
        assert not forced, f"Slurm daemons that ignored SIGTERM: {forced}"


@pytest.fixture
def slurm(slurm_cluster: Cluster) -> Iterator[Cluster]:
    """The session's cluster, drained after the test: a test that fails or times out
    leaves no job running into the next one."""
    yield slurm_cluster
    slurm_cluster.drain()
