"""The machines' own rendezvous before Paddle's multi-node launcher (paddle_dist/launch/rendezvous.py),
an elastic job's meeting with fewer machines, and its place in the launch plan. Nodes are
threads of this process on loopback."""

import http.client
import os
import socket
import threading
import time

import pytest

from paddle_dist.config import config_hash, key_digests, load
from paddle_dist.errors import UserError
from paddle_dist.launch import launcher, rendezvous
from paddle_dist.launch.host import KeptListener
from paddle_dist.launch.jobspec import JobSpec
from paddle_dist.runtime.devices import GpuInfo
from paddle_dist.runtime.env import DistEnv
from paddle_dist.runtime.variables import HostFacts


def _gate(port, node_rank, nnodes=2, timeout=5.0, nprocs=1):
    return rendezvous.MeetingPlace(f"127.0.0.1:{port}", nnodes, node_rank, nprocs, timeout)


class _Node(threading.Thread):
    """rendezvous.meet in a thread; `.error` is what it raised (None when it returned). Node 0's
    rendezvous for Paddle's launchers (Meeting.rendezvous) is closed at once, or kept in
    `.met` with `keep`."""

    def __init__(self, gate, keep=False, kept=None):
        super().__init__(daemon=True)
        self.gate, self.error, self.keep, self.met, self.kept = gate, None, keep, None, kept

    def run(self):
        try:
            self.met = rendezvous.meet(self.gate, self.kept)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error = e
        if self.met is not None and self.met.rendezvous is not None and not self.keep:
            self.met.rendezvous.close()

    def result(self, timeout=20):
        self.join(timeout)
        assert not self.is_alive(), "rendezvous.meet did not return"
        return self.error


def _listening(port, timeout=10):
    """Wait until node 0 listens at `port` (connecting, not sleeping a guess)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nobody listens at {port}")


# ---------------------------------------------------------------- meeting
def test_two_nodes_meet_and_go():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0), keep=True)
    host.start()
    other = _Node(_gate(port, 1))      # it retries until node 0 listens
    other.start()
    assert other.result() is None and host.result() is None
    # Node 0 serves Paddle's launchers' rendezvous on the same port now (kvserver.py) ...
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/healthy")
    assert conn.getresponse().read() == b'{"/healthy": "ok"}'
    conn.close()
    host.met.rendezvous.close()
    # ... until the job ends, and the port is free again.
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_node_0_alone_names_the_missing_node_ranks():
    port = launcher.free_port("127.0.0.1")
    with pytest.raises(rendezvous.NodesMissing) as e:
        rendezvous.meet(_gate(port, 0, nnodes=3, timeout=0.5, nprocs=2))
    assert "1 of 3 nodes (2 ranks: node_rank 0 from 127.0.0.1) arrived within 0.5 s" in str(e.value)
    assert "missing node_rank 1, 2; start them" in str(e.value)


def test_a_node_without_node_0_says_node_0_did_not_answer():
    port = launcher.free_port("127.0.0.1")
    with pytest.raises(rendezvous.NodesMissing) as e:
        rendezvous.meet(_gate(port, 1, timeout=0.5))
    assert f"node 0 did not answer at dist.master 127.0.0.1:{port} within 0.5 s" in str(e.value)


def test_every_node_that_came_hears_which_are_missing():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, nnodes=3, timeout=1.5))
    host.start()
    _listening(port)
    with pytest.raises(rendezvous.NodesMissing) as e:
        rendezvous.meet(_gate(port, 1, nnodes=3, timeout=5))
    assert "2 of 3 nodes" in str(e.value) and "missing node_rank 2;" in str(e.value)
    assert isinstance(host.result(), rendezvous.NodesMissing)


@pytest.mark.parametrize("gate, says", [
    (dict(node_rank=1, nnodes=3), "node 0 has dist.nnodes=2, this node dist.nnodes=3"),
    (dict(node_rank=0, nnodes=2), "dist.node_rank=0 is not in 1..1"),
])
def test_a_node_whose_settings_disagree_is_refused_with_the_fix(gate, says):
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, timeout=1))
    host.start()
    _listening(port)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:   # a node 0 there too
        s.sendall(rendezvous.encode({"v": rendezvous.VERSION, "nprocs": 1, **gate}))
        frames, got = rendezvous.Frames(), []
        while not got:
            got = frames.feed(s.recv(4096))
    assert says in got[0]["error"]
    host.result()


def test_a_second_node_with_the_same_node_rank_is_refused():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, nnodes=3, timeout=1))
    host.start()
    _listening(port)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as first:
        first.sendall(rendezvous.encode({"v": rendezvous.VERSION, "node_rank": 1, "nnodes": 3, "nprocs": 1}))
        frames, got = rendezvous.Frames(), []
        while not got:                      # node 0 lists node 1 as arrived
            got = frames.feed(first.recv(4096))
        assert sorted(got[0]["arrived"]) == ["0", "1"]
        with pytest.raises(UserError) as e:
            rendezvous.meet(_gate(port, 1, nnodes=3, timeout=5))
    assert "dist.node_rank=1 already arrived from 127.0.0.1; give each machine its own" in str(e.value)
    assert isinstance(host.result(), rendezvous.NodesMissing)


def test_garbage_and_silent_connections_do_not_stop_the_others():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_gate(port, 0, timeout=10))
    host.start()
    _listening(port)
    silent = socket.create_connection(("127.0.0.1", port), timeout=5)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as http:
        http.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert http.recv(100) == b""          # dropped unanswered
    rendezvous.meet(_gate(port, 1))
    assert host.result() is None
    silent.close()


def test_something_else_at_the_port_is_named():
    with socket.socket() as other:            # accepts, never answers
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(rendezvous.NodesMissing) as e:
            rendezvous.meet(_gate(port, 1, timeout=0.5))
    assert "something answers at dist.master" in str(e.value)


def test_node_0_must_be_on_the_master_host():
    with pytest.raises(UserError) as e:
        rendezvous.meet(rendezvous.MeetingPlace("198.18.255.254:6170", 2, 0, 1, 1))   # not an address here
    assert "node 0 must run on the machine of dist.master" in str(e.value)


NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root")


def _another_user_can_listen_at(port) -> bool:
    """Whether uid 65534 can listen at 127.0.0.1:`port` now (a forked child that becomes
    that user tries, and lets go at once)."""
    pid = os.fork()
    if pid == 0:                                   # the child: never returns into pytest
        code = 2
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(("127.0.0.1", port))
                s.listen(1)
            code = 0
        except OSError:
            code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) in (0, 1)
    return os.waitstatus_to_exitcode(status) == 0


@as_root
def test_node_0_keeps_its_port_between_attempts():
    """Issue 53, finding 7: node 0 closed its listener when an attempt ended and listened
    again for the next, and another user who listened at the port in between ended an
    elastic job. Kept for the job, the port is never free while the job runs."""
    port = launcher.free_port("127.0.0.1")
    with KeptListener(f"127.0.0.1:{port}") as kept:
        for _ in range(2):          # two attempts: each meets, serves Paddle's rendezvous, ends
            host, other = _Node(_gate(port, 0), kept=kept), _Node(_gate(port, 1))
            host.start()
            other.start()
            assert other.result() is None and host.result() is None
            assert not _another_user_can_listen_at(port)
    assert _another_user_can_listen_at(port)        # the job's end lets it go


@as_root
def test_a_port_taken_is_named_with_its_holder():
    """Where node 0 cannot listen, the line names the process that holds the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError) as e:
            rendezvous.meet(_gate(port, 0))
    assert f"(Address already in use, held by pid {os.getpid()} (" in str(e.value)



