"""paddle_dist/security/kvserver.py over real sockets, as Paddle's launchers use it: the machines'
entries are stored and listed by prefix and /healthy answers; a connection from an
address of no machine is closed and named; an idle connection holds up no other; junk, a
machine's entry from another address, a second different entry and node 0's entry from a
process that is not this launcher's are refused (403) and named."""

import http.client
import json
import socket
import subprocess
import sys

import pytest

from paddle_dist.security import kvserver
from paddle_dist.runs.topology import Node


@pytest.fixture
def server():
    listener = socket.create_server(("127.0.0.1", 0))
    served = kvserver.KVServer(listener, {0: Node(1, "127.0.0.1"), 1: Node(2, "127.0.0.1")}).start()
    yield served
    served.close()


def _request(server, method: str, path: str, body: bytes = b"", source: str = "127.0.0.1"):
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10, source_address=(source, 0))
    conn.request(method, path, body=body)
    reply = conn.getresponse()
    status, data = reply.status, reply.read()
    conn.close()
    return status, data


def _entry(rank: int, replicas: int, candidate: str = "127.0.0.1:5000") -> bytes:
    return json.dumps({"name": f"pod{rank}", "rank": rank, "replicas": replicas, "candidate": candidate}).encode()


def test_entries_are_stored_listed_and_repeated(server):
    assert _request(server, "GET", "/healthy") == (200, b'{"/healthy": "ok"}')
    assert _request(server, "GET", "/default/info")[0] == 404
    assert _request(server, "PUT", "/default/info/aaaaaa/0", _entry(0, 1))[0] == 200
    assert _request(server, "POST", "/default/info/pod1/1", _entry(1, 2))[0] == 200
    assert _request(server, "POST", "/default/info/pod1/1", _entry(1, 2))[0] == 200      # Paddle repeats it
    status, data = _request(server, "GET", "/default/info")
    assert status == 200 and sorted(json.loads(data)) == ["/default/info/aaaaaa/0", "/default/info/pod1/1"]
    assert server.refusals() == []


def test_what_is_no_machines_entry_is_refused_and_named(server):
    assert _request(server, "PUT", "/default/info/evil/1", b"not json")[0] == 403
    assert _request(server, "PUT", "/default/info/evil/5", _entry(5, 1))[0] == 403
    assert _request(server, "PUT", "/default/info/pod1/1", _entry(1, 7))[0] == 403       # node 1 has 2 ranks
    assert _request(server, "PUT", "/default/info/pod1/1", _entry(1, 2))[0] == 200
    assert _request(server, "PUT", "/default/info/other/1", _entry(1, 2, "127.0.0.1:6"))[0] == 403
    assert _request(server, "DELETE", "/default/info/pod1/1")[0] == 405
    said = server.refusals()
    assert any(line.startswith("a PUT of node 1's entry from 127.0.0.1:") and "that is not one: b'not json'" in line
               for line in said), said
    assert any("'/default/info/evil/5'" in line and "no machine's entry" in line for line in said), said
    assert any("node 1's entry, written first from 127.0.0.1:" in line and "written again differently" in line
               for line in said), said


def test_a_connection_from_no_machine_is_closed_and_an_idle_one_holds_up_nothing(server):
    idle = socket.create_connection(server.server_address[:2])           # from a machine's address, silent
    try:
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            _request(server, "GET", "/healthy", source="127.0.0.2")       # no machine of the job
        assert _request(server, "GET", "/healthy")[0] == 200              # served while the idle one waits
    finally:
        idle.close()
    assert any(line.startswith("a connection from 127.0.0.2:") and line.endswith("which is no machine of the job")
               for line in server.refusals())


def test_node_0s_entry_only_from_this_launchers_processes(server):
    """Node 0's entry is taken from a child of this process, not from a process outside
    its tree (a grandchild whose parent ended), even from node 0's address."""
    host, port = server.server_address[:2]
    put = (f"import http.client, json; c = http.client.HTTPConnection('{host}', {port}, timeout=10); "
           "c.request('PUT', '/default/info/pod0/0', body=json.dumps({'rank': 0, 'replicas': 1})); "
           "print(c.getresponse().status, flush=True)")
    orphan = ("import os\nme = os.getpid()\nif os.fork() == 0:\n"
              "    while os.getppid() == me:\n        pass\n"      # until its parent has ended
              f"    exec({put!r})\n    os._exit(0)\nos._exit(0)\n")
    outside = subprocess.run([sys.executable, "-c", orphan], capture_output=True, text=True, timeout=30)
    assert outside.stdout.strip() == "403", outside.stderr
    assert any("a PUT of node 0's entry from 127.0.0.1:" in line and "which is not node 0's launcher" in line
               for line in server.refusals()), server.refusals()
    child = subprocess.run([sys.executable, "-c", put], capture_output=True, text=True, timeout=30)
    assert child.stdout.strip() == "200", child.stderr
