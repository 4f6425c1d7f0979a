"""Two "hosts" on one machine: network namespaces joined by a veth pair, for multi-node
tests and tools/bench_link.py.

Host A is 198.18.0.1/24 and host B 198.18.0.2/24 (198.18.0.0/15 is reserved for
benchmarking, so it can never collide with a real network), each with its own `lo`.
The veth pair is created directly inside the namespaces, so the machine's own network
namespace is never touched. Both namespaces are deleted afterwards, whatever happens.
Needs root and iproute2 (`ip`; `tc` to shape the link); where they are missing, or the
container refuses namespaces, `Unavailable` says why.

Example:
    with make_two_hosts() as hosts:
        shape(hosts, "100mbit")                    # optional: a slow link
        subprocess.run(hosts.cmd(hosts.b, ["ping", "-c1", hosts.ip_a]))
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator, List, Tuple

IP_A, IP_B, PREFIX = "198.18.0.1", "198.18.0.2", 24
PERMISSION_HINTS = ("Operation not permitted", "Permission denied")
# tbf needs a bucket; one this small shapes every step's gradients (one of 256 KB lets a
# LeNet step's all-reduce through at full speed, and the limit seems to do nothing).
BURST, LATENCY = "32kb", "400ms"
_serial = itertools.count()   # with the pid, keeps names unique across tests and parallel runs


class Unavailable(RuntimeError):
    """This machine cannot build the two hosts (no root, no iproute2, namespaces refused):
    a missing capability, not a bug. The message says which."""


@dataclass(frozen=True)
class TwoHosts:
    a: str          # namespace names
    b: str
    ip_a: str
    ip_b: str
    iface_a: str    # veth name inside each namespace
    iface_b: str

    def cmd(self, ns: str, argv: List[str]) -> List[str]:
        """`argv` run inside namespace `ns`.

        Example:
            hosts.cmd(hosts.b, ["ping", "-c1", hosts.ip_a])   # ['ip', 'netns', 'exec', 'pdB..', 'ping', ...]
        """
        return ["ip", "netns", "exec", ns] + list(argv)

    def ends(self) -> List[Tuple[str, str]]:
        """(namespace, veth name) of both ends of the link."""
        return [(self.a, self.iface_a), (self.b, self.iface_b)]


def _run(tool: str, *args: str) -> str:
    """Run one `ip` or `tc` command; a failure raises with its stderr."""
    result = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def _ip(*args: str) -> str:
    return _run("ip", *args)


def netns_names() -> List[str]:
    """Names from `ip netns list` (which prints 'name' or 'name (id: N)')."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def unavailable_reason(shaping: bool = False) -> str:
    """Why two hosts cannot be built here ("" when nothing is known to be missing; the
    kernel may still refuse, see `Unavailable`). `shaping`: `tc` is needed too."""
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip` (apt-get install -y iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shaping and shutil.which("tc") is None:
        return "shaping the link needs iproute2's `tc` (apt-get install -y iproute2)"
    return ""


def _add_namespace(name: str) -> None:
    try:
        _ip("netns", "add", name)
    except RuntimeError as e:
        # A container without CAP_SYS_ADMIN refuses even root.
        if any(hint in str(e) for hint in PERMISSION_HINTS):
            raise Unavailable(f"creating network namespaces is not permitted here: {e}") from None
        raise


def _wire(hosts: TwoHosts) -> None:
    # `ip -n A link add ... peer ... netns B` creates both ends inside the namespaces.
    _ip("-n", hosts.a, "link", "add", hosts.iface_a, "type", "veth",
        "peer", "name", hosts.iface_b, "netns", hosts.b)
    for ns, iface, addr in ((hosts.a, hosts.iface_a, hosts.ip_a), (hosts.b, hosts.iface_b, hosts.ip_b)):
        _ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", iface)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "link", "set", iface, "up")


@contextlib.contextmanager
def make_two_hosts() -> Iterator[TwoHosts]:
    """Build the two namespaces, yield them, always delete them. Raises `Unavailable`
    when this machine cannot (see `unavailable_reason`).

    Example:
        with make_two_hosts() as hosts:
            subprocess.run(hosts.cmd(hosts.a, ["ip", "addr"]))
    """
    reason = unavailable_reason()
    if reason:
        raise Unavailable(reason)
    tag = f"{os.getpid()}x{next(_serial)}"     # veth names must stay <= 15 characters
    hosts = TwoHosts(a=f"pdA{tag}", b=f"pdB{tag}", ip_a=IP_A, ip_b=IP_B,
                     iface_a=f"va{tag}", iface_b=f"vb{tag}")
    created: List[str] = []
    try:
        for ns in (hosts.a, hosts.b):
            _add_namespace(ns)
            created.append(ns)
        _wire(hosts)
        yield hosts
    finally:
        # Deleting a namespace also destroys the veth end inside it.
        for ns in created:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def shape(hosts: TwoHosts, rate: str, burst: str = BURST, latency: str = LATENCY) -> None:
    """Limit both directions of the link to `rate` (tc's syntax: 100mbit, 1gbit) with a
    token bucket filter on each veth end (netem, which would add delay, is not always
    available; tbf is).

    Example:
        shape(hosts, "100mbit")     # tc qdisc add dev va.. root tbf rate 100mbit burst 32kb latency 400ms
    """
    for ns, iface in hosts.ends():
        _run("tc", "-n", ns, "qdisc", "add", "dev", iface, "root", "tbf", "rate", rate,
             "burst", burst, "latency", latency)


def sent_bytes(hosts: TwoHosts) -> int:
    """Bytes sent so far from both ends of the link together (both directions)."""
    total = 0
    for ns, iface in hosts.ends():
        [link] = json.loads(_ip("-n", ns, "-j", "-s", "link", "show", "dev", iface))
        total += link["stats64"]["tx"]["bytes"]
    return total
