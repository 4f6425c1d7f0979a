"""The `two_hosts` fixture: two network namespaces joined by a veth pair, for multi-node
tests (the namespaces themselves are built by tools/netns.py, which
tools/bench_link.py shares).

Host A is 198.18.0.1/24 and host B 198.18.0.2/24, each with its own `lo`. Both
namespaces are deleted afterwards, whatever happens; a machine that cannot build them
(no root, no iproute2, namespaces refused) skips the test, saying why.

Use it from a test module:
    from .netns import two_hosts

    def test_x(two_hosts):
        procs.run(two_hosts.cmd(two_hosts.b, [PY, "-c", "..."]))
"""

from __future__ import annotations

import contextlib
import shutil  # noqa: F401  (tests patch netns.shutil.which to hide `ip`)
from typing import Iterator

import pytest

from tools.netns import IP_A, IP_B, PREFIX, TwoHosts, Unavailable, netns_names  # noqa: F401
from tools import netns as _hosts
from .. import stopping


@contextlib.contextmanager
def make_two_hosts() -> Iterator[TwoHosts]:
    """tools/netns.py: make_two_hosts, skipping the test where it cannot run.

    Example:
        with make_two_hosts() as hosts:
            subprocess.run(hosts.cmd(hosts.a, ["ip", "addr"]))
    """
    try:
        with _hosts.make_two_hosts() as hosts, stopping.held(netns=[hosts.a, hosts.b]):
            yield hosts
    except Unavailable as e:     # raised before the block runs: nothing was built
        pytest.skip(str(e))


@pytest.fixture
def two_hosts() -> Iterator[TwoHosts]:
    """Two network namespaces joined by a veth pair (see the module docstring)."""
    with make_two_hosts() as hosts:
        yield hosts
