"""paddle_dist/runtime/gloocheck.py with real sockets and processes: a connection to a rank's
socket from a process that is not a rank is named, with its pid and command; a rank's
own connections are not; an address in gloo's keys that another process holds is named
as rewritten; gloo's address records decode; a key rewritten to an address nobody holds
is named from a rank that listens where none of its keys says (on a machine described
by hand), and not from what a normal start leaves."""

import json
import os
from pathlib import Path
import socket
import struct
import subprocess
import sys

from paddle_dist.runtime import gloocheck
from paddle_dist import procfs



def _holder(code: str):
    """A process that is no rank of the job, running `code` until its stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", code + "\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _end(child):
    child.stdin.close()
    child.wait(timeout=30)


# The rank is a fresh process of its own: gloocheck counts its siblings as ranks, and the
# test runner's siblings (other pytest-xdist workers) hold sockets of their own.
RANK = """
import json, socket, subprocess, sys
from paddle_dist.runtime import gloocheck
UNUSED_STORE = ("127.0.0.1", 1)
server = socket.create_server(("127.0.0.1", 0))
port = server.getsockname()[1]
held = []
if OWN:        # this rank to itself: a rank at both ends
    held += [socket.create_connection(("127.0.0.1", port)), server.accept()[0]]
code = f"import socket; s = socket.create_connection(('127.0.0.1', {port})); print('ready', flush=True)"
child = subprocess.Popen([sys.executable, "-c", code + "\\nimport sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "ready"
held.append(server.accept()[0])
try:
    print(json.dumps({"port": port, "holder": child.pid, "unused_store": gloocheck.outsiders(
        *UNUSED_STORE, world=2, rank=0), "store_is_the_port": gloocheck.outsiders(
        "127.0.0.1", port, world=2, rank=0)}))
finally:
    child.stdin.close()
    child.wait(timeout=30)
"""


def _rank(own: bool) -> dict:
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", f"OWN = {own}\n" + RANK], capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_connection_from_a_process_that_is_no_rank_is_named():
    seen = _rank(own=False)
    [line] = seen["unused_store"]
    assert line.startswith(f"rank 0's gloo socket 127.0.0.1:{seen['port']} is connected from 127.0.0.1:")
    assert f"held by pid {seen['holder']} ({sys.executable} -c import socket" in line
    assert line.endswith("not by a rank of the job")


def test_the_ranks_own_connections_and_the_stores_are_not_named():
    seen = _rank(own=True)
    assert seen["store_is_the_port"] == []      # `port` is the store's here
    assert len(seen["unused_store"]) == 1


def _record(ip: str, port: int, sequence: int = -1) -> bytes:
    """One gloo tcp Address: sockaddr_storage (family little-endian, port big-endian) + int64."""
    return (struct.pack("<H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(ip)
            + bytes(120) + struct.pack("<q", sequence))


def test_gloo_address_records_decode():
    assert gloocheck._addresses(_record("127.0.0.1", 39011) + _record("10.0.0.2", 1234, 7)) == \
        [("127.0.0.1", 39011), ("10.0.0.2", 1234)]
    assert gloocheck._addresses(b"short") == []


def test_an_address_in_gloos_keys_held_by_another_process_is_named_as_rewritten():
    child = _holder("import socket; s = socket.create_server(('127.0.0.1', 0)); "
                    "print('ready', flush=True); print(s.getsockname()[1], flush=True)")
    try:
        port = int(child.stdout.readline())
        ranks = {os.getpid(): "rank 0"}
        sockets = [(gloocheck._address(local), gloocheck._address(remote), state, inode)
                   for local, remote, state, inode in procfs._tcp_sockets()]
        published = {("0/1", 1): [("127.0.0.1", port)]}
        [line] = gloocheck._rewritten(ranks, procfs._socket_owners(), sockets, published)
        assert line.startswith(f"gloo's key '0/1' in Paddle's store gives 127.0.0.1:{port} as rank 1's address, "
                               f"but pid {child.pid} (")
        assert line.endswith("something outside the job rewrote the key")
        assert gloocheck._rewritten({**ranks, child.pid: "rank 1"}, procfs._socket_owners(), sockets, published) == []
    finally:
        _end(child)


# A key rewritten to an address nobody holds (_moved), on a machine described by hand:
# rank 0 (pid 100) holds the store; rank 1 (pid 101) listens for gloo at 127.0.0.1:40421
# and holds the connection of a pair it accepted earlier, at 127.0.0.1:34407.
STORE_PORT = 6170
RANKS = {100: "rank 0", 101: "rank 1"}
OWNERS = {"s0": 100, "g0": 100, "g1": 101, "a1": 101, "user": 101}
LISTENING = [(("0.0.0.0", STORE_PORT), ("0.0.0.0", 0), gloocheck.LISTEN, "s0"),
             (("127.0.0.1", 40421), ("0.0.0.0", 0), gloocheck.LISTEN, "g1"),
             (("127.0.0.1", 34407), ("127.0.0.1", 49154), gloocheck.ESTABLISHED, "a1")]
KEYS = {("0/0", 0): [("127.0.0.1", 46459)], ("0/1", 1): [("127.0.0.1", 34407)],
        ("0", 0): [("127.0.0.1", 39109)], ("1", 1): [("127.0.0.1", 256)]}      # '1' rewritten
REFUSED = ("127.0.0.1", 1)         # port 256 as gloo prints it (its stored bytes, 01 00)


def _moved(sockets=LISTENING, published=KEYS, me=100, before=(), refused=REFUSED):
    return gloocheck._moved(RANKS, OWNERS, sockets, published, STORE_PORT, me, set(before), refused)


def test_the_peer_a_rank_was_refused_at_is_named_when_it_listens_where_no_key_says():
    [line] = _moved()
    assert line == ("gloo's key '1' in Paddle's store gives 127.0.0.1:256 as rank 1's address, but rank 1 "
                    "(pid 101) listens on 127.0.0.1:40421, which no key of it gives, and nothing here holds "
                    "that address: something outside the job rewrote the key")


def test_a_peer_that_failed_too_or_an_address_someone_holds_is_no_rewrite():
    closed = [s for s in LISTENING if s[3] != "g1"]             # rank 1 gave up as well: can't tell
    assert _moved(sockets=closed) == []
    honest = {**KEYS, ("1", 1): [("127.0.0.1", 40421)]}       # refused at a listener that is there
    assert _moved(published=honest, refused=("127.0.0.1", 40421)) == []
    assert _moved(refused=("127.0.0.1", 2304)) == []           # at an address no key gives
    assert _moved(me=101) == []                                 # the failing rank itself is not judged


def test_a_rank_at_its_deadline_judges_its_own_keys_without_the_sockets_it_had_before():
    assert len(_moved(me=101, refused=None)) == 1
    assert _moved(me=100, refused=None) == []                   # rank 0: listens on nothing of gloo's
    honest = {**KEYS, ("1", 1): [("127.0.0.1", 40421)]}
    assert _moved(me=101, refused=None, published=honest) == []
    # A listener the rank opened before the rendezvous (its own server), or one on every
    # interface (gloo binds one address), is not gloo's; a key's address it still holds
    # (a pair it accepted) is its own.
    user = [(("127.0.0.1", 8000), ("0.0.0.0", 0), gloocheck.LISTEN, "user"), *LISTENING[::2]]
    honest = {**KEYS, ("1", 1): [("127.0.0.1", 34407)]}
    assert _moved(sockets=user, me=101, refused=None, before={"user"}) == []
    assert _moved(sockets=user, me=101, refused=None, published=honest) == []
    wildcard = [(("0.0.0.0", 40421), ("0.0.0.0", 0), gloocheck.LISTEN, "g1"), *LISTENING[::2]]
    assert _moved(sockets=wildcard, me=101, refused=None) == []


def test_the_key_of_a_pair_the_rank_connected_from_its_side_is_not_the_one_named():
    """In the first process group (keys 0/N) rank 1 connected to rank 0's listener, and
    closed its own: the address of key 0/1 is held by nobody, rightly."""
    connected = [*LISTENING[:2], (("127.0.0.1", 50000), ("127.0.0.1", 46459), gloocheck.ESTABLISHED, "a1")]
    keys = {**KEYS, ("0/1", 1): [("127.0.0.1", 36007)]}
    [line] = _moved(sockets=connected, published=keys, me=101, refused=None)
    assert line.startswith("gloo's key '1' in Paddle's store gives 127.0.0.1:256 as rank 1's address")
    assert gloocheck._peer_record(keys, "0/1", 1, 0) == ("127.0.0.1", 46459)
    assert gloocheck._peer_record({("2", 2): [("h", 1), ("h", 2)]}, "1", 1, 1) == ("h", 2)     # rank 2's for 1


def test_gloos_connect_error_gives_the_refused_address_its_port_as_stored():
    error = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:784] connect [127.0.0.1]:2304: Connection refused"
    assert gloocheck.refused_at(error) == ("127.0.0.1", 2304)
    assert gloocheck._same(("127.0.0.1", 9), ("127.0.0.1", 2304))
    assert gloocheck.refused_at("Timed out waiting 1800000ms for recv operation") is None


def test_a_finding_must_hold_a_moment_later_and_a_failure_without_an_address_judges_nobody(monkeypatch):
    looks = iter([(OWNERS, LISTENING, KEYS), (OWNERS, LISTENING, {**KEYS, ("1", 1): [("127.0.0.1", 40421)]})])
    monkeypatch.setattr(gloocheck, "rank_pids", lambda *a: dict(RANKS))
    monkeypatch.setattr(gloocheck, "_look", lambda *a: next(looks))
    monkeypatch.setattr(gloocheck, "CONFIRM_S", 0)
    assert gloocheck.outsiders("127.0.0.1", STORE_PORT, 2, 1, pid=101) == []     # published late: honest
    monkeypatch.setattr(gloocheck, "_look", lambda *a: (OWNERS, LISTENING, KEYS))
    assert len(gloocheck.outsiders("127.0.0.1", STORE_PORT, 2, 1, pid=101)) == 1
    assert gloocheck.outsiders("127.0.0.1", STORE_PORT, 2, 1, pid=101, error="Socket closed") == []
    assert len(gloocheck.outsiders("127.0.0.1", STORE_PORT, 2, 0, pid=100, error="connect [127.0.0.1]:1: x")) == 1
