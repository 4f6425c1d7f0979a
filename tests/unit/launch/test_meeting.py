"""Unit tests for paddle_dist.launch.meeting: waiting for the other machines, and how that wait ends
(SIGTERM, a missing machine)."""

import signal
import threading
import time

from paddle_dist import errors
from paddle_dist.launch import launcher
from paddle_dist.launch.meeting import wait_for_machines

from tests.unit.launch.test_rendezvous import _gate


def test_meet_turns_sigterm_into_143_at_once(capsys):
    port = launcher.free_port("127.0.0.1")
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, signal.raise_signal, (signal.SIGTERM,))
    timer.start()
    started = time.monotonic()
    assert wait_for_machines(_gate(port, 0, timeout=30))[0] == 143
    assert time.monotonic() - started < 5
    assert "stopped on request while waiting for the other machines" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_meet_returns_3_with_the_line(capsys):
    assert wait_for_machines(_gate(launcher.free_port("127.0.0.1"), 1, timeout=0.3))[0] == errors.EXIT_RENDEZVOUS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "node_rank 0 missing" in err[0]
