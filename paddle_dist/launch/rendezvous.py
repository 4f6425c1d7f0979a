"""The machines of a multi-node launch meet here before Paddle's launcher starts.

`python -m paddle.distributed.launch --nnodes N` holds the ranks back until every node has
joined its HTTP rendezvous, and waits for a missing node for ever: nothing of paddle_dist
runs in the ranks before then, so the ranks' own deadline cannot help. So each node's
launcher first meets the others at a small rendezvous of its own, on node 0, at the port of
`dist.master`, and gives up after `dist.rendezvous_timeout` seconds, saying which
`node_rank`s are missing. Node 0 then keeps that listener and serves Paddle's launchers'
own rendezvous on it (kvserver.py), to the machines that met alone.

Protocol (version 2), over TCP. Every message is a frame: a 4-byte big-endian length, then
that many bytes (at most MAX_FRAME) of a UTF-8 JSON object. A node (node_rank > 0) connects
to node 0 and sends `{"v": 2, "node_rank": R, "nnodes": N, "nprocs": P, "host": "name"}`
("host": its host name, at most MAX_NAME characters, for node 0's reports). Node 0 answers
`{"arrived": {"0": [P, "address"], ...}}` each time the set of arrived nodes changes, and at
the end `{"go": true, "run": "name"}` (every node arrived; node 0 serves Paddle's
rendezvous on its listener from now on;
"run", when node 0 has chosen its run directory already, is that directory's name, at most
MAX_NAME characters and never a path: every machine then writes under a directory of that
name, so that all of a job's records carry one name and never join another job's), or
`{"missing": [R, ...], "arrived": ...}` (its deadline passed), or `{"error": "..."}` (this
node's announcement was refused: a wrong dist.nnodes, a node_rank already there, another
version, a wrong job token). With a job token (`dist.token_file`, auth.py) the announcement
also carries the node's nonce, `"nonce": hex`; node 0 answers it first with
`{"challenge": its nonce, "proof": HMAC("server", ...)}` and admits the node only after
its `{"proof": HMAC("client", ...)}` (every node sends a nonce; one with a token refuses
to go on when node 0 proves nothing). Node 0 reads nothing unframed: a longer frame, bad
JSON, or a connection that is not admitted within HELLO_S seconds is dropped; a node drops
a "run" that is not a plain name (a "/", "." or "..") as a protocol error. With
`dist.tls_ca`, `dist.tls_cert` and `dist.tls_key` (tls.py) all of this runs inside mutual
TLS 1.3, unchanged; node 0 takes each handshake a step at a time in its select() loop, so
a slow or plaintext connection holds up no other, and drops one that fails.

Example:
    meeting = meet(Gate("10.0.0.1:6170", nnodes=2, node_rank=1, nprocs=8, timeout=120))
    meeting.run, meeting.nodes[0].nprocs     # 'mnist_lenet-20261123-061500', 8
    # returns once every node arrived; NodesMissing after 120 s otherwise
"""

from __future__ import annotations

import json
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Tuple

from ..security import auth, kvserver, tls
from ..errors import UserError
from ..runs.topology import Meeting, Node

VERSION = 2
MAX_FRAME = 4096          # bytes of JSON in one message; a longer one is refused unread
MAX_NAME = 200            # characters of a host name or run name in a message
HELLO_S = 5.0             # a connection must announce its node within this, or it is dropped
RETRY_S = 0.2             # a node retries connecting to node 0 this often
POLL_S = 0.25             # longest wait in a select or recv (signals are handled in between)
LENGTH = struct.Struct(">I")
CHECK = ("check that every machine has the same dist.nnodes and dist.master, reaches node 0 at "
         "that port, and did not fail at start (dist.rendezvous_timeout sets this limit)")


