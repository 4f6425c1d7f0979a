"""After Paddle's process group starts: check that its store holds this job's ranks and
nothing else, since Paddle's TCP store authenticates nobody.

Paddle's store (in rank 0, on every interface of its machine) counts the clients that
joined it under the key `init/`. Anyone who reaches the port can add to that count, or
write keys the ranks then read. When the job has a token (one made for every one-machine
job by paddle_dist's launcher, or `dist.token_file`), each rank, right after
`init_parallel_env()`:
- claims its place: the first to add 1 to `paddle_dist/claim/<rank>` (a second claim, or
  a value written there before, is a breach);
- writes its attestation: an HMAC of the token over the job, its rank, host and pid and a
  nonce rank 0 made for this start (auth.proof), so that nothing recorded elsewhere
  passes;
- and rank 0 checks every attestation and that the store counted exactly the world size
  of joins, naming any other connection to the store it can see, then tells every rank
  its verdict, with an HMAC of the token over it and the nonce: a verdict that does not
  prove the token is itself a breach, and so is a verdict rank 0 finds already written
  (a rank may have read that one, or rank 0's would silently replace it). A breach ends
  every rank with SecurityError (exit 6) and one line.

What it cannot see: whatever an outsider does after the check, and writes to Paddle's own
keys (the ranks' gloo addresses among them) before the ranks read them. docs/security.md
says what stays exposed.

The ranks talk to the store over a connection of their own (storewire.py): a few
milliseconds in all, every wait bounded by dist.hang_timeout, where Paddle's client takes
about 40 ms a request and waits for a key without a limit. That connection is no join:
only Paddle's TCPStore adds to `init/`.

Example:
    check("127.0.0.1:40123", token, job="3f2a...", rank=1, world=2, limit=300)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Dict, Tuple

from . import auth, storewire
from .. import procfs
from ..errors import EXIT_HANG, EXIT_SECURITY, JobEnding

JOINS = "init/"            # where Paddle's TCPStore counts its clients (waitWorkers, 2.6 to 3.3)
PREFIX = "paddle_dist/"
OK = "ok"
SECURITY_LINE = "paddle_dist: security: "   # how a rank says it stopped the job (report.py finds it)
MAX_RECORD = 1024


class SecurityError(JobEnding):
    """Something that does not hold the job's token took part in its store (exit 6). Its
    message is the one line every rank prints."""

    CODE = EXIT_SECURITY


class StoreSilent(JobEnding):
    """Paddle's store did not answer within dist.hang_timeout, or closed the connection
    (exit 4): something holds it. Its message is the one line the rank printed."""

    CODE = EXIT_HANG


def check(where: str, token: bytes, job: str, rank: int, world: int, limit: float) -> None:
    """Attest this rank in Paddle's store at `where` ("host:port"); rank 0 judges all.
    Returns when the store holds the job's ranks alone; raises SecurityError otherwise,
    and StoreSilent when the store does not answer within `limit` seconds in all."""
    host, _, port = where.rpartition(":")
    try:
        with storewire.Connection(host, int(port), timeout=limit,
                                  deadline=time.monotonic() + limit) as store:
            verdict = _attest(store, token, job, rank, world, where)
    except (OSError, ConnectionError) as e:       # socket.timeout is an OSError
        line = (f"rank {rank}: Paddle's store at {where} did not answer within {limit:g} s after the "
                f"process group started ({e}): something holds it, a connection from outside the job or "
                "rank 0 stopped; dist.hang_timeout sets this limit (docs/security.md)")
        print(f"paddle_dist: {line}", file=sys.stderr, flush=True)
        raise StoreSilent(line) from None
    if verdict != OK:
        print(f"{SECURITY_LINE}{verdict}; the job was stopped (docs/security.md)",
              file=sys.stderr, flush=True)
        raise SecurityError(verdict)


def _attest(store, token: bytes, job: str, rank: int, world: int, where: str) -> str:
    """The exchange of `check` over a storewire connection; the verdict (OK or the line)."""
    if store.add(f"{PREFIX}claim/{rank}", 1) != 1:
        verdict = (f"rank {rank}'s place in Paddle's store at {where} was claimed before it came: "
                   "something outside the job wrote there")
        store.set(f"{PREFIX}attest/{rank}", json.dumps({"breach": verdict}).encode())   # rank 0 waits on it
        return verdict
    made = auth.nonce() if rank == 0 else ""
    if rank == 0:
        store.set(f"{PREFIX}nonce", made.encode())
    nonce = _text(store.get(f"{PREFIX}nonce"))
    mine = {"host": socket.gethostname()[:64], "pid": os.getpid()}
    mine["proof"] = auth.proof(token, "attest", job, rank, nonce, _who(mine))
    store.set(f"{PREFIX}attest/{rank}", json.dumps(mine).encode())
    if rank != 0:
        return _proven_verdict(_text(store.get(f"{PREFIX}verdict")), token, job, nonce, rank, where)
    verdict = ((f"the nonce rank 0 wrote in Paddle's store at {where} was replaced: something outside "
                "the job wrote it") if nonce != made else "") or judge(store, token, job, world, nonce, where) or OK
    if store.check(f"{PREFIX}verdict"):     # only rank 0 writes it, and only here
        verdict = (f"a verdict was in Paddle's store at {where} before rank 0 wrote its own: something "
                   "outside the job wrote it")
    store.set(f"{PREFIX}verdict", json.dumps({"verdict": verdict, "proof": _verdict_proof(
        token, job, nonce, verdict)}).encode())
    return verdict


def _verdict_proof(token: bytes, job: str, nonce: str, verdict: str) -> str:
    return auth.proof(token, "verdict", job, 0, nonce, verdict)


def _proven_verdict(text: str, token: bytes, job: str, nonce: str, rank: int, where: str) -> str:
    """Rank 0's verdict as this rank read it: the verdict when it proves the job's token
    (an HMAC over this start's nonce), else the line that says it was forged."""
    record = _record(text)
    verdict = record.get("verdict")
    if isinstance(verdict, str) and auth.matches(_verdict_proof(token, job, nonce, verdict), record.get("proof")):
        return verdict[:MAX_RECORD]
    return (f"rank {rank} read a verdict in Paddle's store at {where} that does not prove this rank's "
            "token: rank 0 holds another token, or something outside the job wrote it")


def judge(store, token: bytes, job: str, world: int, nonce: str, where: str) -> str:
    """Rank 0's verdict: "" when every rank's attestation proves the token and the store
    counted `world` joins, else the one line that says what is wrong."""
    ours: Dict[int, Tuple[str, int]] = {}
    for rank in range(world):
        record = _record(_text(store.get(f"{PREFIX}attest/{rank}")))
        if isinstance(record.get("breach"), str):      # that rank found one: say it (any writer means a breach)
            return record["breach"][:MAX_RECORD]
        expected = auth.proof(token, "attest", job, rank, nonce, _who(record))
        if not auth.matches(expected, record.get("proof")):
            return (f"rank {rank}'s attestation in Paddle's store at {where} does not prove the job's "
                    "token: something outside the job wrote it")
        ours[rank] = (str(record.get("host")), record.get("pid"))
    joins = store.add(JOINS, 0)
    if joins != world:
        return (f"Paddle's store at {where} counted {joins} joins for {world} ranks: something outside "
                f"the job joined it{_strangers(where, ours)}")
    return ""


def _strangers(where: str, ours: Dict[int, Tuple[str, int]]) -> str:
    """", connected from ..." naming the store's connections that belong to no rank of the
    job, as far as this machine can tell."""
    port = int(where.rpartition(":")[2])
    here = socket.gethostname()[:64]
    pids = {pid for host, pid in ours.values() if host == here}
    # A peer on another machine cannot be told from a rank there: only this machine's are named.
    others = [f"{ip}:{number}" + (f" (pid {pid}: {' '.join(procfs.cmdline(pid))[:80]})" if pid else "")
              for ip, number, pid in procfs.peers_of(port)
              if (pid and pid not in pids) or (not pid and ip.startswith(("127.", "::1")))]
    return f", connected from {', '.join(others[:4])}" if others else ""


def _who(record: dict) -> str:
    return f"{record.get('host')}/{record.get('pid')}"


def _text(value) -> str:
    return bytes(value)[:MAX_RECORD].decode("utf-8", errors="replace")


def _record(text: str) -> dict:
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}
