"""Unit tests for paddle_dist.runtime.inject: injected faults."""

import pytest

from paddle_dist.runtime import inject


# ---------------------------------------------------------------- faults.inject=lose
@pytest.mark.parametrize("parent_cmdline, killed", [
    (["python", "-m", "paddle.distributed.launch", "--nnodes", "2", "train.py"], 100),   # its launcher's
    (["python", "train.py"], 200),                                                       # its parent
])
def test_lose_kills_the_machines_paddle_dist_launcher(monkeypatch, parent_cmdline, killed):
    monkeypatch.setattr(inject.os, "getppid", lambda: 200)
    monkeypatch.setattr(inject.procfs, "cmdline", lambda pid: parent_cmdline if pid == 200 else [])
    monkeypatch.setattr(inject.procfs, "parent_of", lambda pid: 100)
    assert inject._machine_launcher() == killed
