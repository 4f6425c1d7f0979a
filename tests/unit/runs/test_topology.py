"""One job, one numbering across machines: what the machines learn when they meet (node 0's
run name, each node's host and block of global ranks), how a machine's launcher maps its
ranks to global ranks, and what each machine's report and console say. Pure logic; the
meeting runs in threads on loopback, the one child process is bounded."""

import os
import socket
import subprocess
import sys
import threading

import pytest

from paddle_dist import errors
from paddle_dist.launch import launcher, rendezvous, supervisor
from paddle_dist.trainer import progress
from paddle_dist.runtime.env import DistEnv
from paddle_dist.launch.jobprocs import place_of
from paddle_dist.runs.topology import Machines, Meeting, Node
from paddle_dist.runs.report import Exit, root_cause

KILL = -9
TWO_BY_TWO = Meeting("job-1", {0: Node(2, "198.18.0.1", "nodeA"), 1: Node(2, "198.18.0.2", "nodeB")}, 0)
RESET = ("gradient all-reduce failed: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] "
         "Read error [198.18.0.2]:23443: Connection reset by peer")


def _stopped(rank, host, error=RESET):
    return {"rank": rank, "host": host, "state": "stopped", "exit_code": errors.EXIT_PEER,
            "error_type": "PeerFailure", "error": error, "pid": 1}


# ---------------------------------------------------------------- the meeting
def test_each_node_holds_a_block_of_global_ranks_in_node_rank_order():
    meeting = Meeting("", {0: Node(2, "a"), 1: Node(3, "b"), 2: Node(1, "c")})
    assert [list(meeting.ranks_of(n)) for n in range(3)] == [[0, 1], [2, 3, 4], [5]]
    assert [meeting.node_of(r) for r in (0, 2, 4, 5, 6)] == [0, 1, 1, 2, None]


@pytest.mark.parametrize("name, ok", [("mnist_lenet-20261125-090351", True), ("../etc", False),
                                      ("a/b", False), ("..", False), (".", False), ("", False),
                                      ("x" * (rendezvous.MAX_NAME + 1), False), (3, False)])
def test_a_run_name_from_the_network_must_be_a_plain_name(name, ok):
    assert rendezvous.plain_name(name) is ok


def _meet_in_thread(gate, box):
    def run():
        try:
            box.append(rendezvous.meet(gate))
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            box.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_node_0_tells_its_run_name_and_learns_the_hosts():
    port = launcher.free_port("127.0.0.1")
    master = f"127.0.0.1:{port}"
    got0, got1 = [], []
    threads = [_meet_in_thread(rendezvous.MeetingPlace(master, 2, 0, 2, 10, run="job-20261125-090351", host="nodeA"), got0),
               _meet_in_thread(rendezvous.MeetingPlace(master, 2, 1, 3, 10, host="nodeB"), got1)]
    for thread in threads:
        thread.join(20)
        assert not thread.is_alive(), "rendezvous.meet did not return"
    [zero], [one] = got0, got1
    zero.rendezvous.close()
    assert one.run == zero.run == "job-20261125-090351" and one.node_rank == 1
    assert zero.nodes[1] == Node(3, "127.0.0.1", "nodeB") and zero.nodes[0].host == "nodeA"
    assert list(one.ranks_of(1)) == [2, 3, 4]          # node 1 knows its block too


def test_a_go_whose_run_name_is_a_path_is_not_followed():
    """Something at the master answers go with a path: the node does not take it for node 0."""
    with socket.socket() as fake:
        fake.bind(("127.0.0.1", 0))
        fake.listen()
        fake.settimeout(10)

        def answer():
            with fake.accept()[0] as conn:
                conn.recv(4096)
                conn.sendall(rendezvous.encode({"go": True, "run": "../../etc"}))
        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        with pytest.raises(rendezvous.NodesMissing, match="something answers at dist.master"):
            rendezvous.meet(rendezvous.MeetingPlace(f"127.0.0.1:{fake.getsockname()[1]}", 2, 1, 1, 1.0))
        thread.join(10)


# ---------------------------------------------------------------- numbering
def test_a_machines_ranks_are_numbered_as_the_job_numbers_them():
    number = supervisor.global_ranks([(0, 2, 2), (1, 3, 2)])
    assert [number(0), number(1)] == [2, 3]
    # a rank gone before its variables were read: its place in the node's block
    meeting = Meeting("", TWO_BY_TWO.nodes, node_rank=1)
    assert supervisor.global_ranks([(0, 2, 2)], meeting)(1) == 3
    assert supervisor.global_ranks([])(1) == 1          # one machine: unchanged


def test_place_of_reads_the_variables_paddles_launcher_gave_a_rank():
    env = dict(os.environ, PADDLE_LOCAL_RANK="1", PADDLE_TRAINER_ID="3", PADDLE_NNODES="2")
    child = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()      # it runs: until exec, /proc shows its parent's environment
        assert place_of(child.pid) == (1, 3, 2)
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert place_of(child.pid) is None


# ---------------------------------------------------------------- reports
def test_the_machine_of_a_killed_rank_names_it_and_its_peers_by_global_rank_and_host():
    here = Machines("nodeB", (2, 3), 2, Meeting("", TWO_BY_TWO.nodes, node_rank=1))
    status = {2: _stopped(2, "nodeB", "gradient all-reduce failed: rank 1 (pid 7) died"),
              3: {"rank": 3, "host": "nodeB", "state": "running", "pid": 7}}
    report = root_cause(status, {3: KILL}, machines=here)
    assert report.lines[0] == "paddle_dist: job failed (exit 137). Root cause: rank 3 (host nodeB) killed by SIGKILL"
    assert report.lines[-1] == "  stopped as a consequence: rank 2 (host nodeB)"


