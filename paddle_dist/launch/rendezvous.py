"""The machines of a multi-node launch meet here before Paddle's launcher starts.

`python -m paddle.distributed.launch --nnodes N` holds the ranks back until every node has
joined its HTTP rendezvous, and waits for a missing node for ever: nothing of paddle_dist
runs in the ranks before then, so the ranks' own deadline cannot help. So each node's
launcher first meets the others at a small rendezvous of its own, on node 0, at the port of
`dist.master`, and gives up after `dist.rendezvous_timeout` seconds, saying which
`node_rank`s are missing. Node 0 then keeps that listener and serves Paddle's launchers'
own rendezvous on it (kvserver.py), to the machines that met alone. Node 0's side is in
host.py; the frames, MeetingPlace and what both sides say are in wire.py.

Protocol (version 3), over TCP. Every message is a frame: a 4-byte big-endian length, then
that many bytes (at most MAX_FRAME) of a UTF-8 JSON object. A node (node_rank > 0) connects
to node 0 and sends `{"v": 3, "node_rank": R, "nnodes": N, "nprocs": P, "host": "name",
"config": hash, "keys": digests}` ("host": its host name, at most MAX_NAME characters, for
node 0's reports; "config": its config's config_hash, "keys": 6 hex digits of each of its
keys, in key order: wire.packed_keys). Node 0 refuses a machine whose config is not its
own, naming the first key that differs, and only once the machine has proven the token
(it holds one): the token admits a machine of this job, not of another one of the same
user at the same master. Node 0 answers
`{"arrived": {"0": [P, "address"], ...}}` each time the set of arrived nodes changes, and at
the end `{"go": true, "run": "name"}` (every node arrived; node 0 serves Paddle's
rendezvous on its listener from now on;
"run", when node 0 has chosen its run directory already, is that directory's name, at most
MAX_NAME characters and never a path: every machine then writes under a directory of that
name, so that all of a job's records carry one name and never join another job's), or
`{"missing": [R, ...], "arrived": ...}` (its deadline passed), or `{"error": "..."}` (this
node's announcement was refused: a wrong dist.nnodes, a node_rank already there, another
version, a wrong job token, another job's config). With a job token (`dist.token_file`, auth.py) the announcement
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
    meeting = meet(MeetingPlace("10.0.0.1:6170", nnodes=2, node_rank=1, nprocs=8, timeout=120))
    meeting.run, meeting.nodes[0].nprocs     # 'mnist_lenet-20261123-061500', 8
    # returns once every node arrived; NodesMissing after 120 s otherwise
"""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Dict, Optional, Tuple

from ..errors import UserError
from ..runs.topology import Meeting, Node
from ..security import auth, credentials, tls
from .host import KeptListener, MeetingHost
from .wire import (CHECK, LENGTH, MAX_FRAME, MAX_NAME, POLL_S, VERSION, Frames, MeetingPlace, NodesMissing,
                   ProtocolError, deadline_after, encode, job_id, missing_line, packed_keys, plain_name,
                   split_master)

RETRY_S = 0.2             # a node retries connecting to node 0 this often


def meet(place: MeetingPlace, kept: Optional[KeptListener] = None) -> Meeting:
    """Return what the machines learnt once every node of `place` arrived; raise
    NodesMissing when they did not within `place.timeout`, a UserError when this node's
    settings are refused. `kept`: node 0's listener for the whole job (host.KeptListener),
    else node 0 listens for this meeting alone."""
    place = place if place.host else replace(place, host=socket.gethostname()[:MAX_NAME])
    token = credentials.token(place.token_file) if place.token_file else b""
    files = tls.configured(place.tls_ca, place.tls_cert, place.tls_key)
    server, client = credentials.contexts(files) if files else (None, None)
    if place.nnodes <= 1:
        address = split_master(place.master)[0] if place.master else ""
        return Meeting(place.run, {0: Node(place.nprocs, address, place.host)})
    if place.node_rank == 0:
        return MeetingHost(place, token, server, kept).serve()
    return _join(place, token, tls.Client(files, place.master, client) if files else None)


