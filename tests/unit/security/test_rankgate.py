"""The gate of a one-machine job (paddle_dist/security/rankgate.py), over real loopback sockets: a
rank holding the job's token is admitted once and told where the store is; another
token, another job, a replayed or reflected exchange, a second claim of an admitted rank,
a flood of silent connections and random bytes are refused or dropped, and the gate goes
on admitting the job's ranks."""

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

import pytest

from paddle_dist.runtime.variables import port_range
from paddle_dist.security import auth, rankgate

JOB = "job-" + "a" * 16


@pytest.fixture
def gate():
    token = os.urandom(32)
    with rankgate.RankGate(token, JOB, world=2) as g:
        yield g


def _connect(gate) -> socket.socket:
    host, _, port = gate.address.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _until(condition, limit=10.0):
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_a_rank_with_the_token_is_admitted_once_and_told_the_store(gate):
    store = rankgate.admit(gate.address, JOB, 1, gate.token)
    host, _, port = store.rpartition(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    assert rankgate.admit(gate.address, JOB, 0, gate.token) == store      # one store for the job
    with pytest.raises(rankgate.Refused, match="rank 1 has joined this job already; a rank is admitted once"):
        rankgate.admit(gate.address, JOB, 1, gate.token)
    assert sorted(gate.admitted) == [0, 1]


def test_another_token_another_job_or_rank_are_refused_and_the_gate_goes_on(gate):
    with pytest.raises(rankgate.Refused, match="did not prove this job's token: it is not this job's gate"):
        rankgate.admit(gate.address, JOB, 0, os.urandom(32))
    with pytest.raises(rankgate.Refused, match="another job"):
        rankgate.admit(gate.address, "job-" + "b" * 16, 0, gate.token)
    with pytest.raises(rankgate.Refused, match=r"rank 2 is not one of this job's ranks 0..1"):
        rankgate.admit(gate.address, JOB, 2, gate.token)
    assert gate.admitted == {}
    rankgate.admit(gate.address, JOB, 0, gate.token)
    assert list(gate.admitted) == [0]


def test_a_process_without_the_token_cannot_answer_the_challenge(gate):
    with _connect(gate) as sock:
        rankgate.send(sock, {"v": 1, "job": JOB, "rank": 0, "nonce": auth.nonce()})
        challenge = rankgate.receive(sock, time.monotonic() + 5)
        rankgate.send(sock, {"proof": "0" * 64})
        assert "wrong job token" in rankgate.receive(sock, time.monotonic() + 5)["error"]
    assert set(challenge) == {"nonce", "proof"} and gate.admitted == {}


def test_a_replayed_transcript_and_a_reflected_proof_are_refused(gate):
    """A recording of a real admission, sent again on a new connection, fails: the gate's
    nonce is new. Its own proof sent back fails: the direction is in the MAC."""
    said = []
    real_send = rankgate.send
    rankgate.send = lambda sock, message: said.append(message) or real_send(sock, message)
    try:
        rankgate.admit(gate.address, JOB, 1, gate.token)
    finally:
        rankgate.send = real_send
    hello, answer = [m for m in said if "v" in m or set(m) == {"proof"}]     # the rank's side
    with _connect(gate) as sock:
        rankgate.send(sock, hello)
        rankgate.receive(sock, time.monotonic() + 5)
        rankgate.send(sock, answer)
        assert "wrong job token" in rankgate.receive(sock, time.monotonic() + 5)["error"]
    with _connect(gate) as sock:
        rankgate.send(sock, {"v": 1, "job": JOB, "rank": 0, "nonce": auth.nonce()})
        challenge = rankgate.receive(sock, time.monotonic() + 5)
        rankgate.send(sock, {"proof": challenge["proof"]})
        assert "wrong job token" in rankgate.receive(sock, time.monotonic() + 5)["error"]
    assert list(gate.admitted) == [1]


def test_two_hundred_silent_connections_do_not_keep_the_ranks_out(gate):
    held = [_connect(gate) for _ in range(200)]
    try:
        for rank in (0, 1):
            started = time.monotonic()
            rankgate.admit(gate.address, JOB, rank, gate.token)
            assert time.monotonic() - started < rankgate.ANSWER_S + 1
    finally:
        for sock in held:
            sock.close()
    assert sorted(gate.admitted) == [0, 1]


def test_random_bytes_long_lines_and_cut_frames_are_dropped(gate):
    """10^4 random frames, a line far over the limit, and frames cut short: each connection
    is dropped with a reason, no exception escapes a thread, and the ranks still get in."""
    escaped = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: escaped.append(args.exc_value)
    try:
        rng = random.Random(7)
        with _connect(gate) as sock:           # one connection: the gate drops it at the first bad line
            sock.sendall(b"".join(rng.randbytes(rng.randint(1, 64)) + b"\n" for _ in range(10 ** 4)))
        with _connect(gate) as sock:
            try:
                sock.sendall(b"{" + b"x" * (1 << 22))
            except OSError:
                pass                           # dropped while still sending: that is the point
        for cut in (b'{"v": 1, "job": ', json.dumps({"v": 1, "job": JOB, "rank": 0}).encode()[:10]):
            with _connect(gate) as sock:
                sock.sendall(cut)
        for garbage in (b"[]\n", b"null\n", b'{"v":1,"job":"' + JOB.encode() + b'","rank":true}\n'):
            with _connect(gate) as sock:
                sock.sendall(garbage)
                sock.recv(4096)
        assert _until(lambda: len(gate.refused) >= 7), gate.refused
        rankgate.admit(gate.address, JOB, 0, gate.token)
        rankgate.admit(gate.address, JOB, 1, gate.token)
    finally:
        threading.excepthook = old_hook
    assert escaped == []
    assert any("too long" in why for why in gate.refused)


def _run_script(environ, program):
    script_env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    script_env.update(environ)
    return subprocess.run([sys.executable, "-S", rankgate.SCRIPT, *program], env=script_env,
                          capture_output=True, text=True, timeout=60)


def test_the_rank_side_becomes_its_program_with_the_store_or_says_why_not(gate, tmp_path):
    token_file = tmp_path / "job.token"
    token_file.write_text(gate.token.hex())
    token_file.chmod(0o600)
    ranks = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2", **gate.variables(str(token_file))}
    shown = "import os; print(os.getpid(), os.environ['PADDLE_MASTER'], os.environ['PADDLE_CURRENT_ENDPOINT'])"
    done = _run_script(ranks, [sys.executable, "-c", shown])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1].startswith("127.0.0.1:") and len(done.stdout.split()) == 3
    again = _run_script(ranks, [sys.executable, "-c", shown])         # rank 1 a second time
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.strip() == (f"paddle_dist: rank 1 was refused by the job's gate at {gate.address}: "
                                    "rank 1 has joined this job already; a rank is admitted once")
    other = tmp_path / "other.token"
    other.write_text(os.urandom(32).hex())
    other.chmod(0o600)
    stranger = _run_script(dict(ranks, PADDLE_TRAINER_ID="0", PADDLE_DIST_TOKEN_FILE=str(other)),
                           [sys.executable, "-c", shown])
    assert stranger.returncode == 2 and len(stranger.stderr.strip().splitlines()) == 1
    assert "did not prove this job's token" in stranger.stderr
    token_file.chmod(0o644)
    wide = _run_script(dict(ranks, PADDLE_TRAINER_ID="0"), [sys.executable, "-c", shown])
    assert wide.returncode == 2 and "is open to others (mode 0644)" in wide.stderr


