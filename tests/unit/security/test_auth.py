"""The job token (paddle_dist/security/auth.py) and the node gate's proofs of it, over real loopback
sockets: the right token meets; another token, none, a replayed exchange, a reflected
proof and a node 0 that cannot prove the token are all refused in one line, and node 0
goes on waiting for the right machine."""

import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from paddle_dist.config import config_hash, key_digests, load
from paddle_dist.security import auth
from paddle_dist.launch import launcher, rendezvous
from paddle_dist.errors import UserError

from tests.oracles import as_nobody, shared_folder
from tests.unit.launch.test_rendezvous import _listening, _Node


def _token_file(tmp_path, name="job.token", mode=0o600, text=None):
    path = tmp_path / name
    path.write_text(text if text is not None else os.urandom(32).hex() + "\n")
    path.chmod(mode)
    return str(path)


def _gate(port, node_rank, token_file="", timeout=10.0):
    return rendezvous.MeetingPlace(f"127.0.0.1:{port}", 2, node_rank, 1, timeout, token_file=token_file)


# ---------------------------------------------------------------- the token file
def test_a_token_file_is_read_only_when_it_is_its_owners_alone(tmp_path):
    assert len(auth.read_token(_token_file(tmp_path))) == 32
    with pytest.raises(UserError, match=r"is open to others \(mode 0644\); run: chmod 600"):
        auth.read_token(_token_file(tmp_path, "wide.token", 0o644))
    with pytest.raises(UserError, match="does not hold 64 hexadecimal digits"):
        auth.read_token(_token_file(tmp_path, "short.token", text="abcd\n"))
    with pytest.raises(UserError, match="cannot be read"):
        auth.read_token(str(tmp_path / "missing.token"))


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")
shared = pytest.fixture(shared_folder)


@as_root
def test_another_users_token_file_is_refused_though_only_its_owner_can_read_it(shared):
    """Issue 53, finding 8: the other user made the empty file first (0600, theirs); the
    user filled it with the docs' command, and the job took it: they could read the token
    and meet node 0 as a machine of the job."""
    path = shared / "job.token"
    as_nobody(lambda: os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)), umask=None)
    path.write_text(auth.new_token() + "\n")              # root writes into it, as the docs' command would
    with pytest.raises(UserError, match=rf"^dist.token_file {path} belongs to user nobody \(uid 65534\), not to "
                                        "you: another user made it or can change it; remove it and make your own$"):
        auth.read_token(str(path))
    port = launcher.free_port("127.0.0.1")
    with pytest.raises(UserError, match="belongs to user nobody"):       # node 0 meets nobody with it
        rendezvous.meet(_gate(port, 0, token_file=str(path), timeout=1))
    with pytest.raises(UserError, match="belongs to user nobody"):       # nor does a machine
        rendezvous.meet(_gate(port, 1, token_file=str(path), timeout=1))


@as_root
def test_a_token_file_where_another_user_can_replace_it_is_refused(shared):
    """The file is the user's, but another user owns its directory, or may write into it:
    they could put a file of the user's choosing in its place (another job's token)."""
    theirs = shared / "theirs"
    as_nobody(lambda: theirs.mkdir(mode=0o755), umask=None)
    with pytest.raises(UserError, match=rf"is in {theirs}, which belongs to user nobody \(uid 65534\), so they "
                                        "could replace it; keep it in a directory only you can write"):
        auth.read_token(_token_file(theirs))
    open_to_all = shared / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)                           # not sticky: anyone may rename what is inside
    with pytest.raises(UserError, match=rf"is in {open_to_all}, which other users can write into \(mode 0777\)"):
        auth.read_token(_token_file(open_to_all))
    assert len(auth.read_token(_token_file(shared))) == 32     # sticky, as /tmp: others cannot replace it
    fifo = shared / "fifo.token"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(UserError, match="is not a regular file"):   # and reading it waits for nobody
        auth.read_token(str(fifo))


def test_a_proof_is_bound_to_its_direction_job_node_and_nonces():
    token, a, b = os.urandom(32), auth.nonce(), auth.nonce()
    mine = auth.proof(token, "client", "m:1/2", 1, a, b)
    assert auth.matches(mine, auth.proof(token, "client", "m:1/2", 1, a, b))
    for other in (auth.proof(token, "server", "m:1/2", 1, a, b), auth.proof(token, "client", "m:2/2", 1, a, b),
                  auth.proof(token, "client", "m:1/2", 2, a, b), auth.proof(token, "client", "m:1/2", 1, b, a),
                  auth.proof(os.urandom(32), "client", "m:1/2", 1, a, b)):
        assert not auth.matches(mine, other)
    assert not auth.matches(mine, None) and not auth.matches(mine, mine[:-1])


