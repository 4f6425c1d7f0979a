"""The raw store client (storewire) speaks the protocol of Paddle's own TCP store: against a
real `core.TCPStore` master in another process, its ADD moves the join counter a rank reads,
its SET changes what the store's `get` returns, its GET reads what the store's `set` wrote,
and a GET of a missing key ends at the socket's timeout instead of blocking.

The master is a subprocess in its own session that answers one request per stdin line with
one JSON line; every read of it is bounded, and the whole session is killed afterwards.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import struct
import subprocess
import threading
import time

import pytest

from paddle_dist.security import storewire

from ..oracles import free_port
from .procs import PY, ROOT, settled_session

pytestmark = pytest.mark.compat   # the protocol is the same in Paddle 2.6 and 3.x

HOST = "127.0.0.1"

# A store master of world size 1 (its constructor returns once its own join is counted),
# then: "add KEY N" -> new value, "set KEY HEX" -> null, "get KEY" -> hex of the value.
MASTER = r"""
import json, sys
from paddle.base import core
store = core.TCPStore("127.0.0.1", int(sys.argv[1]), True, 1, 60)
print(json.dumps("ready"), flush=True)
for line in sys.stdin:
    op, key, *arg = line.split()
    if op == "add":
        out = store.add(key, int(arg[0]))
    elif op == "set":
        out = store.set(key, bytes.fromhex(arg[0] if arg else ""))
    else:
        out = store.get(key).hex()
    print(json.dumps(out), flush=True)
"""



class Master:
    """A TCPStore master in a subprocess, driven through the store's own Python API."""

    def __init__(self, limit: float = 120):
        self.port = free_port(HOST)
        self.proc = subprocess.Popen([PY, "-c", MASTER, str(self.port)], cwd=str(ROOT), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
        self.killer = threading.Timer(limit, self._kill)
        self.killer.start()
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")          # end of output

    def _kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def reply(self, timeout: float = 30):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"the store master gave no answer within {timeout}s") from None
        if not line:
            raise AssertionError(f"the store master ended: exit {self.proc.wait(10)}\n"
                                 f"{self.proc.stderr.read()[-3000:]}")
        return json.loads(line)

    def ask(self, *words):
        self.proc.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.proc.stdin.flush()
        return self.reply()

    # The store's own API, as a rank calls it.
    def add(self, key: str, n: int) -> int:
        return self.ask("add", key, n)

    def set(self, key: str, value: bytes) -> None:
        self.ask("set", key, value.hex())

    def get(self, key: str) -> bytes:
        return bytes.fromhex(self.ask("get", key))

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.killer.cancel()
            left = settled_session(self.proc.pid)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            self._kill()
            self.proc.wait()
        assert not left, f"processes left behind by the store master: {left}"


@pytest.fixture
def master():
    m = Master()
    try:
        assert m.reply(timeout=60) == "ready"
        yield m
    finally:
        m.close()


def test_add_moves_the_join_counter_a_rank_reads(master):
    assert master.add(storewire.JOIN_KEY, 0) == 1            # the master's own join
    assert storewire.add(HOST, master.port, storewire.JOIN_KEY, 0) == 1
    assert storewire.add(HOST, master.port, storewire.JOIN_KEY, 1) == 2
    assert master.add(storewire.JOIN_KEY, 0) == 2
    assert storewire.add(HOST, master.port, storewire.JOIN_KEY, -2) == 0
    assert master.add(storewire.JOIN_KEY, 0) == 0
    assert master.get(storewire.JOIN_KEY) == b"0"            # a counter is its decimal text


def test_set_changes_what_the_stores_get_returns(master):
    value = bytes(range(256)) + b"\n end"
    storewire.set_value(HOST, master.port, "some/key", value)
    assert master.get("some/key") == value
    storewire.set_value(HOST, master.port, "some/key", b"")
    assert master.get("some/key") == b""


def test_get_reads_what_the_stores_set_wrote(master):
    master.set("written", b"\x00by a rank\xff")
    assert storewire.get(HOST, master.port, "written") == b"\x00by a rank\xff"
    with storewire.Connection(HOST, master.port) as conn:   # several requests on one socket
        assert conn.check("written") and not conn.check("never written")
        assert conn.add("n", 5) == 5 and conn.add("n", -2) == 3
        assert conn.get("n") == b"3"
    assert master.add("n", 0) == 3


def test_get_of_a_missing_key_ends_at_the_timeout_and_the_store_goes_on(master):
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        storewire.get(HOST, master.port, "missing", timeout=0.5)
    assert time.monotonic() - start < 10
    assert not storewire.check(HOST, master.port, "missing")
    assert master.add("after", 1) == 1


def test_a_wait_returns_when_a_rank_sets_the_key(master):
    with storewire.Connection(HOST, master.port, timeout=30) as conn:
        conn.send(storewire.frame(storewire.WAIT, "later"))
        master.set("later", b"now")
        assert conn.recv_exact(4) == struct.pack("=i", storewire.STOP_WAIT)
        assert conn.get_now("later") == b"now"