@dataclass(frozen=True)
class Gate:
    """Where and how long the nodes of a launch wait for each other (from `dist.*`)."""
    master: str               # node 0's host:port
    nnodes: int
    node_rank: int
    nprocs: int               # ranks on this node
    timeout: float            # seconds; 0 = for ever
    run: str = ""             # node 0: the name of its run directory, told to the others
    host: str = ""            # this machine's host name, told to node 0 ("": the system's)
    token_file: str = ""      # dist.token_file: only machines that prove its token meet (auth.py)
    tls_ca: str = ""          # dist.tls_*: meet over mutual TLS with certificates of this CA (tls.py)
    tls_cert: str = ""
    tls_key: str = ""


def plain_name(text) -> bool:
    """Whether `text` may name a directory inside output.root: a short string that is no
    path (no "/", NUL, "." or "..").

    Example:
        plain_name("mnist_lenet-20261123-061500"), plain_name("../etc")   # True, False
    """
    return (isinstance(text, str) and 0 < len(text) <= MAX_NAME and "/" not in text
            and "\0" not in text and text not in (".", ".."))


class NodesMissing(Exception):
    """Not every node arrived in time; the message is the one line to print (exit 3)."""


class ProtocolError(Exception):
    """A peer sent something that is not a frame of this protocol."""


@dataclass
class Frames:
    """Bytes in, messages out: cuts a stream into frames, refusing any over MAX_FRAME."""
    buffer: bytes = b""

    def feed(self, data: bytes) -> List[dict]:
        self.buffer += data
        out = []
        while len(self.buffer) >= LENGTH.size:
            (size,) = LENGTH.unpack_from(self.buffer)
            if size > MAX_FRAME:
                raise ProtocolError(f"a frame of {size} bytes (at most {MAX_FRAME})")
            if len(self.buffer) < LENGTH.size + size:
                break
            body, self.buffer = self.buffer[LENGTH.size:LENGTH.size + size], self.buffer[LENGTH.size + size:]
            out.append(decode(body))
        return out


def encode(message: dict) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ValueError(f"message of {len(body)} bytes exceeds {MAX_FRAME}")
    return LENGTH.pack(len(body)) + body


def decode(body: bytes) -> dict:
    try:
        message = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ProtocolError(f"not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a JSON object")
    return message


def meet(gate: Gate) -> Meeting:
    """Return what the machines learnt once every node of `gate` arrived; raise
    NodesMissing when they did not within `gate.timeout`, a UserError when this node's
    settings are refused."""
    gate = gate if gate.host else replace(gate, host=socket.gethostname()[:MAX_NAME])
    token = auth.read_token(gate.token_file) if gate.token_file else b""
    files = tls.configured(gate.tls_ca, gate.tls_cert, gate.tls_key)
    if gate.nnodes <= 1:
        return Meeting(gate.run, {0: Node(gate.nprocs, _split(gate.master)[0] if gate.master else "",
                                          gate.host)})
    if gate.node_rank == 0:
        return _Host(gate, token, tls.server_context(files) if files else None).serve()
    return _join(gate, token, tls.Client(files, gate.master) if files else None)


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout if timeout > 0 else float("inf")


def _split(master: str) -> Tuple[str, int]:
    host, _, port = master.rpartition(":")
    return host.strip("[]"), int(port)


# ------------------------------------------------------------------ node 0
@dataclass
class _Peer:
    sock: socket.socket
    address: str
    since: float
    frames: Frames = field(default_factory=Frames)
    node_rank: Optional[int] = None
    hello: Optional[dict] = None       # with a token: its announcement, while its proof is awaited
    challenge: str = ""                # node 0's nonce for it
    handshake: Optional[tls.Accepting] = None   # with TLS: until its handshake is done


