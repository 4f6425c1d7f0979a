"""Unit tests for paddle_dist.runs.report: which rank a job's end is blamed on (its status records,
else the order of the exits the launcher saw), and the report's last line."""

import signal

import pytest

from paddle_dist import errors
from paddle_dist.runs.report import Exit, first_failure, root_cause, with_resume

KILL, ABRT, TERM = -signal.SIGKILL, -signal.SIGABRT, -signal.SIGTERM


@pytest.mark.parametrize("exits, cause", [
    # rank 1 killed; rank 0 aborted by gloo 50 ms later
    ([Exit(0, ABRT, 10.05), Exit(1, KILL, 10.0)], 1),
    # the other way round: the order of the exits, not the rank number
    ([Exit(0, KILL, 10.0), Exit(1, ABRT, 10.05)], 0),
    # 3 ranks, rank 2 killed, both others aborted
    ([Exit(0, ABRT, 10.2), Exit(1, ABRT, 10.1), Exit(2, KILL, 10.0)], 2),
    # seen together: the SIGABRT is the consequence, even when seen a little first
    ([Exit(0, ABRT, 10.0), Exit(1, KILL, 10.01)], 1),
    ([Exit(0, ABRT, 10.0), Exit(1, 1, 10.3)], 1),
    # a SIGABRT alone, or long before anything else, is the cause
    ([Exit(0, ABRT, 10.0), Exit(1, 0, 11.0)], 0),
    ([Exit(0, ABRT, 10.0), Exit(1, 1, 12.0)], 0),
    # a rank that finished is no failure
    ([Exit(0, 0, 9.0), Exit(1, 1, 10.0)], 1),
    # a DataLoader worker killed: its rank raised (exit 1), the peer aborted
    ([Exit(0, ABRT, 10.3), Exit(1, 1, 10.0)], 1),
])
def test_first_failure_follows_the_order_of_exits(exits, cause):
    assert first_failure(exits).rank == cause


def test_a_process_the_launcher_signalled_is_never_the_cause():
    # rank 0 blocked: the launcher sent SIGTERM at 15.0, it died of it at 15.1; rank 1
    # had died at 10.0 with exit 1 -- but its exit was SEEN after rank 0's.
    exits = [Exit(0, TERM, 15.1, signalled_at=15.0), Exit(1, 1, 15.2)]
    assert first_failure(exits).rank == 1
    # killed after its grace: same
    exits = [Exit(0, KILL, 20.0, signalled_at=15.0), Exit(1, KILL, 10.0)]
    assert first_failure(exits).rank == 1
    # signalled only after it had ended: its own failure
    assert first_failure([Exit(0, 1, 10.0, signalled_at=11.0)]).rank == 0
    # every failure the launcher's doing: no cause
    assert first_failure([Exit(0, TERM, 15.1, signalled_at=15.0), Exit(1, 0, 9.0)]) is None


def test_root_cause_of_a_script_without_status_names_the_first_failure():
    exits = [Exit(0, ABRT, 10.05), Exit(1, KILL, 10.0)]
    report = root_cause({}, exits=exits, logs={0: "log/workerlog.0", 1: "log/workerlog.1"})
    assert report.code == 137
    assert report.lines[0] == "paddle_dist: job failed (exit 137). Root cause: rank 1 killed by SIGKILL"
    assert "  log: log/workerlog.1" in report.lines
    assert report.lines[-1] == "  stopped as a consequence: rank 0 (killed by SIGABRT)"
    assert root_cause({}, exits=[Exit(0, 3, 1.0), Exit(1, ABRT, 1.1)]).code == 3


def test_status_records_still_win_over_the_exit_order():
    status = {0: {"rank": 0, "state": "failed", "time": 5.0, "error_type": "ValueError",
                  "error": "bad", "exit_code": 1},
              1: {"rank": 1, "state": "running"}}
    exits = [Exit(0, 1, 10.5), Exit(1, KILL, 10.0)]
    report = root_cause(status, exits=exits)
    assert "Root cause: rank 0 raised ValueError: bad" in report.lines[0]
    # a rank that recorded it stopped because of a peer is no candidate either
    status = {0: {"rank": 0, "state": "running"}, 1: {"rank": 1, "state": "stopped"}}
    exits = [Exit(0, KILL, 10.5), Exit(1, errors.EXIT_PEER, 10.0)]
    assert "Root cause: rank 0 killed by SIGKILL" in root_cause(status, exits=exits).lines[0]


