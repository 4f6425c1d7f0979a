"""netcheck: interface discovery, routes and NCCL_SOCKET_IFNAME matching.

Loopback cases use this machine's real `lo`; everything else patches `interfaces` and
`route_to` to a fake two-NIC host so the tests do not depend on this machine's NICs.
"""

from __future__ import annotations

import pytest

from paddle_dist.runtime import netcheck
from paddle_dist.errors import UserError
from paddle_dist.runtime.netcheck import NetworkError, check, matches, parse_ifname, route_to

FAKE = {"lo": ["127.0.0.1"], "eth0": ["198.18.0.1"], "eth1": ["198.18.1.1"], "docker0": []}


@pytest.fixture
def fake_host(monkeypatch):
    """A host whose route to any non-loopback master leaves through eth0 (198.18.0.1)."""
    monkeypatch.setattr(netcheck, "interfaces", lambda: dict(FAKE))
    monkeypatch.setattr(netcheck, "route_to", lambda host: ("198.18.0.1", "eth0"))


def test_interfaces_has_loopback():
    assert "127.0.0.1" in netcheck.interfaces()["lo"]


def test_interfaces_without_ipv4_map_to_empty_list():
    assert all(isinstance(addrs, list) for addrs in netcheck.interfaces().values())


def test_route_to_loopback():
    assert route_to("127.0.0.1") == ("127.0.0.1", "lo")
    assert route_to("localhost")[1] == "lo"


def test_check_loopback_master():
    assert check("127.0.0.1:6170") == "lo"
    assert check("localhost:6170", socket_ifname="lo") == "lo"


def test_missing_interface_lists_real_ones_and_suggests_lo():
    with pytest.raises(NetworkError) as e:
        check("127.0.0.1:6170", socket_ifname="ens9")
    msg = str(e.value)
    assert "dist.nccl.socket_ifname=ens9 names no interface" in msg
    assert "lo" in msg.split("(interfaces: ")[1].split(")")[0].split(", ")
    assert msg.endswith("set dist.nccl.socket_ifname=lo")


def test_excluding_the_loopback_route_fails():
    with pytest.raises(NetworkError, match=r"excludes lo.*set dist.nccl.socket_ifname=lo"):
        check("127.0.0.1:6170", socket_ifname="^lo")


@pytest.mark.parametrize("spec", ["l", "lo", "=lo", "eth,l", "^docker", "^=l"])
def test_loopback_accepted(spec):
    assert check("127.0.0.1:6170", socket_ifname=spec) == "lo"


def test_exact_match_is_not_a_prefix():
    with pytest.raises(NetworkError, match="=l names no interface"):
        check("127.0.0.1:6170", socket_ifname="=l")


@pytest.mark.parametrize("master", ["nohost", "host:port", ":80", "a:b:c", "host:0", "host:70000",
                                    "host:"])
def test_malformed_master(master):
    with pytest.raises(NetworkError, match=r"must be host:port.*e\.g\. 10\.0\.0\.1:6170") as e:
        check(master)
    assert repr(master) in str(e.value)


def test_unresolvable_host(monkeypatch):
    # The resolver's answer is simulated: a unit test must not query this machine's DNS
    # server. The real lookup failure is exercised inside a network namespace
    # (tests/integration/test_netns_fixture.py), where no query can leave.
    def no_such_name(host):
        raise netcheck.socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(netcheck.socket, "gethostbyname", no_such_name)
    with pytest.raises(NetworkError, match="cannot resolve master host 'name.invalid'"):
        check("name.invalid:6170")


def test_network_error_is_a_user_error():
    assert issubclass(NetworkError, UserError)


def test_route_to_unreachable_is_network_error(monkeypatch):
    class NoRoute:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def connect(self, addr):
            raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(netcheck.socket, "socket", NoRoute)
    with pytest.raises(NetworkError, match=r"no route from this machine to master 198\.18\.0\.9"):
        route_to("198.18.0.9")


def test_route_from_unknown_address_is_network_error(monkeypatch):
    monkeypatch.setattr(netcheck, "interfaces", lambda: dict(FAKE))
    with pytest.raises(NetworkError, match="198.18.7.7, which is not the primary"):
        netcheck._interface_of("198.18.7.7", "master")


@pytest.mark.parametrize("spec", ["", "eth0", "eth", "=eth0", "^docker,lo", "^=eth1", "docker,eth"])
def test_remote_master_accepted(fake_host, spec):
    assert check("198.18.0.2:6170", socket_ifname=spec) == "eth0"


def test_remote_master_missing_interface(fake_host):
    with pytest.raises(NetworkError) as e:
        check("198.18.0.2:6170", socket_ifname="ens9")
    assert str(e.value) == (
        "dist.nccl.socket_ifname=ens9 names no interface on this machine "
        "(interfaces: lo, eth0, eth1, docker0); the master 198.18.0.2 is reached through eth0: "
        "set dist.nccl.socket_ifname=eth0")


def test_remote_master_through_other_interface(fake_host):
    with pytest.raises(NetworkError) as e:
        check("198.18.0.2:6170", socket_ifname="eth1,docker")
    assert str(e.value) == ("dist.nccl.socket_ifname=eth1,docker selects eth1, docker0, but the master "
                            "198.18.0.2 is reached through eth0: set dist.nccl.socket_ifname=eth0")


@pytest.mark.parametrize("spec", ["^eth", "^=eth0", "^docker,eth0"])
def test_remote_master_excluded(fake_host, spec):
    with pytest.raises(NetworkError, match="excludes eth0, but the master 198.18.0.2 is reached "
                                           "through eth0: set dist.nccl.socket_ifname=eth0"):
        check("198.18.0.2:6170", socket_ifname=spec)


@pytest.mark.parametrize("spec, expected", [
    ("eth", (False, False, ["eth"])),
    ("=eth0", (False, True, ["eth0"])),
    ("^docker,lo", (True, False, ["docker", "lo"])),
    ("^=docker0,", (True, True, ["docker0"])),
])
def test_parse_ifname(spec, expected):
    assert parse_ifname(spec) == expected


@pytest.mark.parametrize("name, spec, expected", [
    ("eth0", "eth", True), ("eth1", "eth", True), ("eth0", "=eth0", True), ("eth0", "=eth", False),
    ("docker0", "^docker,lo", False), ("lo", "^docker,lo", False), ("eth0", "^docker,lo", True),
    ("ens9", "eth,ib", False),
])
def test_matches(name, spec, expected):
    assert matches(name, spec) is expected