class _Host:
    """Node 0: listen at dist.master, collect the other nodes, then tell them to go."""

    def __init__(self, gate: Gate, token: bytes = b"", context=None):
        self.gate, self.token, self.context = gate, token, context     # context: tls.server_context
        self.arrived: Dict[int, Tuple[int, str]] = {0: (gate.nprocs, _split(gate.master)[0])}
        self.hosts: Dict[int, str] = {0: gate.host}
        self.peers: Dict[socket.socket, _Peer] = {}
        self.selector = selectors.DefaultSelector()

    def serve(self) -> Meeting:
        listener = _listen(self.gate.master)
        self.selector.register(listener, selectors.EVENT_READ)
        deadline = _deadline(self.gate.timeout)
        try:
            while len(self.arrived) < self.gate.nnodes:
                now = time.monotonic()
                if now >= deadline:
                    self._give_up()
                for key, _ in self.selector.select(min(POLL_S, deadline - now)):
                    if key.fileobj is listener:
                        self._accept(listener)
                    elif key.fileobj in self.peers:     # not dropped by an earlier event
                        self._read(self.peers[key.fileobj])
                self._drop_silent(time.monotonic())
            # Serve Paddle's rendezvous on the same listener before saying go: the others'
            # Paddle launchers find it there, and no other process can take the port between.
            self.selector.unregister(listener)
            nodes = {r: Node(p, a, self.hosts.get(r, "")) for r, (p, a) in sorted(self.arrived.items())}
            server, listener = kvserver.KVServer(listener, nodes).start(), None
            try:
                self._tell_all({"go": True, **({"run": self.gate.run} if self.gate.run else {})})
            except BaseException:
                server.close()
                raise
            return Meeting(self.gate.run, nodes, 0, rendezvous=server)
        finally:
            if listener is not None:
                listener.close()
            for sock in list(self.peers):
                self._close(sock)
            self.selector.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, (address, _) = listener.accept()
        except OSError:
            return
        if len(self.peers) >= 4 * self.gate.nnodes + 16:     # a flood: make room, never for long
            waiting = [p for p in self.peers.values() if p.node_rank is None]
            if not waiting:
                sock.close()
                return
            self._forget(min(waiting, key=lambda p: p.since))  # the oldest not admitted

        sock.setblocking(False)
        shake = tls.Accepting(self.context, sock) if self.context else None
        self.peers[sock] = _Peer(sock, address, time.monotonic(), handshake=shake)
        self.selector.register(sock, selectors.EVENT_READ)

    def _read(self, peer: _Peer) -> None:
        if peer.handshake is not None:
            self._shake(peer)
            return
        try:
            # One frame a recv: a machine sends each frame as one TLS record, which one
            # recv of this size returns whole.
            data = peer.sock.recv(MAX_FRAME + LENGTH.size)
            messages = peer.frames.feed(data) if data else None
        except tls.WANT:                       # a TLS record that carried no data
            return
        except (OSError, ProtocolError):
            messages = None
        if messages is None:                   # gone, or not speaking this protocol
            self._forget(peer)
            return
        for message in messages:
            if peer.node_rank is not None:      # nothing more is expected from a node
                continue
            if self.token and peer.hello is None:
                error = self._refusal(message) or self._challenge(peer, message)
            elif self.token:
                error = self._proven(peer, message)
                message = peer.hello
                error = error or self._refusal(message)      # the rank may have come meanwhile
            else:
                error = self._refusal(message)
            if error:
                self._send(peer, {"error": error})
                self._forget(peer)
                return
            if self.token and not peer.challenge.startswith("proven"):
                continue
            peer.node_rank = message["node_rank"]
            self.arrived[peer.node_rank] = (message["nprocs"], peer.address)
            self.hosts[peer.node_rank] = message.get("host", "")
            self._tell_all({"arrived": self._arrived()})

    def _refusal(self, m: dict) -> str:
        """Why an announcement is refused ("" when it is accepted)."""
        fields = ("v", "node_rank", "nnodes", "nprocs")
        if not all(isinstance(m.get(k), int) and not isinstance(m.get(k), bool) for k in fields):
            return ("node 0 expects v, node_rank, nnodes and nprocs as integers; run the same "
                    "paddle_dist version on every machine")
        if m["v"] != VERSION:
            return (f"node 0 speaks version {VERSION} of the node rendezvous, this node {m['v']}; "
                    "run the same paddle_dist version on every machine")
        if m["nnodes"] != self.gate.nnodes:
            return (f"node 0 has dist.nnodes={self.gate.nnodes}, this node dist.nnodes={m['nnodes']}; "
                    "give every machine the same dist.nnodes")
        rank = m["node_rank"]
        if not 0 < rank < self.gate.nnodes:
            return (f"dist.node_rank={rank} is not in 1..{self.gate.nnodes - 1}; number the other "
                    "machines 1 .. nnodes-1")
        if rank in self.arrived:
            return (f"dist.node_rank={rank} already arrived from {self.arrived[rank][1]}; "
                    "give each machine its own dist.node_rank")
        if m["nprocs"] < 1:
            return f"nprocs={m['nprocs']} must be >= 1"
        if not isinstance(m.get("host", ""), str) or len(m.get("host", "")) > MAX_NAME:
            return f"the host name must be a string of at most {MAX_NAME} characters"
        return ""

    def _challenge(self, peer: _Peer, hello: dict) -> str:
        """Answer an announcement with node 0's nonce and its proof of the token; "" once
        sent (the node's proof comes next), else why the node is refused."""
        if not auth.good_nonce(hello.get("nonce")):
            return "node 0 admits only machines with the job's dist.token_file; give this machine the same file"
        peer.hello, peer.challenge = hello, auth.nonce()
        self._send(peer, {"challenge": peer.challenge, "proof": auth.proof(
            self.token, "server", job_id(self.gate), hello["node_rank"], hello["nonce"], peer.challenge)})
        return ""

    def _proven(self, peer: _Peer, message: dict) -> str:
        """Check a node's proof of the token against this connection's nonces."""
        hello = peer.hello
        expected = auth.proof(self.token, "client", job_id(self.gate), hello["node_rank"],
                              peer.challenge, hello["nonce"])
        if not auth.matches(expected, message.get("proof")):
            return "wrong job token: this machine's dist.token_file is not node 0's"
        peer.challenge = "proven"
        return ""

    def _shake(self, peer: _Peer) -> None:
        """Take the next step of a connection's TLS handshake, waiting for nothing; the
        socket changes to its TLS wrapper on the way, so it is watched anew."""
        self.selector.unregister(peer.sock)
        self.peers.pop(peer.sock)
        state = peer.handshake.step()
        peer.sock = peer.handshake.sock
        self.peers[peer.sock] = peer
        self.selector.register(peer.sock, selectors.EVENT_WRITE if state == "write" else selectors.EVENT_READ)
        if state == "plaintext":
            self._send(peer, {"error": tls.PLAINTEXT})
        if state in ("plaintext", "failed"):
            self._forget(peer)
        elif state == "done":
            peer.handshake = None

    def _drop_silent(self, now: float) -> None:
        for peer in list(self.peers.values()):
            if peer.node_rank is None and now - peer.since > HELLO_S:
                self._forget(peer)

    def _forget(self, peer: _Peer) -> None:
        self._close(peer.sock)
        if peer.node_rank is not None and self.arrived.pop(peer.node_rank, None):
            self._tell_all({"arrived": self._arrived()})

    def _close(self, sock: socket.socket) -> None:
        self.peers.pop(sock, None)
        try:
            self.selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()

    def _arrived(self) -> Dict[str, list]:
        return {str(r): list(v) for r, v in sorted(self.arrived.items())}

    def _tell_all(self, message: dict) -> None:
        for peer in list(self.peers.values()):
            if peer.node_rank is not None:
                self._send(peer, message)

    def _send(self, peer: _Peer, message: dict) -> None:
        try:
            peer.sock.setblocking(True)
            peer.sock.settimeout(POLL_S)        # a peer that reads nothing cannot stall node 0
            peer.sock.sendall(encode(message))
        except OSError:
            pass
        finally:
            try:
                peer.sock.setblocking(False)
            except OSError:
                pass

    def _give_up(self) -> None:
        missing = [r for r in range(self.gate.nnodes) if r not in self.arrived]
        self._tell_all({"missing": missing, "arrived": self._arrived()})
        raise NodesMissing(missing_line(self.gate, self._arrived(), missing))


