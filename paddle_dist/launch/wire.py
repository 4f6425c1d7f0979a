"""What both sides of the machines' meeting share (rendezvous.py: meet() and the other
nodes; host.py: node 0): where they meet (MeetingPlace), the frames on the wire, and the
one line that says which nodes are missing. The protocol itself is described in
rendezvous.py.

Example:
    encode({"go": True})                     # b'\x00\x00\x00\x0b{"go":true}'
    Frames().feed(encode({"go": True}))      # [{'go': True}]
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from typing import Dict, List, Tuple

VERSION = 3
MAX_FRAME = 4096          # bytes of JSON in one message; a longer one is refused unread
MAX_NAME = 200            # characters of a host name or run name in a message
POLL_S = 0.25             # longest wait in a select or recv (signals are handled in between)
LENGTH = struct.Struct(">I")
CHECK = ("check that every machine has the same dist.nnodes and dist.master, reaches node 0 at "
         "that port, and did not fail at start (dist.rendezvous_timeout sets this limit)")


@dataclass(frozen=True)
class MeetingPlace:
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
    min_nodes: int = 0        # elastic (dist.min_nnodes): this many may go on without the others,
    last_call: float = 30.0   # this many seconds after they met; 0 = not elastic: all must meet
    config: str = ""          # the job's config.config_hash: node 0 refuses a machine of another job
    config_keys: Tuple[Tuple[str, str], ...] = ()   # config.key_digests: which key differs, by name

    def enough(self, arrived: int) -> bool:
        """Whether `arrived` machines may go on without the others (elastic)."""
        return 0 < self.min_nodes <= arrived


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


def packed_keys(place: MeetingPlace) -> str:
    """The digests of the config's keys, in key order, as one string (the names are the
    same on every machine of one paddle_dist version, so they need not travel)."""
    return "".join(digest for _, digest in place.config_keys)


def other_job(place: MeetingPlace, config, keys) -> str:
    """Why a machine whose config hashes to `config` (its digests of each key: `keys`,
    packed_keys) belongs to another job than `place`'s ("" when it does not).

    Example:
        other_job(node0_place, "0f3e...", "9c1e4b...")
        # "its config is not node 0's: train.lr differs (and 1 more key); give every machine the same -c and -o"
    """
    if not place.config or config == place.config:
        return ""
    fix = "give every machine the same -c and -o"
    size = len(place.config_keys) * 6
    if not isinstance(keys, str) or len(keys) != size:
        return f"its config is not node 0's, and it names other keys (another paddle_dist version?); {fix}"
    differ = [key for i, (key, digest) in enumerate(place.config_keys) if keys[6 * i:6 * i + 6] != digest]
    if not differ:
        return f"its config is not node 0's; {fix}"
    more = f" (and {len(differ) - 1} more key{'s' * (len(differ) > 2)})" if len(differ) > 1 else ""
    return f"its config is not node 0's: {differ[0]} differs{more}; {fix}"


def job_id(place: MeetingPlace) -> str:
    """What the proofs are bound to: node 0's address and the number of machines."""
    return f"{place.master}/{place.nnodes}"


def split_master(master: str) -> Tuple[str, int]:
    """dist.master's (host, port); the brackets of an IPv6 address dropped."""
    host, _, port = master.rpartition(":")
    return host.strip("[]"), int(port)


def deadline_after(timeout: float) -> float:
    """The monotonic time `timeout` seconds from now (never, for 0)."""
    return time.monotonic() + timeout if timeout > 0 else float("inf")


def missing_line(place: MeetingPlace, arrived: Dict[str, list], missing: List[int]) -> str:
    """The one line that ends a job whose nodes did not all arrive.

    Example:
        missing_line(MeetingPlace("10.0.0.1:6170", 3, 0, 8, 120), {"0": [8, "10.0.0.1"]}, [1, 2])
        # 'paddle_dist: 1 of 3 nodes (8 ranks: node_rank 0 from 10.0.0.1) arrived within 120 s
        #  at dist.master 10.0.0.1:6170; missing node_rank 1, 2; start them with ...'
    """
    ranks = sum(v[0] for v in arrived.values())
    hosts = ", ".join(f"node_rank {r} from {v[1]}"
                      for r, v in sorted(arrived.items(), key=lambda kv: int(kv[0])))
    wait = f"{place.timeout:g} s" if place.timeout > 0 else "the wait"
    return (f"paddle_dist: {len(arrived)} of {place.nnodes} nodes ({ranks} rank{'s' * (ranks != 1)}: "
            f"{hosts}) arrived within {wait} at dist.master {place.master}; missing node_rank "
            f"{', '.join(map(str, missing)) or '?'}; start {'them' if len(missing) > 1 else 'it'} "
            f"with the command node 0 printed; {CHECK}")
