"""Two "hosts" on one machine: network namespaces joined by a veth pair, for multi-node tests.

Host A is 198.18.0.1/24 and host B 198.18.0.2/24 (198.18.0.0/15 is reserved for
benchmarking, so it can never collide with a real network), each with its own `lo`.
The veth pair is created directly inside the namespaces, so the machine's own network
namespace is never touched. Both namespaces are deleted afterwards, whatever happens.

Use it from a test module:
    from .netns import two_hosts

    def test_x(two_hosts):
        procs.run(two_hosts.cmd(two_hosts.b, [PY, "-c", "..."]))
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterator, List

import pytest

IP_A, IP_B, PREFIX = "198.18.0.1", "198.18.0.2", 24
PERMISSION_HINTS = ("Operation not permitted", "Permission denied")
_serial = itertools.count()   # with the pid, keeps names unique across tests and parallel runs


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


def _ip(*args: str) -> None:
    """Run one `ip` command; a failure raises with its stderr."""
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")


def netns_names() -> List[str]:
    """Names from `ip netns list` (which prints 'name' or 'name (id: N)')."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _skip_reason() -> str:
    if shutil.which("ip") is None:
        return "network namespace tests need iproute2's `ip` (apt-get install -y iproute2)"
    if os.geteuid() != 0:
        return "network namespace tests need root (ip netns add)"
    return ""


def _add_namespace(name: str) -> None:
    try:
        _ip("netns", "add", name)
    except RuntimeError as e:
        # A container without CAP_SYS_ADMIN refuses even root: a missing capability, not a bug.
        if any(hint in str(e) for hint in PERMISSION_HINTS):
            pytest.skip(f"creating network namespaces is not permitted here: {e}")
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
    """Build the two namespaces, yield them, always delete them (the `two_hosts` fixture's body).

    Example:
        with make_two_hosts() as hosts:
            subprocess.run(hosts.cmd(hosts.a, ["ip", "addr"]))
    """
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
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


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    """Two network namespaces joined by a veth pair (see the module docstring)."""
    with make_two_hosts() as hosts:
        yield hosts
