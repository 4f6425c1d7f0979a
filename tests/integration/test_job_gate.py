"""Only this job's ranks get in, on one machine, with real processes (rankgate.py and
attest.py): a process with another token, or claiming a rank already admitted, is refused
in one line while the job goes on; an outsider's raw ADD or SET into Paddle's store before
the ranks attest ends the job with the security error (exit 6); a port scan of the gate
and the store changes nothing; the token is in no file, command line or environment."""

import base64
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from paddle_dist.security import rankgate
from paddle_dist.procfs import process_table

from paddle_dist.security import storewire

from ..oracles import free_port, rank_statuses
from .procs import PY, check, finish, run, start
from .test_job_token import _token_file

HELD = ["-m", "paddle_dist.launch", "--nprocs", "2"]
SCRIPT = "tests/integration/scripts/held_rank.py"


def _until(condition, limit=60.0, what="it"):
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {limit:g} s"
        time.sleep(0.02)
    return condition()


def _held_job(tmp_path):
    """Start held_rank.py on 2 ranks; return (launcher, killer, store host, store port)
    once rank 0 knows its store (rank 1 waits for tmp_path/go)."""
    proc, killer = start(HELD + ["--log_dir", str(tmp_path / "log"), SCRIPT, "--dir", str(tmp_path)])
    _until(lambda: (tmp_path / "store").exists() or proc.poll() is not None, what="store address")
    assert proc.poll() is None, proc.stderr.read()
    host, _, port = (tmp_path / "store").read_text().rpartition(":")
    return proc, killer, host, int(port)


def _ranks(launcher_pid):
    return sorted(pid for pid, _, parent, _ in process_table() if parent == launcher_pid)


def _environ(pid):
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


@pytest.mark.compat
@pytest.mark.parametrize("attack", ["add", "set"])
def test_a_write_into_paddles_store_before_the_ranks_attest_ends_the_job(tmp_path, attack):
    """An outsider who found rank 0's store joins it (raw ADD to its join counter) or takes
    rank 1's place (raw SET) while rank 1 has not joined yet: both ranks end with exit 6
    and the one security line, which names the outsider's connection when it can."""
    proc, killer, host, port = _held_job(tmp_path)
    conn = _until(lambda: _connected(host, port), what="store")
    try:
        # The store listens before rank 0 has counted itself in: ADD 0 reads the counter.
        _until(lambda: conn.add(storewire.JOIN_KEY, 0) >= 1, what="rank 0's join")
        if attack == "add":
            assert conn.add(storewire.JOIN_KEY, 1) == 2       # rank 0 and the outsider
        else:
            conn.set("paddle_dist/claim/1", b"5")
            assert conn.check("paddle_dist/claim/1")
        (tmp_path / "go").write_text("")
        out, err = finish(proc, killer)
    finally:
        conn.close()
    assert proc.returncode == 6, err
    said = [line for line in out.splitlines() if line.startswith("paddle_dist: security: ")]  # rank 0
    assert said, err
    if attack == "add":
        assert f"Paddle's store at {host}:{port} counted 3 joins for 2 ranks: something outside the job " \
               f"joined it, connected from 127.0.0.1:" in said[0]
        assert f"(pid {os.getpid()}: " in said[0]            # this test is the outsider
    else:
        assert f"rank 1's place in Paddle's store at {host}:{port} was claimed before it came" in said[0]
    assert "Root cause: rank" in err and "exited with code 6" in err
    assert not list(tmp_path.glob("rank?"))                   # no rank went on to train


def _connected(host, port):
    try:
        return storewire.Connection(host, port)
    except OSError:
        return None


def test_strangers_at_the_gate_are_refused_and_the_token_stays_secret(tmp_path):
    """While the job waits for rank 1: a process with another token, and one with the
    job's own token claiming rank 0 again, are each refused in one line (exit 2); the
    token is in no rank's command line or environment (hex or base64). Then the job ends
    as it would have: both ranks all-reduce 0 + 1."""
    proc, killer, _, _ = _held_job(tmp_path)
    ranks = _ranks(proc.pid)
    assert len(ranks) == 2
    rank_env = _environ(ranks[0])
    token_path = rank_env["PADDLE_DIST_TOKEN_FILE"]
    secret = Path(token_path).read_text().strip()
    needles = [secret, secret.upper(), base64.b64encode(bytes.fromhex(secret)).decode()]
    try:
        for pid in ranks:
            seen = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") + \
                Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
            assert not any(n in seen for n in needles)
        gate = {k: rank_env[k] for k in (rankgate.GATE, rankgate.JOB)}
        stranger = run([PY, "-S", rankgate.SCRIPT, PY, "-c", "print('in')"], timeout=60, env=dict(
            gate, PADDLE_TRAINER_ID="1", PADDLE_TRAINERS_NUM="2",
            PADDLE_DIST_TOKEN_FILE=_token_file(tmp_path / "other.token")))
        twice = run([PY, "-S", rankgate.SCRIPT, PY, "-c", "print('in')"], timeout=60, env=dict(
            gate, PADDLE_TRAINER_ID="0", PADDLE_TRAINERS_NUM="2", PADDLE_DIST_TOKEN_FILE=token_path))
        (tmp_path / "go").write_text("")
        out, err = finish(proc, killer)
    finally:
        (tmp_path / "go").write_text("")
    for refused, why in ((stranger, "did not prove this job's token"),
                         (twice, "rank 0 has joined this job already; a rank is admitted once")):
        assert refused.returncode == 2 and refused.stdout == ""
        [line] = refused.stderr.strip().splitlines()
        assert line.startswith("paddle_dist: rank ") and why in line
    assert proc.returncode == 0, err
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["1.0", "1.0"]
    assert not os.path.exists(token_path)                       # made for the job, gone with it
    for path in (tmp_path / "log").rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(n in text for n in needles), path
    assert not any(n in out + err for n in needles)


