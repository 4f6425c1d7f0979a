"""The ranks' attestation in Paddle's store (paddle_dist/security/attest.py) where the store
misbehaves, over real sockets: a store that never answers, or hangs up, ends the rank in
one line (exit 4) within the limit; and procfs.peers_of names who is connected to a port.
(A real store with outsiders writing into it: tests/integration/test_job_gate.py.)"""

import os
import socket
import threading

import pytest

from paddle_dist import errors
from paddle_dist.security import attest
from paddle_dist import procfs


@pytest.fixture
def server():
    listener = socket.create_server(("127.0.0.1", 0))
    yield listener
    listener.close()


def test_a_store_that_never_answers_ends_the_rank_in_one_line(server, capsys):
    where = f"127.0.0.1:{server.getsockname()[1]}"
    with pytest.raises(attest.StoreSilent) as caught:
        attest.check(where, os.urandom(32), "job", 1, 2, limit=0.5)
    assert caught.value.code == errors.EXIT_HANG == 4
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"paddle_dist: rank 1: Paddle's store at {where} did not answer within 0.5 s")
    assert "dist.hang_timeout sets this limit" in line


def test_a_store_that_hangs_up_ends_the_rank_too(server, capsys):
    def hang_up():
        conn, _ = server.accept()
        conn.recv(64)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    with pytest.raises(attest.StoreSilent):
        attest.check(f"127.0.0.1:{server.getsockname()[1]}", os.urandom(32), "job", 0, 2, limit=30)
    assert "closed the connection" in capsys.readouterr().err


def test_peers_of_a_port_are_named_with_their_process(server, monkeypatch):
    port = server.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port)) as client:
        accepted, _ = server.accept()
        with accepted:
            assert ("127.0.0.1", client.getsockname()[1], os.getpid()) in procfs.peers_of(port)
            # An earlier connection from the same local port, in TIME_WAIT (state 06), has no inode.
            sockets = list(procfs._tcp_sockets())
            mine = next(local for local, remote, _, _ in sockets if remote[1] == port)
            monkeypatch.setattr(procfs, "_tcp_sockets", lambda: sockets + [(mine, ("0100007F", 9), "06", "0")])
            assert ("127.0.0.1", client.getsockname()[1], os.getpid()) in procfs.peers_of(port)
    monkeypatch.undo()
    assert procfs.peers_of(port) == []


class DictStore:
    """The store's four calls, in memory: a one-rank job that joined it."""

    def __init__(self):
        self.keys = {attest.JOINS: b"1"}

    def add(self, key, n):
        self.keys[key] = str(int(self.keys.get(key, b"0")) + n).encode()
        return int(self.keys[key])

    def set(self, key, value):
        self.keys[key] = value

    def get(self, key):
        return self.keys[key]

    def check(self, key):
        return key in self.keys


@pytest.mark.parametrize("forged", [None, b"ok"], ids=["alone", "verdict-written-before"])
def test_rank_0_finds_a_verdict_written_before_its_own(forged):
    store, token = DictStore(), os.urandom(32)
    if forged is not None:
        store.set(attest.PREFIX + "verdict", forged)
    verdict = attest._attest(store, token, "job", 0, 1, "127.0.0.1:1")
    if forged is None:
        assert verdict == attest.OK
    else:
        assert verdict.startswith("a verdict was in Paddle's store at 127.0.0.1:1 before rank 0 wrote its own")
    # What the other ranks read is rank 0's verdict, proven: they end the same way.
    nonce = store.get(attest.PREFIX + "nonce").decode()
    assert attest._proven_verdict(store.get(attest.PREFIX + "verdict").decode(), token, "job", nonce, 1,
                                  "127.0.0.1:1") == verdict
