"""A client for Paddle's TCP store (`paddle.base.core.TCPStore`) that speaks its wire
protocol from Python, with every wait bounded.

Rank 0 of a Paddle process group runs the store's server; it authenticates nobody and
listens on every interface. The ranks' attestation (attest.py) talks to it through this
client: Paddle's own client waits without a limit for a key, and its requests, sent in
pieces without TCP_NODELAY, take about 40 ms each (Nagle's algorithm against delayed
ACKs), where this client's take well under one. Tests use it to act as an outsider on
the store's port.

The protocol (paddle/phi/core/distributed/store/tcp_store.cc, tcp_store_libuv.cc,
tcp_utils.h) is the same for both servers: the poll loop of Paddle 2.6 (3.x with
FLAGS_tcp_store_using_libuv=0) and the libuv one, 3.x's default. Every integer is in the
machine's byte order (little-endian on x86-64 and arm64).

    request   = command:int32  key  [argument]
    key       = length:uint64  bytes        (Paddle's own client prepends "/" to every key)
    ADD   0   argument increment:int64      reply new value:int64
    GET   1   no argument                   reply length:uint64 + bytes
    CHECK 2   no argument                   reply int32: READY 2 or NOT_READY 3
    SET   3   argument length:uint64 + bytes, no reply
    WAIT  4   no argument                   reply int32 STOP_WAIT 1 once the key exists
    STOP  5   not served: the poll loop skips the 4 bytes (and reads what follows as the next
              command), the libuv server closes the connection; so does any other number

A value written by ADD is the decimal text of the counter, so GET returns b"3" after adds
summing to 3. Every TCPStore of world size > 0 (the master included) ADDs 1 to "init/" in its
constructor, and the master's constructor waits until that counter is at least its world size.

Example:
    from paddle_dist.security import storewire
    storewire.add("127.0.0.1", 6170, "init/", 0)            # how many stores joined: 2
    storewire.set_value("127.0.0.1", 6170, "k", b"v")
    storewire.get("127.0.0.1", 6170, "k", timeout=5)        # b"v"
    with storewire.Connection("127.0.0.1", 6170) as conn:   # several requests, one socket
        conn.add("n", 1), conn.check("n")                   # (1, True)
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Optional

ADD, GET, CHECK, SET, WAIT, STOP = range(6)
WAITING, STOP_WAIT, READY, NOT_READY = range(4)

PREFIX = "/"          # what Paddle's client puts before each key it sends
JOIN_KEY = "init/"    # the join counter, as Paddle's API names it ("/init/" on the wire)


def frame(command: int, key: Optional[str] = None, prefix: str = PREFIX) -> bytes:
    """The bytes of a request's command and key (its argument, if any, follows)."""
    out = struct.pack("=i", command)
    if key is not None:
        data = (prefix + key).encode()
        out += struct.pack("=Q", len(data)) + data
    return out


def blob(value: bytes) -> bytes:
    """A length-prefixed byte string: SET's argument, GET's reply."""
    return struct.pack("=Q", len(value)) + bytes(value)


class Connection:
    """One TCP connection to a store; every receive is bounded by `timeout` seconds
    (socket.timeout, a TimeoutError, when it passes), and all of them together by
    `deadline` (time.monotonic()) when given. `prefix` is put before each key, "/" as
    Paddle's own client does; "" addresses keys no Paddle client can reach."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, prefix: str = PREFIX,
                 deadline: Optional[float] = None):
        self.prefix, self.deadline = prefix, deadline
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        """Send raw bytes (a well-formed request or not)."""
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        """Exactly `n` bytes; ConnectionError when the store closes the connection first."""
        buf = bytearray()
        while len(buf) < n:
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("deadline passed")
                self.sock.settimeout(left)
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"store closed the connection after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def _int(self, fmt: str) -> int:
        return struct.unpack(fmt, self.recv_exact(struct.calcsize(fmt)))[0]

    def add(self, key: str, n: int) -> int:
        """Add `n` to the counter `key` (created at 0, so n=0 creates it); returns its new value.
        The store closes the connection when the value there is not a decimal integer."""
        self.send(frame(ADD, key, self.prefix) + struct.pack("=q", n))
        return self._int("=q")

    def set(self, key: str, value: bytes) -> None:
        """Store `value` under `key`. No reply: a later request on this connection is served after it."""
        self.send(frame(SET, key, self.prefix) + blob(value))

    def check(self, key: str) -> bool:
        """Whether `key` exists."""
        self.send(frame(CHECK, key, self.prefix))
        return self._int("=i") == READY

    def wait(self, key: str) -> None:
        """Block until `key` exists (TimeoutError after the connection's timeout)."""
        self.send(frame(WAIT, key, self.prefix))
        reply = self._int("=i")
        if reply != STOP_WAIT:
            raise ConnectionError(f"unexpected reply {reply} to WAIT")

    def get_now(self, key: str) -> bytes:
        """GET without waiting: the 2.6 server drops the connection when the key is
        missing, the libuv one answers b""."""
        self.send(frame(GET, key, self.prefix))
        return self.recv_exact(self._int("=Q"))

    def get(self, key: str) -> bytes:
        """The value of `key`, waiting for it to exist as Paddle's client does (WAIT then GET)."""
        self.wait(key)
        return self.get_now(key)


def add(host: str, port: int, key: str, n: int, timeout: float = 10.0) -> int:
    """ADD `n` to `key` on a new connection; the counter's new value."""
    with Connection(host, port, timeout) as conn:
        return conn.add(key, n)


def set_value(host: str, port: int, key: str, value: bytes, timeout: float = 10.0) -> None:
    """SET `key` to `value`; returns once the store has applied it (a CHECK follows on the
    same connection, and the store serves a connection's requests in order)."""
    with Connection(host, port, timeout) as conn:
        conn.set(key, value)
        conn.check(key)


def get(host: str, port: int, key: str, timeout: float = 10.0) -> bytes:
    """The value of `key`, waiting at most `timeout` seconds for it to exist (TimeoutError)."""
    with Connection(host, port, timeout) as conn:
        return conn.get(key)


def check(host: str, port: int, key: str, timeout: float = 10.0) -> bool:
    """Whether `key` exists."""
    with Connection(host, port, timeout) as conn:
        return conn.check(key)
