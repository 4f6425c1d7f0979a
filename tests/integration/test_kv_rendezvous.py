"""Paddle's launchers meet, after paddle_dist's meeting, in a key-value rendezvous at
dist.master that node 0's paddle_dist serves to the machines that met (kvserver.py).
Two machines on loopback train while another process holds idle connections to that port
the whole time and PUTs a machine's entry that is no entry: Paddle's own server, which
serves one connection at a time and trusts any PUT, kept the ranks from starting (exit 3)
or crashed. The ranks start and train to the same weights; a job whose ranks do not start
names what the rendezvous refused."""

import socket
import threading

import pytest

from ..oracles import free_port, rank_statuses
from .procs import check, finish, run, start
from .test_missing_node import _node


class Disturber:
    """Holds `count` idle connections to 127.0.0.1:`port` at all times (one that the server
    closes is replaced) and PUTs junk for node 1's entry on each new one, until stopped."""

    def __init__(self, port: int, count: int = 4):
        self.port, self.count = port, count
        self.stopped = threading.Event()
        self.connected = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        held = []
        while not self.stopped.is_set():
            held = [s for s in held if not _closed(s)]
            while len(held) < self.count and not self.stopped.is_set():
                try:
                    held.append(socket.create_connection(("127.0.0.1", self.port), timeout=1))
                    self.connected += 1
                except OSError:
                    break
                if self.connected % 2 == 0:      # every other one PUTs junk, then stays idle
                    body = b"not json"
                    held[-1].sendall(b"PUT /default/info/evil/1 HTTP/1.1\r\nHost: x\r\n"
                                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            self.stopped.wait(0.05)
        for s in held:
            s.close()

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=30)


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1 << 16) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


@pytest.mark.compat          # Paddle's launcher of each version talks to the rendezvous
def test_idle_connections_and_junk_at_the_rendezvous_hold_up_nothing(tmp_path):
    port, run_dir = free_port(), tmp_path / "run"
    node0, killer = start(_node(0, port, run_dir, timeout=60), limit=240)
    for line in node0.stdout:
        if "waiting for the other machines" in line:
            break
    disturber = Disturber(port)
    try:
        node1 = check(run(_node(1, port, run_dir, timeout=60), timeout=180))
        out, err = finish(node0, killer, timeout=120)
    finally:
        disturber.stop()
    assert node0.returncode == 0, err
    assert disturber.connected > 4                   # it held connections through the rendezvous too
    records = rank_statuses(run_dir)
    assert records[0]["weights_sha256"] == records[1]["weights_sha256"]
    assert node1.returncode == 0