# ------------------------------------------------------------------ the other nodes
def _join(place: MeetingPlace, token: bytes = b"", client: Optional[tls.Client] = None) -> Meeting:
    """Connect to node 0 (again, if it goes away) until it says go or the deadline passes."""
    deadline = deadline_after(place.timeout)
    host, port = split_master(place.master)
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
            verdict, seen = _talk(sock, place, deadline, seen, token)
        if verdict is not None:
            if "go" in verdict:
                return Meeting.of(verdict.get("run", ""), {int(r): Node(v[0], v[1]) for r, v in (seen or {}).items()},
                                  place.nnodes, place.node_rank)
            if "error" in verdict:
                raise UserError(f"node 0 at {place.master} refused this node: {verdict['error']}")
            raise NodesMissing(missing_line(place, verdict.get("arrived") or seen or {},
                                            verdict.get("missing") or []))
    raise NodesMissing(_no_answer(place, answered, seen))


def _talk(sock: socket.socket, place: MeetingPlace, deadline: float, seen: Optional[Dict[str, list]],
          token: bytes = b"") -> Tuple[Optional[dict], Optional[Dict[str, list]]]:
    """Announce this node and read node 0's messages: (its verdict or None if the
    connection ended first, the last list of arrived nodes). With a token, node 0 must
    prove it before this node proves it in turn (a UserError when node 0 cannot)."""
    frames, mine, proven = Frames(), auth.nonce(), False
    try:
        sock.settimeout(POLL_S)
        sock.sendall(encode({"v": VERSION, "node_rank": place.node_rank, "nnodes": place.nnodes,
                             "nprocs": place.nprocs, "host": place.host[:MAX_NAME], "nonce": mine,
                             "config": place.config, "keys": packed_keys(place)}))
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
                    sock.sendall(encode({"proof": _answer(place, token, mine, message)}))
                    proven = True
                elif token and not proven and ("arrived" in message or "go" in message):
                    raise UserError(f"paddle_dist: node 0 at {place.master} runs without the job token "
                                    "that this machine has (dist.token_file); give node 0 the same file")
                elif "arrived" in message and len(message) == 1:
                    seen = message["arrived"]
                else:
                    return message, seen
    except (OSError, ProtocolError) as e:
        refused = tls.refusal(e, place.master, place.tls_cert)   # node 0's TLS alert, if any
        if refused:
            raise UserError(refused) from None
    return None, seen


def _answer(place: MeetingPlace, token: bytes, mine: str, challenge: dict) -> str:
    """This node's proof of the token, once node 0 has proven it holds it too."""
    if not token:
        raise UserError(f"paddle_dist: node 0 at {place.master} admits only machines with the job's "
                        "dist.token_file; give this machine the same file")
    theirs = challenge.get("challenge")
    expected = auth.proof(token, "server", job_id(place), place.node_rank, mine, theirs)
    if not auth.good_nonce(theirs) or not auth.matches(expected, challenge.get("proof")):
        raise UserError(f"paddle_dist: wrong job token: node 0 at {place.master} did not prove this "
                        "machine's, so their dist.token_file differ; give every machine the same file")
    return auth.proof(token, "client", job_id(place), place.node_rank, theirs, mine)


def _arrived_list(value) -> bool:
    """Whether `value` is node 0's {"node_rank": [nprocs, "host"], ...}."""
    return isinstance(value, dict) and all(
        k.isdigit() and isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
        and isinstance(v[1], str) for k, v in value.items())


def _no_answer(place: MeetingPlace, answered: bool, seen: Optional[Dict[str, list]]) -> str:
    if seen is not None:
        missing = [r for r in range(place.nnodes) if str(r) not in seen]
        return missing_line(place, seen, missing)
    if answered:
        return (f"paddle_dist: something answers at dist.master {place.master}, but not node 0 of "
                f"this job (a job already running there?), within {place.timeout:g} s; stop it or "
                "choose another port for every machine with -o dist.master=HOST:PORT")
    return (f"paddle_dist: node 0 did not answer at dist.master {place.master} within "
            f"{place.timeout:g} s (node_rank 0 missing); start node 0 there; {CHECK}")
