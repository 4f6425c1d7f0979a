"""HTTP proxies as Paddle's multi-node launcher meets them: its rendezvous speaks HTTP
through httpx, which honours the proxy variables, and a proxy in the way makes the start
hang. These say which variable is in effect and whether no_proxy exempts dist.master, by
httpx's own rules; preflight.proxy_problems turns them into a finding.

Example:
    proxy_setting({"http_proxy": "http://proxy:3128"}, "http")     # ('http_proxy', 'http://proxy:3128')
    bypasses_proxy("10.0.0.1", 6170, "localhost,10.0.0.1")          # True
"""

from __future__ import annotations

import ipaddress
import re
from typing import Mapping, Optional, Tuple

NO_PROXY_ENTRY = re.compile(r"(.*?)(?::(\d+))?")   # host[:port]


def proxy_setting(environ: Mapping[str, str], scheme: str) -> Optional[Tuple[str, str]]:
    """(variable name, value) of the `<scheme>_proxy` setting in effect, or None.

    As urllib.request.getproxies (which httpx uses): the lower-case variable wins, and
    setting it empty cancels the upper-case one.
    """
    lower = f"{scheme}_proxy"
    if lower in environ:
        return (lower, environ[lower]) if environ[lower] else None
    upper = lower.upper()
    return (upper, environ[upper]) if environ.get(upper) else None


def bypasses_proxy(host: str, port: int, no_proxy: str) -> bool:
    """Whether `no_proxy` exempts http://host:port, by httpx's rules.

    Example:
        bypasses_proxy("10.0.0.1", 6170, "localhost,10.0.0.1")   # True
        bypasses_proxy("n1.lab", 6170, ".lab")                    # True (suffix)
        bypasses_proxy("10.0.0.1", 6170, "10.0.0.0/8")            # False: httpx has no ranges
    """
    host = host.lower()
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        scheme, _, rest = entry.rpartition("://")
        if scheme not in ("", "http", "all"):
            continue                    # https://HOST exempts https:// URLs only
        name, entry_port = NO_PROXY_ENTRY.fullmatch(rest).groups()
        if not name or (entry_port and int(entry_port) != port):
            continue
        if _is_ipv4(name.split("/")[0]) or name == "localhost":
            hit = host == name.split("/")[0]
        elif name.startswith("."):
            hit = host.endswith(name)
        else:
            hit = host == name or host.endswith("." + name)
        if hit:
            return True
    return False


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True