# ---------------------------------------------------------------- a port scan while it trains
# Two epochs of 16 steps: the scan goes on through the start-up, training and evaluation.
JOB = ["train.py", "-c", "configs/synthetic_lenet.yaml", "-o", "dist.nprocs=2", "-o", "train.epochs=2",
       "-o", "data.num_samples=2048", "-o", "data.num_eval_samples=256", "-o", "checkpoint.every_epochs=0"]


def _weights(run_dir):
    records = rank_statuses(run_dir)
    return [r["weights_sha256"] for r in records]


class _Scanner(threading.Thread):
    """Connects to the gate and the store of a running job and hangs up, again and again,
    as a TCP port scan does, until told to stop; counts the connections that got in."""

    def __init__(self, launcher_pid):
        super().__init__(daemon=True)
        self.launcher_pid, self.hits, self.stop = launcher_pid, {}, threading.Event()

    def run(self):
        targets = set()
        while not self.stop.is_set():
            targets |= self._targets()
            for target in targets:
                try:
                    socket.create_connection(target, timeout=1).close()
                    self.hits[target] = self.hits.get(target, 0) + 1
                except OSError:
                    pass

    def _targets(self):
        found = set()
        for pid in _ranks(self.launcher_pid):
            try:
                variables = _environ(pid)
            except OSError:
                continue
            for name in (rankgate.GATE, "PADDLE_MASTER"):
                host, _, port = variables.get(name, "").rpartition(":")
                if host:
                    found.add((host, int(port)))
        return found


def test_a_port_scan_of_the_gate_and_the_store_changes_nothing(tmp_path):
    quiet = check(run(JOB + ["-o", f"output.run_dir={tmp_path / 'quiet'}"], timeout=240))
    proc, killer = start(JOB + ["-o", f"output.run_dir={tmp_path / 'scanned'}"], limit=240)
    scanner = _Scanner(proc.pid)
    scanner.start()
    try:
        out, err = finish(proc, killer, timeout=240)
    finally:
        scanner.stop.set()
        scanner.join(timeout=10)
    assert proc.returncode == 0, err
    assert len(scanner.hits) == 2, scanner.hits                # it reached the gate and the store
    assert _weights(tmp_path / "scanned") == _weights(tmp_path / "quiet"), (quiet.stdout, out)


# ---------------------------------------------------------------- ranks started by hand
def _by_hand(rank, port, run_dir, token_file):
    return ["train.py", "--master", f"127.0.0.1:{port}", "--world-size", "2", "--rank", str(rank),
            "-c", "configs/synthetic_lenet.yaml", "-o", "train.epochs=1", "-o", "train.max_steps=5",
            "-o", "checkpoint.every_epochs=0", "-o", f"output.run_dir={run_dir}", "-o", f"dist.token_file={token_file}"]


@pytest.mark.compat
def test_ranks_started_by_hand_attest_with_dist_token_file(tmp_path):
    """No gate admits ranks started by hand (or by srun, mpirun): with dist.token_file they
    still attest in Paddle's store, so a rank holding another token ends the job with the
    security error on both ranks, and the same token trains."""
    token, other = _token_file(tmp_path / "job.token"), _token_file(tmp_path / "other.token")
    for tokens, run_dir in (((token, other), tmp_path / "mixed"), ((token, token), tmp_path / "same")):
        port = free_port()
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda r: run(_by_hand(r, port, run_dir, tokens[r]), timeout=180), (0, 1)))
        if tokens[1] == other:
            assert [r.returncode for r in results] == [6, 6], [r.stderr for r in results]
            assert (f"paddle_dist: security: rank 1's attestation in Paddle's store at 127.0.0.1:{port} "
                    "does not prove the job's token") in results[0].stderr
            # rank 1 cannot check rank 0's verdict with its own token either
            assert (f"paddle_dist: security: rank 1 read a verdict in Paddle's store at 127.0.0.1:{port} "
                    "that does not prove this rank's token: rank 0 holds another token") in results[1].stderr
        else:
            assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
            assert _weights(run_dir)[0] == _weights(run_dir)[1]
