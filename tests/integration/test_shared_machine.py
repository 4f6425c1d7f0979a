"""A shared machine: another user (uid 65534, tests/integration/scripts/outsider.py) does
what an unprivileged user can while a root job of train.py runs beside it, on a machine of
the test's own (shared_machine.py: its own /dev/shm and loopback). Nothing it plants or
reaches changes what the job does, and what it can change is named:
- links planted at every name the ranks could use in /dev/shm (and this user's directory
  there taken first) change no file, and the job's secret reaches no report;
- a heartbeat it plants claiming progress for ever does not hide a hang;
- a verdict it forges in Paddle's store ends the job with the security code (6), named as
  the root cause;
- a connection to the job's listeners at start-up is named (or changes nothing);
- a gloo address it rewrites in the store at start-up, to a port nobody listens on, ends
  the job with the security code, naming the key;
- it can read nothing of the run directory;
and what a launcher killed with SIGKILL left there (its token) is removed by the next
`python -m paddle_dist.runs --clean`."""

import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from ..oracles import rank_statuses
from .procs import PY, finish, start
from .shared_machine import machine  # noqa: F401  (fixture)

HANG_S = 3
JOB = ["train.py", "-c", "configs/mnist_mlp.yaml", "-o", "dist.nprocs=2", "-o", "train.batch_size=32",
       "-o", "checkpoint.every_epochs=1"]


@pytest.fixture
def open_root():
    """A folder every user may enter (as a home directory or /data often is), for the runs:
    pytest's own tmp_path is closed to others, which would hide what the job leaves open."""
    folder = tempfile.mkdtemp(prefix="paddle_dist-open-")
    os.chmod(folder, 0o755)
    yield Path(folder)
    subprocess.run(["rm", "-rf", folder], timeout=60)


def _job(machine, run_dir: Path, *options: str, limit: float = 180):
    args = [PY] + JOB + ["-o", f"output.run_dir={run_dir}", *[o for opt in options for o in ("-o", opt)]]
    return start(machine.cmd(args), limit=limit)


