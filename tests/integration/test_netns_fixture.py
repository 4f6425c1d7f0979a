"""The `two_hosts` fixture really gives two hosts: B reaches A over the veth pair, the two
loopbacks are separate, and the namespaces are gone afterwards, even after a failure.
Also runs netcheck where it matters: on a host whose route to the master is not `lo`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess

import pytest

from . import netns, procs
from .netns import make_two_hosts, netns_names, two_hosts  # noqa: F401  (two_hosts is a fixture)

PY = procs.PY
TIMEOUT = 30

# Listens on ip:port and 127.0.0.1:port (same port), prints "ready <port>", then echoes one
# line per connection until it has served argv[2] connections.
SERVER = """
import selectors, socket, sys
ip, count = sys.argv[1], int(sys.argv[2])
first = socket.create_server((ip, 0))
port = first.getsockname()[1]
sel = selectors.DefaultSelector()
for s in (first, socket.create_server(("127.0.0.1", port))):
    sel.register(s, selectors.EVENT_READ)
print("ready", port, flush=True)
for _ in range(count):
    key, _ = sel.select()[0]
    conn, _ = key.fileobj.accept()
    with conn:
        conn.sendall(conn.makefile().readline().encode())
"""

# Sends argv[3] to argv[1]:argv[2] and prints the reply; "refused" (exit 3) when nobody listens.
CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
        s.sendall(sys.argv[3].encode() + b"\\n")
        print(s.makefile().readline().strip())
except ConnectionRefusedError:
    print("refused")
    sys.exit(3)
"""


def read_line(proc: subprocess.Popen, timeout: float) -> str:
    """The next stdout line of `proc`, failing the test instead of blocking past `timeout`."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from {proc.args} within {timeout}s"
    return proc.stdout.readline()


@pytest.fixture
def echo_server(two_hosts):
    """An echo server inside A serving three connections; yields (port, process)."""
    proc = subprocess.Popen(two_hosts.cmd(two_hosts.a, [PY, "-c", SERVER, two_hosts.ip_a, "3"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        line = read_line(proc, TIMEOUT)
        assert line.startswith("ready "), f"server said {line!r}; stderr: {proc.stderr.read()}"
        yield int(line.split()[1]), proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def client(hosts, ns: str, ip: str, port: int, message: str) -> subprocess.CompletedProcess:
    return procs.run(hosts.cmd(ns, [PY, "-c", CLIENT, ip, str(port), message]), timeout=TIMEOUT)


def test_b_reaches_a_but_not_its_loopback(two_hosts, echo_server):
    hosts, (port, server) = two_hosts, echo_server
    # Control: the server does listen on A's loopback, so a refusal from B below means
    # B's 127.0.0.1 is a different loopback, not that nothing listens there.
    assert procs.check(client(hosts, hosts.a, "127.0.0.1", port, "a-lo")).stdout.strip() == "a-lo"
    assert procs.check(client(hosts, hosts.b, hosts.ip_a, port, "hello from b")).stdout.strip() \
        == "hello from b"
    refused = client(hosts, hosts.b, "127.0.0.1", port, "lost")
    assert (refused.returncode, refused.stdout.strip()) == (3, "refused"), refused.stderr
    # The third connection it serves lets the server exit cleanly.
    assert procs.check(client(hosts, hosts.a, hosts.ip_a, port, "bye")).stdout.strip() == "bye"
    assert server.wait(timeout=TIMEOUT) == 0, server.stderr.read()


def test_namespaces_have_their_addresses(two_hosts):
    for ns, iface, ip in ((two_hosts.a, two_hosts.iface_a, two_hosts.ip_a),
                          (two_hosts.b, two_hosts.iface_b, two_hosts.ip_b)):
        out = procs.check(procs.run(two_hosts.cmd(ns, ["ip", "-br", "addr"]), timeout=TIMEOUT)).stdout
        assert f"{ip}/24" in out and iface in out and "127.0.0.1/8" in out, out
    assert len(two_hosts.iface_a) <= 15 and len(two_hosts.iface_b) <= 15


def test_namespaces_deleted_afterwards_even_on_failure():
    with make_two_hosts() as hosts:
        assert {hosts.a, hosts.b} <= set(netns_names())
    assert not {hosts.a, hosts.b} & set(netns_names())
    with pytest.raises(RuntimeError, match="boom"):
        with make_two_hosts() as hosts:
            raise RuntimeError("boom")
    assert not {hosts.a, hosts.b} & set(netns_names())


def test_fixture_cleans_up_after_a_failing_test(pytester):
    """The fixture itself, in a test that fails: its namespaces are gone once pytest is done."""
    pytester.makepyfile(test_inner='''
        from pathlib import Path
        from tests.integration.netns import two_hosts

        def test_fails(two_hosts):
            Path("names").write_text(two_hosts.a + " " + two_hosts.b)
            assert False, "deliberate"
    ''')
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(failed=1)
    names = (pytester.path / "names").read_text().split()
    assert len(names) == 2 and not set(names) & set(netns_names())


def test_skips_without_ip(monkeypatch):
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="need iproute2"):
        with make_two_hosts():
            pass


# One child for every case: importing paddle_dist imports Paddle, which takes seconds.
# argv: master ifname master ifname ...; prints one JSON list of interface names / errors.
NETCHECK = """
import json, sys
from paddle_dist.runtime.netcheck import NetworkError, check
out = []
for master, ifname in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        out.append(check(master, socket_ifname=ifname))
    except NetworkError as e:
        out.append("error: " + str(e))
print(json.dumps(out))
"""


def test_netcheck_on_host_b(two_hosts):
    """From B, the master A is reached through B's veth; a config naming lo must fail."""
    hosts, master = two_hosts, f"{two_hosts.ip_a}:6170"
    cases = [(master, ""), (master, "vb"), (master, "^lo"), (master, "lo"), (master, "ens9"),
             # Nothing beyond 198.18.0.0/24 is routable from B: the kernel says so at once.
             ("198.19.0.1:6170", ""),
             # B has no route to the DNS server, so this lookup fails without leaving B.
             ("name.invalid:6170", "")]
    argv = [PY, "-c", NETCHECK] + [arg for case in cases for arg in case]
    got = json.loads(procs.check(procs.run(hosts.cmd(hosts.b, argv), timeout=120)).stdout)
    fix = f"the master {hosts.ip_a} is reached through {hosts.iface_b}: " \
          f"set dist.nccl.socket_ifname={hosts.iface_b}"
    assert got[:3] == [hosts.iface_b] * 3
    assert got[3] == f"error: dist.nccl.socket_ifname=lo selects lo, but {fix}"
    assert got[4] == ("error: dist.nccl.socket_ifname=ens9 names no interface on this machine "
                      f"(interfaces: lo, {hosts.iface_b}); {fix}")
    assert got[5].startswith("error: no route from this machine to master 198.19.0.1"), got[5]
    assert got[6].startswith("error: cannot resolve master host 'name.invalid'"), got[6]