def _listen(master: str) -> socket.socket:
    host, port = _split(master)
    try:
        address = socket.gethostbyname(host)
    except OSError as e:
        raise UserError(f"cannot resolve dist.master host {host!r} ({e}); set dist.master to "
                        "node 0's IP address, e.g. 10.0.0.1:6170") from None
    if address == "0.0.0.0":
        raise UserError(f"dist.master {master} would have node 0 listen on every interface, and the "
                        "other machines cannot reach 0.0.0.0; give node 0's own address, e.g. 10.0.0.1:6170")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # One address, the one the other machines reach, never every interface.
    # As Paddle's rendezvous server does: a connection of a previous attempt in TIME_WAIT
    # must not keep the port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(64)
    except OSError as e:
        sock.close()
        raise UserError(f"node 0 cannot listen at dist.master {master} ({e.strerror}); node 0 "
                        "must run on the machine of dist.master, with its port free: start "
                        "node 0 there, or choose another port with -o dist.master=HOST:PORT") from None
    sock.setblocking(False)
    return sock


# ------------------------------------------------------------------ the other nodes
def _join(gate: Gate, token: bytes = b"", client: Optional[tls.Client] = None) -> Meeting:
    """Connect to node 0 (again, if it goes away) until it says go or the deadline passes."""
    deadline = _deadline(gate.timeout)
    host, port = _split(gate.master)
    seen: Optional[Dict[str, list]] = None          # node 0's last list of arrived nodes
    answered = False
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=min(2.0, deadline - time.monotonic()))
        except OSError:
            time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
            continue
        answered = True
        if client is not None:
            sock = client.wrap(sock)
            if sock is None:                        # the handshake did not finish: again
                time.sleep(min(RETRY_S, max(0.0, deadline - time.monotonic())))
                continue
        with sock:
            verdict, seen = _talk(sock, gate, deadline, seen, token)
        if verdict is not None:
            if "go" in verdict:
                return Meeting(verdict.get("run", ""), {int(r): Node(v[0], v[1])
                                                         for r, v in (seen or {}).items()},
                               gate.node_rank)
            if "error" in verdict:
                raise UserError(f"node 0 at {gate.master} refused this node: {verdict['error']}")
            raise NodesMissing(missing_line(gate, verdict.get("arrived") or seen or {},
                                            verdict.get("missing") or []))
    raise NodesMissing(_no_answer(gate, answered, seen))


