"""Node 0 of the machines' meeting (rendezvous.py): it listens at dist.master, admits the
other nodes one connection at a time in a select() loop (with a job token, after their
proof; with TLS, a handshake step at a time), tells every node who has arrived, and once
all have, serves Paddle's launchers' rendezvous on the same listener (kvserver.py) and
says go. A connection that is not admitted within HELLO_S seconds, or speaks anything but
the protocol's frames, is dropped.

Node 0 keeps its listener for the whole job (KeptListener): each attempt's meeting, and
Paddle's rendezvous after it, take the same socket in turn, so no other process can take
the port between the attempts of an elastic job.

Example:
    with KeptListener("10.0.0.1:6170") as kept:
        meeting = MeetingHost(MeetingPlace("10.0.0.1:6170", 2, 0, 8, 120), kept=kept).serve()
        meeting.rendezvous.close()      # once the attempt has ended; the port stays node 0's
"""

from __future__ import annotations

import dataclasses
import errno
import selectors
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .. import procfs
from ..errors import UserError
from ..runs.topology import Meeting, Node
from ..security import auth, kvserver, tls
from .wire import (LENGTH, MAX_FRAME, MAX_NAME, POLL_S, VERSION, Frames, MeetingPlace, NodesMissing,
                   ProtocolError, deadline_after, encode, job_id, missing_line, other_job, split_master)

HELLO_S = 5.0             # a connection must announce its node within this, or it is dropped


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


