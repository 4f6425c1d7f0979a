"""Pre-flight network check for multi-node jobs, run before the process group starts.

A wrong `dist.nccl.socket_ifname` or an unreachable master otherwise shows up as a
rendezvous that hangs until its timeout. Here the same mistakes become one `NetworkError`
that names the interface which does reach the master.

Standard library only: interface addresses come from the SIOCGIFADDR ioctl and the route
from the kernel's own source-address choice for a UDP socket, so no `ip` binary or psutil
is needed on the nodes.

Example:
    iface = check("10.0.0.1:6170", socket_ifname="eth")   # 'eth0'
    child_env["GLOO_SOCKET_IFNAME"] = iface
"""

from __future__ import annotations

import fcntl
import socket
import struct
from typing import Dict, List, Mapping, Tuple

from ..errors import UserError

SIOCGIFADDR = 0x8915          # <linux/sockios.h>: get an interface's (primary) IPv4 address
IFREQ_SIZE = 40               # sizeof(struct ifreq) on 64-bit Linux: 16-byte name + 24-byte union
IFREQ_ADDR = slice(20, 24)    # sin_addr inside the ifreq: name(16) + sin_family(2) + sin_port(2)
DISCARD_PORT = 9              # any port will do: connect() on UDP only picks a route
LOOPBACK = "lo"


class NetworkError(UserError):
    """This machine cannot reach the master the way the config says."""


def interfaces() -> Dict[str, List[str]]:
    """Interface name -> its IPv4 addresses ([] when it has none).

    Only the primary address per interface is seen (that is all SIOCGIFADDR reports).

    Example:
        interfaces()   # {'lo': ['127.0.0.1'], 'eth0': ['10.0.0.2'], 'ifb0': []}
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return {name: _ipv4_of(sock, name) for _, name in socket.if_nameindex()}


def _ipv4_of(sock: socket.socket, name: str) -> List[str]:
    request = struct.pack(f"{IFREQ_SIZE}s", name.encode()[:15])
    try:
        reply = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, request)
    except OSError:
        # EADDRNOTAVAIL: no IPv4 address; ENODEV: the interface vanished since if_nameindex.
        return []
    return [socket.inet_ntoa(reply[IFREQ_ADDR])]


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise NetworkError(f"cannot resolve master host {host!r} ({e}); set dist.master to an "
                           "IP address or a name this machine resolves, e.g. 10.0.0.1:6170") from e


def _is_loopback(ip: str) -> bool:
    return ip.startswith("127.")


def route_to(host: str) -> Tuple[str, str]:
    """(local IPv4 address, interface name) the kernel would use to reach `host`.

    Example:
        route_to("127.0.0.1")   # ('127.0.0.1', 'lo')
        route_to("10.0.0.1")    # ('10.0.0.2', 'eth0')
    """
    ip = _resolve(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            # connect() on a UDP socket sends nothing; it only makes the kernel choose the
            # route and source address, which getsockname() then reports.
            sock.connect((ip, DISCARD_PORT))
            local = sock.getsockname()[0]
        except OSError as e:
            raise NetworkError(f"no route from this machine to master {host} ({ip}): {e}; check "
                               "dist.master and this node's network configuration") from e
    if _is_loopback(ip):
        # All of 127/8 lives on lo, but SIOCGIFADDR shows only 127.0.0.1, so a source such
        # as 127.0.0.2 would not map back by address.
        return local, LOOPBACK
    return local, _interface_of(local, host)


def _interface_of(local: str, host: str) -> str:
    table = interfaces()
    for name, addrs in table.items():
        if local in addrs:
            return name
    raise NetworkError(f"the route to master {host} leaves from {local}, which is not the primary "
                       f"IPv4 address of any interface ({_describe(table)}); make it the "
                       "interface's primary address or use a master on another network")


def _describe(table: Dict[str, List[str]]) -> str:
    return ", ".join(f"{name}={'/'.join(addrs) or '-'}" for name, addrs in table.items())


def _parse_master(master: str) -> str:
    parts = master.split(":")
    if len(parts) != 2 or not parts[0] or not parts[1].isdigit() or not 0 < int(parts[1]) < 65536:
        raise NetworkError(f"dist.master {master!r} must be host:port with a port in 1-65535, "
                           "e.g. 10.0.0.1:6170")
    return parts[0]


def parse_ifname(spec: str) -> Tuple[bool, bool, List[str]]:
    """Split NCCL_SOCKET_IFNAME syntax into (exclude, exact, names).

    Example:
        parse_ifname("^=docker0,lo")   # (True, True, ['docker0', 'lo'])
        parse_ifname("eth")            # (False, False, ['eth'])
    """
    # NCCL reads '^' first, then '=', and applies both to the whole list.
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    return exclude, exact, [n for n in spec.split(",") if n]


def matches(name: str, spec: str) -> bool:
    """Whether NCCL would select interface `name` under NCCL_SOCKET_IFNAME=`spec`.

    Example:
        matches("eth0", "eth")     # True  (prefix)
        matches("eth0", "=eth")    # False (exact)
        matches("lo", "^docker,lo")  # False (excluded)
    """
    exclude, exact, names = parse_ifname(spec)
    hit = any(name == n if exact else name.startswith(n) for n in names)
    return hit != exclude


def check_selects(spec: str, source: str, table: Mapping[str, List[str]]) -> None:
    """A NetworkError when the socket interface setting `spec` (from `source`: a config key
    or NCCL_SOCKET_IFNAME) selects none of this machine's interfaces in `table` (as
    interfaces()): NCCL would find no socket to bootstrap over."""
    if not spec or any(matches(name, spec) for name in table):
        return
    with_address = [n for n, addrs in table.items() if addrs and n != LOOPBACK]
    example = (with_address or list(table) or ["eth0"])[0]
    raise NetworkError(f"{source}={spec} selects no interface on this machine (interfaces: "
                       f"{', '.join(table) or 'none'}); set -o dist.nccl.socket_ifname="
                       f"{example} (a prefix; =NAME for an exact name, ^NAME to exclude)")


def check(master: str, socket_ifname: str = "") -> str:
    """Fail fast unless `master` ("host:port") is reachable through an allowed interface.

    Returns the interface the route to the master uses; callers export it as
    GLOO_SOCKET_IFNAME. `socket_ifname` uses NCCL_SOCKET_IFNAME syntax.

    Example:
        check("127.0.0.1:6170")                       # 'lo'
        check("10.0.0.1:6170", socket_ifname="ens9")  # NetworkError: ... set dist.nccl.socket_ifname=eth0
    """
    host = _parse_master(master)
    _, iface = route_to(host)
    if not socket_ifname or matches(iface, socket_ifname):
        return iface
    raise NetworkError(_mismatch(socket_ifname, host, iface))


def _mismatch(spec: str, host: str, iface: str) -> str:
    setting = f"dist.nccl.socket_ifname={spec}"
    fix = f"the master {host} is reached through {iface}: set dist.nccl.socket_ifname={iface}"
    if spec.startswith("^"):
        return f"{setting} excludes {iface}, but {fix}"
    names = list(interfaces())
    chosen = [n for n in names if matches(n, spec)]
    if not chosen:
        return f"{setting} names no interface on this machine (interfaces: {', '.join(names)}); {fix}"
    return f"{setting} selects {', '.join(chosen)}, but {fix}"