def test_after_the_job_nothing_answers_at_the_gate(tmp_path):
    with rankgate.RankGate(os.urandom(32), JOB, world=1) as g:
        address = g.address
    with pytest.raises(rankgate.Refused, match="nothing answers at .*: the job that started this rank has ended"):
        rankgate.admit(address, JOB, 0, g.token)


def test_store_variables_name_the_store_and_each_ranks_endpoint():
    variables = rankgate.store_variables(1, 2, "127.0.0.1", 6170)
    assert variables["PADDLE_MASTER"] == "127.0.0.1:6170"
    endpoints = variables["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert endpoints[1] == variables["PADDLE_CURRENT_ENDPOINT"] and len(set(endpoints)) == 2


def test_the_gate_listens_on_loopback_alone(gate):
    port = int(gate.address.rpartition(":")[2])
    with pytest.raises(ConnectionRefusedError):        # another address of this host
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
    rankgate.admit(gate.address, JOB, 0, gate.token)


def test_free_port_picks_from_port_range_and_steps_over_a_taken_one():
    """PORT_RANGE (Paddle's launcher's variable) bounds the store's port: within it, and
    never one that something already listens on."""
    taken = socket.socket()
    # Two neighbouring ports from this test process's own range (tests/conftest.py), where
    # no other test process picks: the first taken here, the second free.
    low, high = port_range(os.environ)
    for port in range(low or 20000, (high or 20999) - 1):
        try:
            taken.bind(("127.0.0.1", port))
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 1))
            break
        except OSError:
            taken.close()
            taken = socket.socket()
    taken.listen()
    try:
        ports = port_range({"PORT_RANGE": f"{port}:{port + 1}"})
        picked = {rankgate.free_port("127.0.0.1", ports) for _ in range(20)}
    finally:
        taken.close()
    assert picked == {port + 1}


@pytest.mark.parametrize("text", ["", "5000", "a:b", "9:3", "0:100", "1:70000"])
def test_free_port_is_the_kernels_pick_without_a_usable_range(text):
    ports = port_range({"PORT_RANGE": text})
    assert 0 < rankgate.free_port("127.0.0.1", ports) < 65536
    assert ports == (0, 0)