# ---------------------------------------------------------------- the plan
def _plan(overrides, **kwargs):
    spec = JobSpec(load(overrides=overrides), HostFacts({}, GpuInfo(False, 0), 2), DistEnv(), script="train.py")
    return launcher.plan(spec, **kwargs)


def test_a_multi_node_launch_meets_first_with_the_rendezvous_timeout():
    p = _plan(["dist.nnodes=3", "dist.node_rank=2", "dist.master=10.0.0.1:6170", "dist.nprocs=2",
               "dist.rendezvous_timeout=30"])
    cfg = load(overrides=["dist.nprocs=2"]).to_dict()        # the job's identity: dist aside
    assert p.gate == rendezvous.MeetingPlace("10.0.0.1:6170", 3, 2, 2, 30.0, config=config_hash(cfg),
                                             config_keys=key_digests(cfg))
    assert _plan(["dist.nprocs=2"]).gate is None
    assert _plan(["dist.nnodes=2", "dist.master=10.0.0.1:6170"], always=True).gate is not None


# ---------------------------------------------------------------- an elastic job's meeting (dist.nnodes=MIN:MAX)
def _elastic_gate(port, node_rank, nnodes=3, min_nodes=2, timeout=5.0, last_call=0.2):
    return rendezvous.MeetingPlace(f"127.0.0.1:{port}", nnodes, node_rank, 2, timeout,
                                   min_nodes=min_nodes, last_call=last_call)


def test_the_machines_that_met_go_on_renumbered_after_the_last_call():
    port = launcher.free_port("127.0.0.1")
    host = _Node(_elastic_gate(port, 0), keep=True)
    host.start()
    _listening(port)
    third = rendezvous.meet(_elastic_gate(port, 2))          # node_rank 1 never comes
    assert host.result() is None
    for met, me in ((host.met, 0), (third, 1)):
        assert met.absent == (1,) and met.node_rank == me and sorted(met.nodes) == [0, 1]
        assert met.world_size == 4 and met.ranks_of(me) == range(2 * me, 2 * me + 2)
    # Paddle's launchers number the machines as they went on: 0 and 1.
    assert sorted(host.met.rendezvous.nodes) == [0, 1]
    host.met.rendezvous.close()


def test_all_the_machines_go_at_once_without_a_last_call():
    port = launcher.free_port("127.0.0.1")
    nodes = [_Node(_elastic_gate(port, r, nnodes=2, min_nodes=1, last_call=3600)) for r in (0, 1)]
    for node in nodes:
        node.start()
    assert [node.result() for node in nodes] == [None, None]      # 20 s bound, not 3600
    assert [node.met.absent for node in nodes] == [(), ()]


def test_fewer_than_the_fewest_is_a_missing_node():
    port = launcher.free_port("127.0.0.1")
    with pytest.raises(rendezvous.NodesMissing) as e:
        rendezvous.meet(_elastic_gate(port, 0, timeout=0.5))
    assert "1 of 3 nodes" in str(e.value) and "missing node_rank 1, 2" in str(e.value)
