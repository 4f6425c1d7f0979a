"""Unit tests for paddle_dist.procfs, the /proc readers."""

from __future__ import annotations

import os

from paddle_dist.procfs import port_holder

from tests.oracles import free_port
from tests.unit.doctor.test_facts import taken_port  # noqa: F401  (fixtures)


def test_port_holder_finds_this_process(taken_port):
    pid, cmdline = port_holder(taken_port)
    assert pid == os.getpid()
    own = open("/proc/self/cmdline", "rb").read().split(b"\0")[0].decode()
    assert cmdline.startswith(own)
    assert port_holder(free_port()) is None
