"""paddle_dist/runtime/gloocheck.py with real sockets and processes: a connection to a rank's
socket from a process that is not a rank is named, with its pid and command; a rank's
own connections are not; an address in gloo's keys that another process holds is named
as rewritten; gloo's address records decode."""

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