def test_a_breach_is_the_root_cause_ahead_of_the_gloo_failure_that_follows_it(tmp_path):
    """Rank 0 went on after rank 1 stopped the job for a breach (exit 6) and failed in gloo,
    even recording that failure first: the breach, with the line rank 1 printed, is named."""
    log = tmp_path / "workerlog.1"
    log.write_text("paddle_dist: security: rank 1 read a verdict in Paddle's store at 127.0.0.1:4 that "
                   "does not prove the job's token: something outside the job wrote it; the job was stopped\n")
    status = {0: {"rank": 0, "state": "failed", "time": 5.0, "error_type": "RuntimeError",
                  "error": "[gloo] TIMEOUT", "exit_code": 1}}
    exits = [Exit(0, 1, 10.0), Exit(1, errors.EXIT_SECURITY, 10.5)]
    report = root_cause(status, exits=exits, logs={1: str(log)})
    assert report.code == errors.EXIT_SECURITY == 6
    assert report.lines[0].startswith("paddle_dist: job failed (exit 6). Root cause: rank 1 found a breach: "
                                      "rank 1 read a verdict in Paddle's store at 127.0.0.1:4 that does not")
    assert report.lines[-1] == "  stopped as a consequence: rank 0 (exited with code 1)"
    assert root_cause(status, exits=exits[:1]).code == 1      # without the breach: the gloo failure


GLOO_START = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
              "    dist.init_parallel_env()\n"
              "  File \"paddle/distributed/parallel.py\", line 1172, in init_parallel_env\n"
              "    pg = _new_process_group_impl(\n")


@pytest.mark.parametrize("message", [
    "RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 0 "
    "peer_str = [127.0.0.1]:40123",
    "RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:779] connect [127.0.0.1]:40123: "
    "Connection refused",
])
def test_gloo_failing_to_connect_the_ranks_at_start_is_named_in_one_line(tmp_path, message):
    """A script's rank (its log) and a paddle_dist rank (its record): the line that says
    what it is and what to do follows the root cause."""
    log = tmp_path / "workerlog.0"
    log.write_text(GLOO_START + message + "\n")
    exits = [Exit(0, 1, 10.0), Exit(1, TERM, 10.2, signalled_at=10.1)]
    hint = ("  gloo could not connect the ranks while the process group started (init_parallel_env); seen now and "
            "then on a busy machine, it is not caused by the job or its data: run the same command again")
    assert root_cause({}, exits=exits, logs={0: str(log)}).lines[1] == hint
    record = {"rank": 0, "state": "failed", "time": 5.0, "error_type": "RuntimeError",
              "error": message.split(": ", 1)[1], "traceback": GLOO_START + message, "exit_code": 1}
    assert root_cause({0: record}, exits=exits).lines[1] == hint
    # The same gloo words in a collective during training, or no gloo at all: no such line.
    later = dict(record, traceback=record["traceback"].replace("init_parallel_env", "broadcast"))
    assert hint not in root_cause({0: later}, exits=exits).lines
    assert hint not in root_cause({0: dict(record, error="bad", traceback=GLOO_START + "ValueError: bad")},
                                  exits=exits).lines


STORE_ON_A_TAKEN_PORT = """
import socket
taken = socket.socket()
taken.bind(("127.0.0.1", 0))
taken.listen()
import paddle
from paddle.base import core
print("port", taken.getsockname()[1], flush=True)
core.TCPStore("127.0.0.1", taken.getsockname()[1], True, 1, 30)
"""


def test_a_store_that_could_not_listen_on_its_port_is_named_with_the_port(tmp_path):
    """Paddle's own store, started on a port another socket listens on, as rank 0's store
    is when its port was taken after the pick: its real output (a libuv abort, or the older
    store's ValueError) gives one line naming the port and what to do."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STORE_ON_A_TAKEN_PORT], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, done.stdout + done.stderr
    port = done.stdout.split("port ", 1)[1].split()[0]
    log = tmp_path / "workerlog.0"
    log.write_text(done.stdout + done.stderr)
    lines = root_cause({}, exits=[Exit(0, 1, 10.0)], logs={0: str(log)}).lines
    assert lines[1].startswith(f"  the process group's store could not listen on port {port}: another process "
                               "took it after it was picked; not caused by the job: run the same command again"), lines
    assert all("store could not listen" not in line for line in root_cause(
        {}, exits=[Exit(0, 1, 10.0)], logs={0: str(tmp_path / "none.log")}).lines)


def test_every_rank_ending_with_75_is_a_requested_stop_without_status():
    exits = [Exit(0, errors.EXIT_PREEMPTED, 1.0), Exit(1, errors.EXIT_PREEMPTED, 1.1)]
    report = root_cause({}, exits=exits)
    assert report.code == errors.EXIT_PREEMPTED and "stopped on request" in report.text


def test_a_report_without_a_run_ends_with_the_command_that_runs_it_again():
    report = with_resume(root_cause({}, exits=[Exit(0, KILL, 1.0)]), None,
                         ["python", "-m", "paddle_dist.launch", "my script.py"])
    assert report.lines[-1] == "paddle_dist: to run it again, run: python -m paddle_dist.launch 'my script.py'"
