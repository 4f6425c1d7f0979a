"""What a job opens to the network, and what guards it: the one line a job prints at its
start and the `exposure` section of `python -m paddle_dist.doctor`.

Paddle's TCP store listens on every interface and authenticates nobody, and gloo and
NCCL neither authenticate nor encrypt: Paddle offers no option for any of that. What
paddle_dist adds is in front of them (the gates: rankgate.py, launch/rendezvous.py), after them (the
ranks' attestation in the store: attest.py), and in place of Paddle's multi-node
key-value server (kvserver.py: node 0 serves that rendezvous to the machines that met). docs/security.md says the same at length.

Example:
    for part in listeners(cfg):
        print(part.what, part.where, part.guard)
    start_line(cfg, gate="127.0.0.1:40123")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List
from ..schema import Config


@dataclass(frozen=True)
class Listener:
    what: str
    where: str
    guard: str


OPEN = "unauthenticated"
WIRE = "gloo/NCCL"
WIRE_GUARD = "unauthenticated, unencrypted"


def listeners(cfg: Config, gate: str = "") -> List[Listener]:
    """What the job of `cfg` listens on, in the order the job opens them. `gate`: the
    one-machine gate's address, once it is known. With dist.isolate, all of it is inside
    the job's own network namespace (isolate.py)."""
    found = _listeners(cfg, gate)
    d = cfg.dist
    if d.isolate and d.nnodes == 1 and d.launcher in ("launch", "spawn"):
        return [Listener(p.what, "in the job's own network namespace", f"{p.guard}; no other user reaches it")
                for p in found]
    return found


def _listeners(cfg: Config, gate: str) -> List[Listener]:
    d = cfg.dist
    token = f"token of {d.token_file}" if d.token_file else ""
    tls = f"mutual TLS 1.3 with certificates of {d.tls_ca}" if d.tls_ca else ""
    one_machine = d.nnodes == 1 and d.launcher in ("launch", "spawn")   # a token is made for the job
    store = Listener("Paddle's store", "on every interface of rank 0's machine",
                     f"{OPEN}; paddle_dist's ranks attest in it" if token or one_machine
                     else f"{OPEN}; -o dist.token_file=PATH has paddle_dist's ranks attest in it")
    if d.nnodes > 1 and d.launcher == "launch":
        guard = " + ".join(filter(None, [token, tls])) or f"{OPEN}; -o dist.token_file=PATH"
        return [Listener("meeting", f"at {d.master}", guard),
                Listener("Paddle's launchers' rendezvous", f"at {d.master}, after the meeting",
                         "served by paddle_dist to the machines that met alone"),
                store, Listener(WIRE, "on the interface that reaches dist.master", WIRE_GUARD)]
    if d.launcher == "launch":
        return [Listener("gate", f"at {gate or '127.0.0.1, a port per job'}", token or "a token made for the job"),
                store, Listener(WIRE, "on loopback", WIRE_GUARD)]
    if d.launcher == "spawn":
        return [store, Listener(WIRE, "on loopback", WIRE_GUARD)]
    return [store, Listener(WIRE, "on the interface that reaches the master", WIRE_GUARD)]


def start_line(cfg: Config, gate: str = "") -> str:
    """The line a job prints at its start: every listener, where, and its guard.

    Example:
        start_line(cfg, "127.0.0.1:40123")
        # 'paddle_dist: exposure: gate 127.0.0.1:40123 (a token made for the job); Paddle's store ...'
    """
    parts = "; ".join(f"{p.what} {p.where} ({p.guard})" for p in listeners(cfg, gate))
    return f"paddle_dist: exposure: {parts}; docs/security.md"


def rows(cfg: Config) -> List[tuple]:
    """(what, where; guard) rows for doctor's report."""
    return [(p.what, f"{p.where}; {p.guard}") for p in listeners(cfg)]