def _talk(sock: socket.socket, gate: Gate, deadline: float, seen: Optional[Dict[str, list]],
          token: bytes = b"") -> Tuple[Optional[dict], Optional[Dict[str, list]]]:
    """Announce this node and read node 0's messages: (its verdict or None if the
    connection ended first, the last list of arrived nodes). With a token, node 0 must
    prove it before this node proves it in turn (a UserError when node 0 cannot)."""
    frames, mine, proven = Frames(), auth.nonce(), False
    try:
        sock.settimeout(POLL_S)
        sock.sendall(encode({"v": VERSION, "node_rank": gate.node_rank, "nnodes": gate.nnodes,
                             "nprocs": gate.nprocs, "host": gate.host[:MAX_NAME], "nonce": mine}))
        while time.monotonic() < deadline:
            try:
                data = sock.recv(MAX_FRAME + LENGTH.size)
            except socket.timeout:
                continue
            if not data:
                return None, seen
            for message in frames.feed(data):
                if not _arrived_list(message.get("arrived", {})):
                    raise ProtocolError("a list of arrived nodes that is not one")
                if "run" in message and not plain_name(message["run"]):
                    raise ProtocolError("a run name that is not a plain name")
                if "challenge" in message:
                    sock.sendall(encode({"proof": _answer(gate, token, mine, message)}))
                    proven = True
                elif token and not proven and ("arrived" in message or "go" in message):
                    raise UserError(f"paddle_dist: node 0 at {gate.master} runs without the job token "
                                    "that this machine has (dist.token_file); give node 0 the same file")
                elif "arrived" in message and len(message) == 1:
                    seen = message["arrived"]
                else:
                    return message, seen
    except (OSError, ProtocolError) as e:
        refused = tls.refusal(e, gate.master, gate.tls_cert)   # node 0's TLS alert, if any
        if refused:
            raise UserError(refused) from None
    return None, seen


