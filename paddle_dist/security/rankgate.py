"""The gate of a one-machine job: only the ranks that hold the job's token join it.

paddle_dist's launcher makes a token for each job (32 random bytes in an owner-only file
of its own, removed at the end; `dist.token_file` when given) and serves this gate on
127.0.0.1, at a port the kernel picks, before any rank starts. Each rank, before its
program runs, proves that it holds the token and checks that the gate does too
(auth.proof: fresh nonces from both sides, bound to the job, the rank and the direction).
A rank is admitted once. Only then does it learn where Paddle's TCP store will listen: a
port the gate picks at the first admission. The rank's program then replaces the
admission in the same process (exec), with the store's address in Paddle's variables, as
if it had been started with them.

The rank side runs as a plain script, before the rank's program: it imports only the
standard library and auth.py, so it adds tens of milliseconds to a rank's start, not an
import of paddle_dist.

Usage (rank side; the launcher sets the variables):
    PADDLE_DIST_GATE=127.0.0.1:40123 PADDLE_DIST_JOB=... PADDLE_DIST_TOKEN_FILE=... \\
    PADDLE_TRAINER_ID=1 PADDLE_TRAINERS_NUM=2 python -S rankgate.py python train.py ...

Example (launcher side):
    with RankGate(token, job="3f2a...", world=2) as gate:
        gate.address            # '127.0.0.1:40123'
"""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
import threading
import time

# No typing, no paddle_dist package: this runs before every rank's program (see above).
try:
    from . import auth
except ImportError:            # run as a script: auth sits beside it, and what auth imports above it
    # (its own folder is on sys.path only without Python's safe-path mode, which ranks inherit)
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0:0] = [_here, os.path.dirname(_here)]
    import auth

GATE = "PADDLE_DIST_GATE"
JOB = "PADDLE_DIST_JOB"                    # also in env.py, which a script cannot import
TOKEN_FILE = "PADDLE_DIST_TOKEN_FILE"
SCRIPT = os.path.abspath(__file__)
MAX_LINE = 1024            # one message: a JSON object on one line
ANSWER_S = 5.0             # a connection that has not proven the token by then is dropped
PENDING = 64               # connections not yet admitted; the oldest makes room for a new one
EXIT_REFUSED = 2


class Refused(Exception):
    """This rank may not join: the message says why, in one line."""


# ------------------------------------------------------------------ wire
def send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def receive(sock: socket.socket, deadline: float) -> dict:
    """One message, read before `deadline` and at most MAX_LINE bytes long; ValueError for
    anything else (too long, too late, cut short, not a JSON object)."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > MAX_LINE:
            raise ValueError("no message in time" if left <= 0 else "a message too long")
        sock.settimeout(left)
        try:
            chunk = sock.recv(MAX_LINE + 1 - len(data))
        except socket.timeout:
            raise ValueError("no message in time") from None
        if not chunk:
            raise ValueError("the connection ended")
        data += chunk
    line = data.split(b"\n", 1)[0]
    try:
        message = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not JSON") from None
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


def store_variables(rank: int, world: int, host: str, port: int) -> dict[str, str]:
    """Paddle's variables that locate rank 0's TCP store, as Paddle 3.3's launcher sets
    them on one machine. The trainer endpoints are labels that nothing binds on this path
    (see runtime/variables.paddle_variables).

    Example:
        store_variables(1, 2, "127.0.0.1", 6170)["PADDLE_CURRENT_ENDPOINT"]   # '127.0.0.1:6173'
    """
    endpoints = [f"{host}:{(port + 1 + r) % 65535 + 1}" for r in range(world)]
    return {"PADDLE_MASTER": f"{host}:{port}", "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
            "PADDLE_CURRENT_ENDPOINT": endpoints[rank]}


# ------------------------------------------------------------------ the launcher's side
class RankGate:
    """Admits each rank 0..world-1 once, to ranks proving `token` for `job`; serves on
    `host` from a thread of the launcher until closed."""

    def __init__(self, token: bytes, job: str, world: int, host: str = "127.0.0.1",
                 ports: tuple[int, int] = (0, 0)):
        self.token, self.job, self.world, self.host, self.ports = token, job, world, host, ports
        self.admitted: dict[int, float] = {}        # rank -> when
        self.refused = collections.deque(maxlen=PENDING)   # why, for the last connections refused
        self._store = ""
        self._lock = threading.Lock()
        self._pending: list[socket.socket] = []
        self._listener = socket.create_server((host, 0), backlog=128)
        self.address = f"{host}:{self._listener.getsockname()[1]}"

    def __enter__(self) -> "RankGate":
        threading.Thread(target=self._serve, name="paddle_dist-gate", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        try:        # wakes the thread blocked in accept(): close() alone would leave it listening
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            for sock in self._pending:
                _close(sock)

    def variables(self, token_file: str) -> dict[str, str]:
        """What the ranks need to pass the gate: its address, the job and the token
        file's path (never the token)."""
        return {GATE: self.address, JOB: self.job, TOKEN_FILE: token_file}

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:                          # closed: the job has ended
                return
            with self._lock:
                if len(self._pending) >= PENDING:    # a flood of silent connections
                    _close(self._pending.pop(0))
                self._pending.append(conn)
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            why = self._admit(conn)
        except (OSError, ValueError) as e:
            why = f"dropped: {e}"
        with self._lock:
            if conn in self._pending:
                self._pending.remove(conn)
            if why:
                self.refused.append(why)
        _close(conn)

    def _admit(self, conn: socket.socket) -> str:
        """Run the exchange with one connection; "" when a rank was admitted, else why not
        (also sent to the rank, when it got far enough to be told)."""
        deadline = time.monotonic() + ANSWER_S
        hello = receive(conn, deadline)
        rank, theirs = hello.get("rank"), hello.get("nonce")
        why = self._hello_problem(hello)
        if why:
            send(conn, {"error": why})
            return why
        mine = auth.nonce()
        send(conn, {"nonce": mine, "proof": auth.proof(self.token, "gate", self.job, rank, theirs, mine)})
        answer = receive(conn, deadline)
        if not auth.matches(auth.proof(self.token, "rank", self.job, rank, mine, theirs), answer.get("proof")):
            why = "wrong job token: this process does not hold the token of the job it tried to join"
            send(conn, {"error": why})
            return why
        with self._lock:
            if rank in self.admitted:
                why = f"rank {rank} has joined this job already; a rank is admitted once"
            else:
                self.admitted[rank] = time.time()
                self._store = self._store or f"{self.host}:{free_port(ports=self.ports)}"   # Paddle's store binds every address
        send(conn, {"error": why} if why else {"store": self._store})
        return why

    def _hello_problem(self, hello: dict) -> str:
        rank = hello.get("rank")
        if hello.get("job") != self.job:
            return "another job: this gate admits only the ranks of the job that made it"
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world:
            return f"rank {rank!r} is not one of this job's ranks 0..{self.world - 1}"
        if not auth.good_nonce(hello.get("nonce")):
            return "no valid nonce: not paddle_dist's admission"
        return ""