class MeetingHost:
    """Node 0: listen at dist.master, collect the other nodes, then tell them to go."""

    def __init__(self, place: MeetingPlace, token: bytes = b"", context=None,
                 kept: Optional["KeptListener"] = None):
        self.place, self.token, self.context = place, token, context     # context: tls.server_context
        self.kept = kept            # the job's listener, kept across attempts (None: this meeting's own)
        self.arrived: Dict[int, Tuple[int, str]] = {0: (place.nprocs, split_master(place.master)[0])}
        self.hosts: Dict[int, str] = {0: place.host}
        self.peers: Dict[socket.socket, _Peer] = {}
        self.dropped: set = set()          # node_ranks whose connection a flood pushed out (said once)
        self.selector = selectors.DefaultSelector()

    def serve(self) -> Meeting:
        listener = self.kept.socket() if self.kept else listen(self.place.master)
        self.selector.register(listener, selectors.EVENT_READ)
        deadline = deadline_after(self.place.timeout)
        last_call = None       # elastic: when the wait for the machines beyond the fewest ends
        try:
            while len(self.arrived) < self.place.nnodes:
                now = time.monotonic()
                enough = self.place.enough(len(self.arrived))
                last_call = (last_call or now + self.place.last_call) if enough else None
                if enough and now >= min(last_call, deadline):
                    break
                if now >= deadline:
                    self._give_up()
                for key, _ in self.selector.select(min(POLL_S, deadline - now, (last_call or now + POLL_S) - now)):
                    if key.fileobj is listener:
                        self._accept(listener)
                    elif key.fileobj in self.peers:     # not dropped by an earlier event
                        self._read(self.peers[key.fileobj])
                self._drop_silent(time.monotonic())
            # Serve Paddle's rendezvous on the same listener before saying go: the others'
            # Paddle launchers find it there, and no other process can take the port between.
            self.selector.unregister(listener)
            met = Meeting.of(self.place.run, {r: Node(p, a, self.hosts.get(r, "")) for r, (p, a)
                                              in self.arrived.items()}, self.place.nnodes)
            server = kvserver.KVServer(listener, met.nodes, keep_listener=self.kept is not None).start()
            listener = None
            try:
                self._tell_all({"go": True, **({"run": self.place.run} if self.place.run else {})})
            except BaseException:
                server.close()
                raise
            return dataclasses.replace(met, rendezvous=server)
        finally:
            if listener is not None and self.kept is None:
                listener.close()
            for sock in list(self.peers):
                self._close(sock)
            self.selector.close()

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, (address, _) = listener.accept()
        except OSError:
            return
        if len(self.peers) >= 4 * self.place.nnodes + 16:     # a flood: make room, never for long
            waiting = [p for p in self.peers.values() if p.node_rank is None]
            if not waiting:
                sock.close()
                return
            # The oldest of those that said nothing yet, else the oldest not admitted, which
            # may be a machine of the job in the middle of its proof: that one is said.
            victim = min(waiting, key=lambda p: (p.hello is not None, p.since))
            if victim.hello is not None:
                self._say_dropped(victim)
            self._forget(victim)

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
                # the rank may have come meanwhile
                error = error or self._refusal(message) or self._other_job(message)
            else:
                error = self._refusal(message) or self._other_job(message)
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
        if m["nnodes"] != self.place.nnodes:
            return (f"node 0 has dist.nnodes={self.place.nnodes}, this node dist.nnodes={m['nnodes']}; "
                    "give every machine the same dist.nnodes")
        rank = m["node_rank"]
        if not 0 < rank < self.place.nnodes:
            return (f"dist.node_rank={rank} is not in 1..{self.place.nnodes - 1}; number the other "
                    "machines 1 .. nnodes-1")
        if rank in self.arrived:
            return (f"dist.node_rank={rank} already arrived from {self.arrived[rank][1]}; "
                    "give each machine its own dist.node_rank")
        if m["nprocs"] < 1:
            return f"nprocs={m['nprocs']} must be >= 1"
        if not isinstance(m.get("host", ""), str) or len(m.get("host", "")) > MAX_NAME:
            return f"the host name must be a string of at most {MAX_NAME} characters"
        return ""

    def _other_job(self, m: dict) -> str:
        """Why a machine is of another job (wire.other_job): asked only once it has proven
        the token, so that the names of the keys that differ are told to no outsider."""
        why = other_job(self.place, m.get("config"), m.get("keys"))
        return f"this machine belongs to another job than node 0's: {why}" if why else ""

    def _challenge(self, peer: _Peer, hello: dict) -> str:
        """Answer an announcement with node 0's nonce and its proof of the token; "" once
        sent (the node's proof comes next), else why the node is refused."""
        if not auth.good_nonce(hello.get("nonce")):
            return "node 0 admits only machines with the job's dist.token_file; give this machine the same file"
        peer.hello, peer.challenge = hello, auth.nonce()
        self._send(peer, {"challenge": peer.challenge, "proof": auth.proof(
            self.token, "server", job_id(self.place), hello["node_rank"], hello["nonce"], peer.challenge)})
        return ""

    def _proven(self, peer: _Peer, message: dict) -> str:
        """Check a node's proof of the token against this connection's nonces."""
        hello = peer.hello
        expected = auth.proof(self.token, "client", job_id(self.place), hello["node_rank"],
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

    def _say_dropped(self, peer: _Peer) -> None:
        """One line (once per node_rank) for an announced machine dropped to make room."""
        rank = peer.hello.get("node_rank")
        if rank in self.dropped:
            return
        self.dropped.add(rank)
        print(f"paddle_dist: node 0 dropped the connection of node_rank {rank} from {peer.address} before it "
              f"proved the job token, to make room: {len(self.peers)} connections wait at dist.master "
              f"{self.place.master}, more than {self.place.nnodes} machines make (a connection flood?); "
              "that machine connects again until the meeting's deadline", file=sys.stderr, flush=True)

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
        missing = [r for r in range(self.place.nnodes) if r not in self.arrived]
        self._tell_all({"missing": missing, "arrived": self._arrived()})
        raise NodesMissing(missing_line(self.place, self._arrived(), missing))


class KeptListener:
    """Node 0's listener at dist.master for the whole job, made at its first meeting: every
    attempt's meeting, and Paddle's rendezvous after it, serve on this one socket. Closed
    and listened again between attempts, the port would be free for a moment, and any
    local user who bound it then would end an elastic job (issue 53, finding 7).

    Example:
        with KeptListener("10.0.0.1:6170") as kept:
            for attempt in range(3):
                MeetingHost(place, kept=kept).serve()      # the same socket every time
    """

    def __init__(self, master: str):
        self.master = master
        self._sock: Optional[socket.socket] = None

    def socket(self) -> socket.socket:
        if self._sock is None:
            self._sock = listen(self.master)
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> "KeptListener":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def listen(master: str) -> socket.socket:
    """A listener at dist.master's address alone (a UserError saying how to fix it when
    node 0 cannot listen there, naming the process that holds the port when it can see it)."""
    host, port = split_master(master)
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
        raise UserError(f"node 0 cannot listen at dist.master {master} ({e.strerror}{_holder(port, e)}); "
                        "node 0 must run on the machine of dist.master, with its port free: start "
                        "node 0 there, or choose another port with -o dist.master=HOST:PORT") from None
    sock.setblocking(False)
    return sock


def _holder(port: int, error: OSError) -> str:
    """", held by pid 1234 (python probe.py)" for a port another process listens on."""
    if error.errno != errno.EADDRINUSE:
        return ""
    holder = procfs.port_holder(port)
    if holder is None:
        return ", held by a process this user cannot see (another user's?)"
    return f", held by pid {holder[0]} ({holder[1][:80]})"