def _answer(gate: Gate, token: bytes, mine: str, challenge: dict) -> str:
    """This node's proof of the token, once node 0 has proven it holds it too."""
    if not token:
        raise UserError(f"paddle_dist: node 0 at {gate.master} admits only machines with the job's "
                        "dist.token_file; give this machine the same file")
    theirs = challenge.get("challenge")
    expected = auth.proof(token, "server", job_id(gate), gate.node_rank, mine, theirs)
    if not auth.good_nonce(theirs) or not auth.matches(expected, challenge.get("proof")):
        raise UserError(f"paddle_dist: wrong job token: node 0 at {gate.master} did not prove this "
                        "machine's, so their dist.token_file differ; give every machine the same file")
    return auth.proof(token, "client", job_id(gate), gate.node_rank, theirs, mine)


def job_id(gate: Gate) -> str:
    """What the proofs are bound to: node 0's address and the number of machines."""
    return f"{gate.master}/{gate.nnodes}"


def _arrived_list(value) -> bool:
    """Whether `value` is node 0's {"node_rank": [nprocs, "host"], ...}."""
    return isinstance(value, dict) and all(
        k.isdigit() and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
        and isinstance(v[1], str) for k, v in value.items())


def _no_answer(gate: Gate, answered: bool, seen: Optional[Dict[str, list]]) -> str:
    if seen is not None:
        missing = [r for r in range(gate.nnodes) if str(r) not in seen]
        return missing_line(gate, seen, missing)
    if answered:
        return (f"paddle_dist: something answers at dist.master {gate.master}, but not node 0 of "
                f"this job (a job already running there?), within {gate.timeout:g} s; stop it or "
                "choose another port for every machine with -o dist.master=HOST:PORT")
    return (f"paddle_dist: node 0 did not answer at dist.master {gate.master} within "
            f"{gate.timeout:g} s (node_rank 0 missing); start node 0 there; {CHECK}")


def missing_line(gate: Gate, arrived: Dict[str, list], missing: List[int]) -> str:
    """The one line that ends a job whose nodes did not all arrive.

    Example:
        missing_line(Gate("10.0.0.1:6170", 3, 0, 8, 120), {"0": [8, "10.0.0.1"]}, [1, 2])
        # 'paddle_dist: 1 of 3 nodes (8 ranks: node_rank 0 from 10.0.0.1) arrived within 120 s
        #  at dist.master 10.0.0.1:6170; missing node_rank 1, 2; start them with ...'
    """
    ranks = sum(v[0] for v in arrived.values())
    hosts = ", ".join(f"node_rank {r} from {v[1]}"
                      for r, v in sorted(arrived.items(), key=lambda kv: int(kv[0])))
    wait = f"{gate.timeout:g} s" if gate.timeout > 0 else "the wait"
    return (f"paddle_dist: {len(arrived)} of {gate.nnodes} nodes ({ranks} rank{'s' * (ranks != 1)}: "
            f"{hosts}) arrived within {wait} at dist.master {gate.master}; missing node_rank "
            f"{', '.join(map(str, missing)) or '?'}; start {'them' if len(missing) > 1 else 'it'} "
            f"with the command node 0 printed; {CHECK}")
