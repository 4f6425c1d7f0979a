"""paddle_dist/runtime/gloocheck.py with real sockets and processes: a connection to a rank's
socket from a process that is not a rank is named, with its pid and command; a rank's
own connections are not; an address in gloo's keys that another process holds is named
as rewritten; gloo's address records decode."""

import os
import socket
import struct
import subprocess
import sys

import pytest

from paddle_dist.runtime import gloocheck
from paddle_dist import procfs

UNUSED_STORE = ("127.0.0.1", 1)


@pytest.fixture
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    yield server
    server.close()


def _holder(code: str):
    """A process that is no rank of the job, running `code` until its stdin closes."""
    child = subprocess.Popen([sys.executable, "-c", code + "\nimport sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def _end(child):
    child.stdin.close()
    child.wait(timeout=30)


def test_a_connection_from_a_process_that_is_no_rank_is_named(listener):
    port = listener.getsockname()[1]
    child = _holder(f"import socket; s = socket.create_connection(('127.0.0.1', {port})); print('ready', flush=True)")
    accepted, _ = listener.accept()
    try:
        [line] = gloocheck.outsiders(*UNUSED_STORE, world=2, rank=0)
        assert line.startswith(f"rank 0's gloo socket 127.0.0.1:{port} is connected from 127.0.0.1:")
        assert f"held by pid {child.pid} ({sys.executable} -c import socket" in line
        assert line.endswith("not by a rank of the job")
    finally:
        _end(child)
        accepted.close()


def test_the_ranks_own_connections_and_the_stores_are_not_named(listener):
    port = listener.getsockname()[1]
    mine = socket.create_connection(("127.0.0.1", port))     # this rank to itself: a rank at both ends
    accepted, _ = listener.accept()
    child = _holder(f"import socket; s = socket.create_connection(('127.0.0.1', {port})); print('ready', flush=True)")
    other, _ = listener.accept()
    try:
        assert gloocheck.outsiders("127.0.0.1", port, world=2, rank=0) == []   # `port` is the store's here
        assert len(gloocheck.outsiders(*UNUSED_STORE, world=2, rank=0)) == 1
    finally:
        _end(child)
        for s in (mine, accepted, other):
            s.close()


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