def free_port(host: str = "", ports: tuple[int, int] = (0, 0)) -> int:
    """A TCP port free at this moment on `host` ("" = every address): one in `ports`
    (low, high; variables.port_range: PORT_RANGE) when given, else the kernel's pick. A
    range below the kernel's ephemeral ports keeps a port that is free now from being
    taken by some process's outgoing connection before the store binds it."""
    low, high = ports
    if low:
        import random       # the launcher's alone: not in every rank's start (above)
        start = random.randint(low, high)
        for offset in range(high - low + 1):
            port = low + (start - low + offset) % (high - low + 1)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass


# ------------------------------------------------------------------ the rank's side
def admit(address: str, job: str, rank: int, token: bytes, timeout: float = ANSWER_S) -> str:
    """Pass the gate at `address` as `rank` of `job`; return where Paddle's store will
    listen ("host:port"). Raises Refused, in one line, when this rank may not join."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout)
    except (OSError, ValueError) as e:
        raise Refused(f"nothing answers at {address} ({e}): the job that started this rank has ended") from None
    with sock:
        mine = auth.nonce()
        send(sock, {"v": 1, "job": job, "rank": rank, "nonce": mine})
        reply = receive(sock, deadline)
        if "error" in reply:
            raise Refused(str(reply["error"])[:MAX_LINE])
        theirs = reply.get("nonce")
        if not auth.good_nonce(theirs) or not auth.matches(
                auth.proof(token, "gate", job, rank, mine, theirs), reply.get("proof")):
            raise Refused(f"the gate at {address} did not prove this job's token: it is not this job's gate")
        send(sock, {"proof": auth.proof(token, "rank", job, rank, theirs, mine)})
        reply = receive(sock, deadline)
    if "error" in reply:
        raise Refused(str(reply["error"])[:MAX_LINE])
    store = reply.get("store")
    store_host, _, store_port = str(store).rpartition(":")
    if not store_host or not store_port.isdigit():
        raise Refused(f"the gate at {address} gave no store address")
    return store


def main(argv: list[str], environ=None) -> int:
    """Pass the gate, then become `argv` (exec) with the store's variables added; only
    returns (2, after one line) when this rank was refused."""
    environ = os.environ if environ is None else environ
    rank = environ.get("PADDLE_TRAINER_ID", "?")
    address = environ.get(GATE, "")
    try:
        if not argv:
            raise Refused("no program to run after the gate")
        token = auth.read_token(environ.get(TOKEN_FILE, ""))
        store = admit(address, environ.get(JOB, ""), int(rank), token)
    except (Refused, auth.UserError, OSError, ValueError) as e:
        print(f"paddle_dist: rank {rank} was refused by the job's gate at {address}: {e}",
              file=sys.stderr, flush=True)
        return EXIT_REFUSED
    host, _, port = store.rpartition(":")
    world = int(environ.get("PADDLE_TRAINERS_NUM", "1"))
    os.execve(argv[0], argv, dict(environ, **store_variables(int(rank), world, host, int(port))))
    return 0                   # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
