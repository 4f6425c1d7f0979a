"""Shared test setup: the repo root on sys.path, Paddle imported once, a guard against leaked
environment variables, the suite's markers, and how `make test` groups and orders the tests
for pytest-xdist (tests/stopping.py, a plugin, cleans up after a stopped run).

paddle_dist reads and writes `os.environ` in a few modules, nearly all in runtime/ (runtime/env.py
names them), and a test that leaves a variable behind silently changes every test after it
(device selection, ranks, OMP threads).
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


def worker_port_range(worker: str = os.environ.get("PYTEST_XDIST_WORKER", "")) -> str:
    """The ports this test process and what it starts pick from ("low:high"), 1,000 of
    them, below the kernel's ephemeral ports and apart from every other pytest-xdist
    worker's. A port found free and bound a moment later (Paddle's launcher picks its
    store's so; so do paddle_dist's launcher and tests/oracles.py's free_port) could
    otherwise be taken meanwhile by another test's outgoing connection: Paddle's store
    then aborts its rank (SIGABRT in TCPServer::create)."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    slot = int(worker[2:]) + 1 if worker[2:].isdigit() else 0
    low = 10000 + 1000 * slot
    if low + 999 >= ephemeral:
        return os.environ.get("PORT_RANGE", "")
    return f"{low}:{low + 999}"


# Set before the snapshot below: every test's processes inherit it (PORT_RANGE is the
# variable Paddle's launcher reads for its ports; paddle_dist's launcher reads it too).
if worker_port_range():
    os.environ["PORT_RANGE"] = worker_port_range()

# What the user's shell gave us, before `import paddle` edits it: Paddle sets
# OMP_NUM_THREADS=1 and CUSTOM_DEVICE_ROOT="" on import.
ENVIRON_BEFORE_PADDLE: Dict[str, str] = dict(os.environ)

# Import Paddle once, here (after paddle_dist, which silences its ccache warning and notes
# the user's variables), so its import-time edits to os.environ happen before the first
# snapshot and are not a "leak" of whichever test happens to import it first.
import paddle_dist  # noqa: E402,F401
import paddle  # noqa: E402,F401

# tests.stopping: a run stopped by SIGTERM or SIGINT cleans up what its tests started.
pytest_plugins = ["pytester", "tests.stopping"]

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


@pytest.hookimpl(optionalhook=True)     # pytest-xdist: in the main process, before it starts workers
def pytest_xdist_setupnodes(config, specs):
    """The workers inherit this process's environment: the one it started with, not
    Paddle's edits of it (paddle_dist, imported again in each worker, must see the user's
    OMP_NUM_THREADS or its absence, as in a run without xdist). This process runs no test."""
    reset_environ(ENVIRON_BEFORE_PADDLE)


def pytest_configure(config):
    # The compat stage (`make compat`, in .ci/run) runs these on other Paddle versions.
    config.addinivalue_line("markers", "compat: a key flow that must hold on every supported Paddle")
    config.addinivalue_line("markers", "waits: most of its time is a timeout running out, not work: `make test` "
                                       "spreads these over the run, so that other tests' processes use the cores meanwhile")
    config.addinivalue_line("markers", "serial: run alone: `make test` runs these after the others, "
                                       "without pytest-xdist (timing between a job's ranks matters)")
    # pytest-xdist's own marker, declared here too so that a run without xdist accepts it.
    config.addinivalue_line("markers", "xdist_group(name): run on the same pytest-xdist worker "
                                       "as the other tests of this group (make test: --dist loadgroup)")


SHARED_SCOPES = ("package", "module", "class", "session")


@pytest.hookimpl(tryfirst=True)     # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Keep the users of one shared fixture on one pytest-xdist worker.

    `make test` runs the suite with pytest-xdist (-n N --dist loadgroup): each worker is a
    pytest session of its own, so a module- or session-scoped fixture of this suite (a
    trained run several tests read, the Slurm cluster) would be built again on every
    worker that runs one of its tests. Every test that uses such a fixture, directly or
    through another, gets an xdist_group mark naming it; tests linked through fixtures
    they share, or through a group they are marked with by hand, end up in one group (one
    worker), and the fixture is built once, as in a run without xdist. Without --dist
    loadgroup the marks change nothing.
    """
    parent: Dict[str, str] = {}

    def find(key: str) -> str:
        while parent.setdefault(key, key) != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    keys_of, by_hand = {}, {}
    for item in items:
        given = [str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")]
        keys = [f"group:{name}" for name in given]
        info = getattr(item, "_fixtureinfo", None)
        for name in (info.names_closure if info else []):
            defs = info.name2fixturedefs.get(name)
            if not defs:
                continue
            fixturedef = defs[-1]
            module = getattr(fixturedef.func, "__module__", "") or ""
            if fixturedef.scope in SHARED_SCOPES and module.split(".")[0] == "tests":
                keys.append(f"{fixturedef.baseid or module}::{name}")
        for key in keys[1:]:
            parent[find(key)] = find(keys[0])
        keys_of[item] = keys
        by_hand[item] = given
    # A group marked by hand names its whole set (xdist joins the names of every mark an
    # item has: an item marked by hand gets no second mark).
    named: Dict[str, str] = {}
    for item, given in by_hand.items():
        for name in given:
            root = find(f"group:{name}")
            if named.setdefault(root, name) != name:
                raise pytest.UsageError(f"xdist groups {named[root]!r} and {name!r} share a fixture; "
                                        "mark them as one group")
    for item, keys in keys_of.items():
        if keys and not by_hand[item]:
            root = find(keys[0])
            item.add_marker(pytest.mark.xdist_group(named.get(root, root)))
    items[:] = spread_waits(items)


def spread_waits(items: List[pytest.Item]) -> List[pytest.Item]:
    """The tests marked `waits`, spread evenly over the integration tests (in order), so that
    pytest-xdist's workers rarely wait at the same time: run one after another, as their
    files' order had them, they left a core idle for a minute of `make test`. Unit tests,
    quick and many, stay last, where they fill the workers' ends."""
    waiting = [item for item in items if item.get_closest_marker("waits")]
    rest = [item for item in items if not item.get_closest_marker("waits")]
    span = sum(1 for item in rest if item.nodeid.startswith("tests/integration/"))
    out = list(rest)
    for n, item in reversed(list(enumerate(waiting))):     # from the back: earlier places stay put
        out.insert(round((n + 0.5) * span / len(waiting)), item)
    return out


@pytest.hookimpl(trylast=True)      # after xdist's own hook has read the xdist_group marks
def pytest_collection_finish(session):
    """Fail at once where pytest-xdist does not group (the worker's node ids carry no
    @group): with pytest 9.2 and pytest-xdist 3.8 the mark is silently ignored
    (pytest-xdist issue #1386), the shared fixtures are built on every worker and the
    Slurm tests start a cluster each. setup.cfg's test extra pins a pytest that groups."""
    config = session.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items
            if any(item.iter_markers("xdist_group")) and "@" not in item.nodeid.rpartition("]")[2]]
    if lost:
        raise pytest.UsageError(f"pytest-xdist ignored the xdist_group of {len(lost)} tests (first: {lost[0]}); "
                                "this pytest and pytest-xdist do not group: pip install 'pytest<9.2' "
                                "(pytest-xdist issue #1386)")
