"""Shared test setup: the repo root on sys.path, and a guard against leaked environment variables.

paddle_dist.runtime.env is the only module allowed to touch `os.environ`, and a test that leaves a
variable behind silently changes every test after it (device selection, ranks, OMP threads).
The autouse `no_environ_leak` fixture fails any test that adds, changes or removes a variable
without undoing it; `monkeypatch.setenv` / `delenv` are fine, because they are undone first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List, Mapping

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# What the user's shell gave us, before `import paddle` edits it: Paddle sets
# OMP_NUM_THREADS=1 and CUSTOM_DEVICE_ROOT="" on import.
ENVIRON_BEFORE_PADDLE: Dict[str, str] = dict(os.environ)

# Import Paddle once, here (after paddle_dist, which silences its ccache warning and notes
# the user's variables), so its import-time edits to os.environ happen before the first
# snapshot and are not a "leak" of whichever test happens to import it first.
import paddle_dist  # noqa: E402,F401
import paddle  # noqa: E402,F401

pytest_plugins = ["pytester"]

# pytest itself rewrites this one in every phase (setup, call, teardown).
IGNORED = frozenset({"PYTEST_CURRENT_TEST"})


def environ_diff(before: Mapping[str, str], after: Mapping[str, str]) -> List[str]:
    """Describe how `after` differs from `before`: one 'NAME added/removed/changed' per variable.

    Example:
        environ_diff({"A": "1"}, {"A": "2", "B": "x"})  # ['A changed', 'B added']
    """
    out = []
    for name in sorted((set(before) | set(after)) - IGNORED):
        if name not in before:
            out.append(f"{name} added")
        elif name not in after:
            out.append(f"{name} removed")
        elif before[name] != after[name]:
            out.append(f"{name} changed")
    return out


def reset_environ(snapshot: Mapping[str, str]) -> None:
    """Make os.environ equal `snapshot` again (only the variables that differ are touched)."""
    for name in list(os.environ):
        if name not in snapshot and name not in IGNORED:
            del os.environ[name]
    for name, value in snapshot.items():
        if name not in IGNORED and os.environ.get(name) != value:
            os.environ[name] = value


@pytest.fixture(autouse=True)
def no_environ_leak(request, monkeypatch):
    """Fail the test if it leaves os.environ different from how it found it.

    Requesting `monkeypatch` here makes it the same object the test gets; undoing it
    before comparing means monkeypatch.setenv/delenv never count as leaks, whatever the
    fixture teardown order.
    """
    before = dict(os.environ)
    yield
    monkeypatch.undo()
    leaked = environ_diff(before, os.environ)
    if leaked:
        reset_environ(before)   # one leak must not cascade into the next tests
        pytest.fail(f"{request.node.nodeid} leaked environment variables: {', '.join(leaked)}; "
                    "use monkeypatch.setenv/delenv or restore them", pytrace=False)


@pytest.fixture
def environ_before_paddle() -> Dict[str, str]:
    """os.environ as the test process started, before Paddle's import edited it."""
    return dict(ENVIRON_BEFORE_PADDLE)


def pytest_configure(config):
    # The compat stage (`make compat`, in .ci/run) runs these on other Paddle versions.
    config.addinivalue_line("markers", "compat: a key flow that must hold on every supported Paddle")