# ---------------------------------------------------------------- the gate
def test_machines_with_the_same_token_meet(tmp_path):
    token = _token_file(tmp_path)
    port = launcher.free_port("127.0.0.1")
    host, other = _Node(_gate(port, 0, token)), _Node(_gate(port, 1, token))
    host.start()
    other.start()
    assert other.result() is None and host.result() is None


@pytest.mark.parametrize("intruder", ["another", "none"])
def test_a_machine_with_another_token_or_none_is_refused_and_node_0_waits_on(intruder, tmp_path):
    token = _token_file(tmp_path)
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, token))
    host.start()
    _listening(port)
    bad = _gate(port, 1, _token_file(tmp_path, "other.token") if intruder == "another" else "")
    with pytest.raises(UserError) as refused:
        rendezvous.meet(bad)
    assert "\n" not in str(refused.value)
    assert ("wrong job token" if intruder == "another" else "admits only machines with the job's "
            "dist.token_file") in str(refused.value)
    assert host.is_alive()                          # node 0 still waits, for the right machine
    right = _Node(_gate(port, 1, token))
    right.start()
    assert right.result() is None and host.result() is None


def test_a_machine_refuses_a_node_0_that_cannot_prove_the_token(tmp_path):
    """Node 0 without a token cannot tell: it lets the machine in and goes on (to wait for
    its ranks in Paddle's launcher, until dist.rendezvous_timeout); the machine refuses."""
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, "", timeout=3))
    host.start()
    with pytest.raises(UserError, match="runs without the job token that this machine has"):
        rendezvous.meet(_gate(port, 1, _token_file(tmp_path), timeout=3))
    host.result()


def test_the_token_admits_a_machine_of_this_job_only(tmp_path):
    """Issue 53, finding 9: the token admitted a machine of another job of the same user at
    the same master (another config trained on as node 1, nothing said). Node 0 compares
    the configs' digests once the machine has proven the token, names the first key that
    differs, and goes on waiting for the machine of its job."""
    token, port = _token_file(tmp_path), launcher.free_port("127.0.0.1")
    mine, theirs = load().to_dict(), load(None, ["train.lr=0.5", "train.batch_size=7"]).to_dict()

    def place(node_rank, cfg):
        return replace(_gate(port, node_rank, token), config=config_hash(cfg), config_keys=key_digests(cfg))

    host = _Node(place(0, mine))
    host.start()
    _listening(port)
    with pytest.raises(UserError, match=r"^node 0 at 127.0.0.1:\d+ refused this node: this machine belongs to "
                                        r"another job than node 0's: its config is not node 0's: train.batch_size "
                                        r"differs \(and 1 more key\); give every machine the same -c and -o$"):
        rendezvous.meet(place(1, theirs))
    assert host.is_alive()                             # still waiting, for its own machine
    right = _Node(place(1, mine))
    right.start()
    assert right.result() is None and host.result() is None


def _node_0_waiting(token_file):
    """(port, node 0 waiting there with `token_file`, an announcement of node 1 to send it)."""
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, token_file))
    host.start()
    _listening(port)
    hello = {"v": rendezvous.VERSION, "node_rank": 1, "nnodes": 2, "nprocs": 1, "host": "x", "nonce": auth.nonce()}
    return port, host, hello


