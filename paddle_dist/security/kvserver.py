"""Paddle's multi-node rendezvous, served by node 0's paddle_dist on the meeting's listener.

After the machines meet (launch/rendezvous.py), each starts Paddle's launcher, whose machines find
each other through an HTTP key-value server at dist.master: each PUTs its entry
(`/<job>/info/<pod name>/<node rank>`, a JSON object: its ranks, its store candidate and
endpoints) and GETs the prefix until every machine's entry is there. Paddle's own server
authenticates nobody, serves one connection at a time and reads without a time limit:
one idle connection stops the job, one PUT of junk crashes the launchers.

Node 0's launcher looks for a server at dist.master before starting its own; paddle_dist
keeps the meeting's listener open and serves the same protocol there (KVServer), knowing
from the meeting which machines may take part:
- a connection from an address that is no machine of the job is closed at once;
- each connection is served in a thread of its own and dropped after READ_S without a
  request: a connection that holds holds up no other;
- a PUT must be a machine's own entry, from that machine's address (node 0's from one of
  this launcher's own processes), a JSON object of at most MAX_BODY bytes giving its node
  rank and number of ranks; the first one stands, a different one for the same machine is
  refused; anything else is refused (403) and remembered;
- `refusals()` lists what was refused and who connected from outside, for the report of
  a job whose ranks did not start.

Standard library only (the launcher side imports no Paddle).

Example:
    server = KVServer(listener, {0: Node(2, "10.0.0.1"), 1: Node(2, "10.0.0.2")})
    server.start()
    ...
    server.refusals()    # ['a connection from 10.0.0.9:41234, which is no machine of the job']
    server.close()
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import socketserver
import threading
from typing import Dict, List

from .. import procfs

READ_S = 10.0              # a connection that sends no request within this is dropped
MAX_BODY = 64 * 1024
MAX_SAID = 8               # refusals remembered
ENTRY = re.compile(r"^/[^/]+/info/[^/]+/(\d+)$")


class KVServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The rendezvous for the machines `nodes` ({node rank: topology.Node}), on `listener`
    (module docstring)."""

    daemon_threads = True

    def __init__(self, listener: socket.socket, nodes: Dict[int, object], keep_listener: bool = False):
        super().__init__(listener.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listener
        self.keep_listener = keep_listener     # close() leaves it to its owner (launch/host.py: KeptListener)
        self.nodes = nodes
        self.address_of = {rank: _ip_of(node.address) for rank, node in nodes.items()}
        self.entries: Dict[int, tuple] = {}        # node rank: (path, value, who wrote it)
        self.lock = threading.Lock()
        self._said: List[str] = []
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def start(self) -> "KVServer":
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving; close the listener too unless it is kept for the job's next meeting."""
        if self._thread.is_alive():
            self.shutdown()
        if not self.keep_listener:
            self.server_close()

    def verify_request(self, request, client_address) -> bool:
        if client_address[0] in self.address_of.values():
            return True
        self.say(f"a connection from {self.who(client_address)}, which is no machine of the job")
        return False

    @property
    def port(self) -> int:
        return self.server_address[1]

    def who(self, client) -> str:
        return _who(client, self.port)

    def say(self, line: str) -> None:
        with self.lock:
            if line not in self._said and len(self._said) < MAX_SAID:
                self._said.append(line)

    def refusals(self) -> List[str]:
        with self.lock:
            return list(self._said)

    # ------------------------------------------------------------ the protocol
    def put(self, path: str, body: bytes, client) -> int:
        """A machine's entry; the HTTP status."""
        match = ENTRY.match(path)
        node_rank = int(match.group(1)) if match else -1
        node = self.nodes.get(node_rank)
        with self.lock:
            first = self.entries.get(node_rank)
        if first is not None and first[:2] == (path, body) and client[0] == self.address_of[node_rank]:
            return 200                             # the same entry again: Paddle's launcher repeats it
        if node is None:
            self.say(f"a PUT of {path[:80]!r} from {self.who(client)}: no machine's entry")
            return 403
        if client[0] != self.address_of[node_rank] or (node_rank == 0 and not _ours(client, self.port)):
            self.say(f"a PUT of node {node_rank}'s entry from {self.who(client)}, which is not node {node_rank}"
                     + ("'s launcher" if node_rank == 0 else f" ({node.address})"))
            return 403
        try:
            entry = json.loads(body)
        except ValueError:
            entry = None
        if not isinstance(entry, dict) or entry.get("rank") != node_rank or entry.get("replicas") != node.nprocs:
            self.say(f"a PUT of node {node_rank}'s entry from {self.who(client)} that is not one: {body[:60]!r}")
            return 403
        with self.lock:
            first = self.entries.setdefault(node_rank, (path, body, self.who(client)))
        if first[:2] != (path, body):
            self.say(f"node {node_rank}'s entry, written first from {first[2]}, written again differently "
                     f"from {self.who(client)}")
            return 403
        return 200

    def get(self, prefix: str) -> Dict[str, str]:
        found = {"/healthy": "ok"} if "/healthy".startswith(prefix) and prefix else {}
        with self.lock:
            for path, body, _ in self.entries.values():
                if path.startswith(prefix):
                    found[path] = body.decode("utf-8", errors="replace")
        return found


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = READ_S

    def do_GET(self):
        found = self.server.get(self.path)
        self._reply(200 if found else 404, json.dumps(found).encode() if found else b"")

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self.server.say(f"a PUT of {length} bytes from {self.server.who(self.client_address)}")
            self._reply(413)
            return
        self._reply(self.server.put(self.path, self.rfile.read(length), self.client_address))

    do_PUT = do_POST

    def do_DELETE(self):
        self._reply(405)

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json; charset=utf8")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format, *args):     # noqa: A002  (BaseHTTPRequestHandler's signature)
        return


def _ip_of(host: str) -> str:
    """The IPv4 address of `host` (a machine's address as the meeting saw it: an address,
    or dist.master's host name for node 0)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def _who(client, port: int) -> str:
    """"host:port" of the client end `client` of a connection to `port`, with its process
    when it is on this machine and this user may see it."""
    pid = _pid_of(client, port)
    return f"{client[0]}:{client[1]}" + (f" (pid {pid}: {' '.join(procfs.cmdline(pid))[:80]})" if pid else "")


def _pid_of(client, port: int) -> int:
    """The process of this machine that holds the client end `client` of a connection to
    `port`, 0 when unknown."""
    return next((pid for ip, number, pid in procfs.peers_of(port) if (ip, number) == tuple(client[:2])), 0)


def _ours(client, port: int) -> bool:
    """Whether the peer `client` of a connection to `port` is a process of this launcher
    (a descendant of it)."""
    pid, me = _pid_of(client, port), os.getpid()
    for _ in range(64):
        if pid in (0, 1):
            return False
        if pid == me:
            return True
        pid = procfs.parent_of(pid)
    return False