def _outsider(machine, *argv: str):
    """The other user's action, running beside the job until its stdin closes."""
    return subprocess.Popen(machine.outsider(list(argv)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _said(proc) -> dict:
    out, err = proc.communicate(input="", timeout=60)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def _root_cause(err: str) -> str:
    return next((line for line in err.splitlines() if "Root cause:" in line), "")


def test_links_planted_in_dev_shm_change_no_file(machine, open_root, tmp_path):
    """The other user takes /dev/shm/paddle_dist-0 first (a link to a folder of its own) and
    links every heartbeat and stack name of the ranks to a root-only file; rank 1 hangs,
    so that the watchdogs write the stacks and the report. The file is untouched, its text
    is in no report, and the job says once that the directory was not its own."""
    secret = tmp_path / "secret"
    secret.write_text("root-only: " + os.urandom(24).hex() + "\n")
    secret.chmod(0o600)
    before = (secret.read_bytes(), secret.stat().st_mtime_ns)
    run_dir = open_root / "run"
    _said(_outsider(machine, "squat"))
    outsider = _outsider(machine, "plant", str(secret), str(run_dir))
    proc, killer = _job(machine, run_dir, "faults.inject=hang:1:3", f"dist.hang_timeout={HANG_S}")
    try:
        out, err = finish(proc, killer, timeout=180)
    finally:
        planted = _said(outsider)
    assert planted["processes"] >= 2, planted      # it saw the ranks, and planted for each
    assert (secret.read_bytes(), secret.stat().st_mtime_ns) == before
    assert proc.returncode == 4, err
    assert "Root cause: rank 1 silent" in _root_cause(err), err
    text = secret.read_text().strip()
    everything = [out, err] + [p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file()]
    assert not any(text in t for t in everything)
    assert "/dev/shm/paddle_dist-0 is not a private directory of this user" in err


def test_a_planted_heartbeat_does_not_hide_a_hang(machine, open_root):
    """A heartbeat of the other user's, at the name the job's watchdogs read, claims progress
    for ever; rank 1 hangs all the same and the job ends with exit 4 naming it."""
    run_dir = open_root / "run"
    outsider = _outsider(machine, "plant", "/nonexistent", str(run_dir))
    proc, killer = _job(machine, run_dir, "faults.inject=hang:1:3", f"dist.hang_timeout={HANG_S}")
    try:
        out, err = finish(proc, killer, timeout=120)
    finally:
        _said(outsider)
    assert proc.returncode == 4, err
    assert "Root cause: rank 1 silent" in _root_cause(err), err


# serial (make test runs it after the parallel part, alone): the outsider must write before
# rank 0 writes its verdict (it does so as soon as the store listens); under load it may not.
@pytest.mark.serial
@pytest.mark.compat          # Paddle's store: 2.6's server and 3.x's
def test_a_forged_verdict_ends_the_job_with_the_security_code(machine, open_root):
    """The other user writes the verdict "ok" into Paddle's store as soon as it listens
    (without joining it, which rank 0 would see: test_job_gate.py): the rank that reads the
    forgery ends with exit 6, and so does rank 0, which finds a verdict written before its
    own. The report names the breach as the root cause, not the failures that follow it."""
    outsider = _outsider(machine, "forge")
    proc, killer = _job(machine, open_root / "run", "train.max_steps=20")
    try:
        out, err = finish(proc, killer, timeout=150)
    finally:
        forged = _said(outsider)
    assert forged["forged"], forged
    assert proc.returncode == 6, (forged, out[-2000:], err)
    cause = _root_cause(err)
    assert "found a breach: " in cause, err
    # Whichever rank the launcher saw end first: rank 1 read the forgery, or rank 0 found it.
    assert ("does not prove this rank's token" in cause or
            "a verdict was in Paddle's store" in cause and "before rank 0 wrote its own" in cause), err


# serial: the other user must rewrite the key between its publication and the peer's read
# of it (Paddle's store client takes about 40 ms a request); under load it may not.
@pytest.mark.serial
@pytest.mark.parametrize("port, options", [(256, ()), (65279, ("dist.rendezvous_timeout=8",))],
                         ids=["peer-refused", "both-wait"])
def test_a_gloo_key_rewritten_at_start_up_ends_the_job_with_the_security_code(machine, open_root, port, options):
    """The other user gives the rank of two that waits for its peer another gloo address in
    Paddle's store, on a port nobody listens on (no process of theirs to see): the peer is
    refused there and names the key at once, or (a higher port) both ranks wait and the
    rank's own watchdog names it at the rendezvous deadline. Either way exit 6, the key,
    both addresses and the rank as the root cause."""
    outsider = _outsider(machine, "rewrite", str(port))
    proc, killer = _job(machine, open_root / "run", "train.max_steps=10", *options)
    try:
        out, err = finish(proc, killer, timeout=150)
    finally:
        rewrote = _said(outsider)
    key = rewrote["rewritten"]
    assert key in ("0", "1"), rewrote
    assert proc.returncode == 6, (rewrote, err)
    cause = _root_cause(err)
    assert f"gloo's key '{key}' in Paddle's store gives 127.0.0.1:{port} as rank {key}'s address" in cause, err
    assert f"listens on 127.0.0.1:{rewrote['ports'][key]}," in cause, err
    assert cause.endswith("something outside the job rewrote the key; the job was stopped (docs/security.md)"), err


@pytest.mark.compat          # gloo's start-up, as each Paddle version builds it
@pytest.mark.parametrize("isolate", [False, True], ids=["shared-loopback", "isolated"])
def test_connections_to_the_jobs_listeners_at_start_up_are_named_or_change_nothing(machine, open_root, isolate):
    """The other user connects to every socket that starts listening on the machine while
    the job starts (gate, store, gloo's listeners) and holds the connections. On the
    machine's loopback, the job either trains as if nothing happened (the ranks hold the
    same weights) or ends with exit 6 naming the connection to a rank's gloo socket; with
    dist.isolate the other user sees none of them, and the job trains."""
    run_dir = open_root / "run"
    outsider = _outsider(machine, "poke")
    proc, killer = _job(machine, run_dir, "train.max_steps=10", f"dist.isolate={str(isolate).lower()}")
    try:
        out, err = finish(proc, killer, timeout=150)
    finally:
        poked = _said(outsider)
    if isolate:
        assert poked["poked"] == 0, poked
    else:
        assert poked["poked"] >= 2, poked                # the gate and the store at least
    if proc.returncode == 6:
        assert not isolate and "the process group did not form" in _root_cause(err), err
        assert "gloo socket" in _root_cause(err) and f"held by pid {outsider.pid} (" in _root_cause(err), err
        return
    assert proc.returncode == 0, err
    records = rank_statuses(run_dir)
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]


def test_the_run_directory_is_closed_to_other_users(machine, open_root):
    """After a job that saved checkpoints and logs, the other user can read none of the
    files of the run, nor list the run directory."""
    run_dir = open_root / "run"
    proc, killer = _job(machine, run_dir, "train.max_steps=20")
    out, err = finish(proc, killer, timeout=150)
    assert proc.returncode == 0, err
    files = [str(p) for p in run_dir.rglob("*") if p.is_file()]
    assert any("/checkpoints/" in f for f in files) and any(f.endswith("run.json") for f in files), files
    assert any("/launch/" in f for f in files), files
    reader = _outsider(machine, "read", *files, str(run_dir))
    assert _said(reader)["readable"] == []
    assert (run_dir.stat().st_mode & 0o777) == 0o700


def _tokens(pid: int) -> list:
    """The job tokens in this user's directory in /dev/shm as process `pid` sees it ([] until
    it has entered the machine's namespace)."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
            return []
        return list(Path(f"/proc/{pid}/root/dev/shm/paddle_dist-{os.geteuid()}").glob("job-*/token"))
    except OSError:
        return []


def test_what_a_killed_launcher_left_is_removed_by_the_next_clean(machine, open_root):
    """A launcher killed with SIGKILL cannot remove its private directory (its token among
    it); `python -m paddle_dist.runs --clean` removes it, and nothing else."""
    proc, killer = _job(machine, open_root / "run", "train.epochs=50")
    try:
        deadline = time.monotonic() + 60
        while not _tokens(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        [token] = _tokens(proc.pid)
    finally:                                  # the launcher, killed whatever happened
        os.killpg(proc.pid, signal.SIGKILL)
        finish(proc, killer, timeout=60)
    job_dir = token.parent.name
    cleaned = subprocess.run(machine.cmd([PY, "-m", "paddle_dist.runs", "--clean"]), capture_output=True,
                             text=True, timeout=60)
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.strip() == f"removed /dev/shm/paddle_dist-{os.geteuid()}/{job_dir}"
    listed = subprocess.run(machine.cmd(["ls", "-A", f"/dev/shm/paddle_dist-{os.geteuid()}"]),
                            capture_output=True, text=True, timeout=60)
    assert listed.stdout.split() == []