def _exchange(port, hello):
    """Connect to node 0, announce, and return (socket, its challenge message)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(rendezvous.encode(hello))
    frames = rendezvous.Frames()
    while True:
        for message in frames.feed(sock.recv(8192)):
            return sock, message


def _answer_of(sock):
    frames = rendezvous.Frames()
    while True:
        data = sock.recv(8192)
        if not data:
            return None
        for message in frames.feed(data):
            return message


def test_a_replayed_proof_and_a_reflected_one_are_refused(tmp_path):
    """A proof recorded from one connection does not open another (node 0's nonce is new),
    and node 0's own proof sent back to it is refused (the direction is in the MAC)."""
    path = _token_file(tmp_path)
    token = auth.read_token(path)
    port, host, hello = _node_0_waiting(path)
    first, challenge = _exchange(port, hello)
    job = rendezvous.job_id(_gate(port, 1))
    recorded = auth.proof(token, "client", job, 1, challenge["challenge"], hello["nonce"])
    first.close()                                   # a recording of a join that went no further
    replay, _ = _exchange(port, hello)
    replay.sendall(rendezvous.encode({"proof": recorded}))
    assert _answer_of(replay) == {"error": "wrong job token: this machine's dist.token_file is not node 0's"}
    reflect, challenge = _exchange(port, hello)
    reflect.sendall(rendezvous.encode({"proof": challenge["proof"]}))
    assert "wrong job token" in _answer_of(reflect)["error"]
    for sock in (replay, reflect):
        sock.close()
    right = _Node(_gate(port, 1, path))
    right.start()
    assert right.result() is None and host.result() is None


def test_the_token_is_in_no_gate_and_no_message(tmp_path):
    path = _token_file(tmp_path)
    hexed = auth.read_token(path).hex()
    assert hexed not in repr(_gate(1, 0, path))
    port, host, hello = _node_0_waiting(path)
    sock, challenge = _exchange(port, hello)
    assert hexed not in str(challenge)
    sock.close()
    _Node(_gate(port, 1, path)).start()
    assert host.result() is None


@pytest.mark.parametrize("with_token", [True, False])
def test_200_connections_that_hold_do_not_keep_a_machine_out(with_token, tmp_path):
    """A flood of connections that say nothing: node 0 makes room by dropping the oldest
    that was not admitted, so the machine still joins well within its deadline."""
    path = _token_file(tmp_path) if with_token else ""
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, path, timeout=20))
    host.start()
    _listening(port)
    holders = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(200)]
    try:
        assert rendezvous.meet(_gate(port, 1, path, timeout=4)).nodes[1].nprocs == 1
        assert host.result() is None
    finally:
        for sock in holders:
            sock.close()


def test_a_machine_dropped_by_a_flood_is_said(tmp_path, capsys):
    """Issue 53, finding 9: a flood could push a machine's connection out in the middle of
    its proof, and node 0 said nothing. Silent connections go first; a machine that has
    announced itself goes only when nothing else waits, and node 0 says so in one line."""
    path = _token_file(tmp_path)
    port, host, hello = _node_0_waiting(path)
    machine, _ = _exchange(port, hello)            # node_rank 1, its proof not sent yet
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    announced = [_exchange(port, dict(hello, nonce=auth.nonce()))[0] for _ in range(8)]
    assert "dropped" not in capsys.readouterr().err          # the silent ones made room
    announced += [_exchange(port, dict(hello, nonce=auth.nonce()))[0] for _ in range(30)]
    assert _answer_of(machine) is None                       # now it had to go ...
    said = capsys.readouterr().err.splitlines()
    assert [line for line in said if "dropped" in line] == [   # ... and is said, once
        f"paddle_dist: node 0 dropped the connection of node_rank 1 from 127.0.0.1 before it proved the job "
        f"token, to make room: 24 connections wait at dist.master 127.0.0.1:{port}, more than 2 machines make "
        "(a connection flood?); that machine connects again until the meeting's deadline"]
    for sock in silent + announced + [machine]:
        sock.close()
    assert rendezvous.meet(_gate(port, 1, path)).nodes[1].nprocs == 1
    assert host.result() is None


def test_random_frames_huge_lengths_and_cut_frames_leave_node_0_serving(tmp_path):
    """10^4 random frames (random lengths and bytes), a 4 GiB length prefix and a frame cut
    short: each connection is dropped, nothing escapes, and the right machine then joins."""
    import random

    path = _token_file(tmp_path)
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, path, timeout=60))
    host.start()
    _listening(port)
    rng = random.Random(5)
    payloads = [b"\xff\xff\xff\xff" + b"x" * 64, rendezvous.encode({"v": 2})[:7]]
    payloads += [rng.randbytes(rng.randint(1, 64)) for _ in range(10 ** 4)]
    for start in range(0, len(payloads), 100):          # 100 frames a connection
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            try:
                sock.sendall(b"".join(payloads[start:start + 100]))
            except OSError:                                 # dropped at the first bad frame
                pass
    assert host.is_alive()
    right = _Node(_gate(port, 1, path))
    right.start()
    assert right.result() is None and host.result() is None


def test_node_0_listens_on_the_masters_address_only():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, "", timeout=3))
    host.start()
    _listening(port)
    with pytest.raises(ConnectionRefusedError):        # another address of this host
        socket.create_connection(("127.0.0.2", port), timeout=2).close()
    assert isinstance(host.result(), rendezvous.NodesMissing)
    with pytest.raises(UserError, match="would have node 0 listen on every interface"):
        rendezvous.meet(rendezvous.MeetingPlace(f"0.0.0.0:{port}", 2, 0, 1, 1.0))