def test_a_rank_that_died_here_is_named_even_when_its_peer_was_seen_ending_first():
    """Rank 3 killed; rank 2's shared-memory exchange saw it die and ended first (5), and
    Paddle's launcher reported only that: the cause is here, not on another machine."""
    here = Machines("nodeB", (2, 3), 2, Meeting("", TWO_BY_TWO.nodes, node_rank=1))
    gone = 2 ** 22 + 7         # above Linux's largest pid: no such process
    status = {2: _stopped(2, "nodeB", f"gradient all-reduce failed: rank 3 (pid {gone}) died during the "
                                      "shared-memory all-reduce"),
              3: {"rank": 3, "host": "nodeB", "state": "running", "pid": gone}}
    report = root_cause(status, {2: errors.EXIT_PEER}, machines=here)
    assert "Root cause: rank 3 (host nodeB) died without reporting an error" in report.lines[0], report.text
    # On the other machine a rank that stopped on the peer failure ends the exchange too:
    # its record says so, and the cause is still elsewhere.
    there = Machines("nodeA", (0, 1), 2, TWO_BY_TWO)
    status = {0: _stopped(0, "nodeA"), 1: _stopped(1, "nodeA", f"gradient all-reduce failed: rank 0 (pid {gone}) "
                                                               "died during the shared-memory all-reduce")}
    assert "Root cause: a rank on another machine, node 1" in root_cause(status, {0: 5}, machines=there).lines[0]


def test_a_machine_whose_ranks_stopped_on_a_peer_names_that_peers_machine():
    here = Machines("nodeA", (0, 1), 2, TWO_BY_TWO)
    # Paddle's launcher saw rank 0 end first (5); it stopped rank 1 itself, unrecorded.
    status = {0: _stopped(0, "nodeA"), 1: {"rank": 1, "host": "nodeA", "state": "running", "pid": 1}}
    report = root_cause(status, {0: errors.EXIT_PEER}, machines=here)
    assert report.code == errors.EXIT_PEER
    assert report.lines[0] == (
        "paddle_dist: job failed (exit 5). Root cause: a rank on another machine, node 1 (host nodeB "
        "at 198.18.0.2, ranks 2-3): this machine's ranks lost their connection to it; that machine's "
        "report names the rank and why")
    assert report.lines[1] == f"  this machine's ranks met: {RESET}"
    assert report.lines[2] == "  stopped as a consequence: rank 0 (host nodeA), rank 1 (host nodeA)"


def test_without_a_peer_address_every_other_machine_is_a_suspect():
    three = Meeting("", {**TWO_BY_TWO.nodes, 2: Node(1, "198.18.0.3", "nodeC")}, 0)
    status = {r: _stopped(r, "nodeA", "gradient all-reduce failed: Timed out") for r in (0, 1)}
    line = root_cause(status, {}, machines=Machines("nodeA", (0, 1), 3, three)).lines[0]
    assert ("node 1 (host nodeB at 198.18.0.2, ranks 2-3) or node 2 (host nodeC at 198.18.0.3, rank 4): "
            "this machine's ranks stopped when a peer failed; those machines' reports name") in line


def test_a_local_failure_is_still_the_root_cause_on_several_machines():
    here = Machines("nodeA", (0, 1), 2, TWO_BY_TWO)
    status = {0: _stopped(0, "nodeA"), 1: {"rank": 1, "host": "nodeA", "state": "failed",
                                           "error_type": "ValueError", "error": "bad", "time": 1}}
    assert "Root cause: rank 1 (host nodeA) raised ValueError: bad" in root_cause(status, machines=here).lines[0]


def test_one_machine_reports_as_before():
    status = {0: _stopped(0, "nodeA")}
    lines = root_cause(status, {1: KILL}).lines
    assert lines[0] == "paddle_dist: job failed (exit 137). Root cause: rank 1 killed by SIGKILL"
    assert lines[-1] == "  stopped as a consequence: rank 0"
    assert "before any rank reported" in root_cause(status, {}).lines[0]


# ---------------------------------------------------------------- console
def test_the_first_rank_of_every_machine_prints_labelled_and_one_machine_is_unchanged():
    one = DistEnv(global_rank=1, local_rank=0, world_size=2, nnodes=1)
    node1 = DistEnv(global_rank=2, local_rank=0, world_size=4, local_world_size=2, node_rank=1, nnodes=2)
    second = DistEnv(global_rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1, nnodes=2)
    assert progress.prints(DistEnv()) and not progress.prints(one)
    assert progress.prints(node1) and not progress.prints(second)
    assert progress.console_label(DistEnv()) == ""
    assert progress.console_label(node1, "nodeB") == "[node 1 nodeB] "


def test_exits_seen_by_the_launcher_keep_their_meaning():
    # RankSupervision/SpawnSupervision (one machine) pass exits, never Machines: unchanged behaviour
    report = root_cause({}, exits=[Exit(0, -6, 10.05), Exit(1, KILL, 10.0)])
    assert "Root cause: rank 1 killed by SIGKILL" in report.lines[0]


def test_meeting_of_renumbers_in_node_rank_order():
    met = Meeting.of("run", {0: Node(2, "a"), 2: Node(1, "c"), 3: Node(2, "d")}, 4, node_rank=3)
    assert (met.node_rank, met.absent, met.world_size) == (2, (1,), 5)
    assert [met.nodes[i].address for i in range(3)] == ["a", "c", "d"]
    assert met.ranks_of(2) == range(3, 5)
