"""What the tests compare a run with, written once: a reference run made once per module,
a run's latest checkpoint and records (through paddle_dist.runs.layout, never a path built
by hand), its final weights, the largest difference between two sets of arrays, how a
command ended (exit code and stderr, run in this process), a free port.

numpy and the standard library only, and paddle_dist.runs (no paddle): the unit tests and
the integration tests both import it.

Example:
    @pytest.fixture(scope="module")
    def uninterrupted(tmp_path_factory):
        def make(out: Path, api: str) -> Path:
            check(run(JOB + ["-o", f"train.api={api}", "-o", f"output.run_dir={out}"]))
            return out
        return References(tmp_path_factory, "clean", make)

    def test_continued(uninterrupted, tmp_path):
        ...
        assert max_difference(final_weights(tmp_path), final_weights(uninterrupted["loop"])) <= 1e-6
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, Hashable, Iterable, List, NamedTuple, Optional

import numpy as np

from paddle_dist.runs.layout import Run, latest

Arrays = Dict[str, np.ndarray]


# ------------------------------------------------------------------ reference runs
class References:
    """Runs made once per key (an API level, a world size, ...), the first time a test asks
    for one, each in a fresh folder: the clean run that a stopped and continued one must
    end like. A module-scoped fixture returns one, so a module's tests share its runs and
    a selection of them (-k) makes only the runs it needs. A run that failed is not made
    again: every later test that asks for it fails with the same error, as a fixture's
    error would.

    Example:
        refs = References(tmp_path_factory, "clean", lambda out, api: make_run(out, api))
        refs["loop"]            # make_run(<tmp>/clean-loop0, "loop"), once
    """

    def __init__(self, tmp_path_factory, name: str, make: Callable[[Path, Any], Any]):
        self._factory, self._name, self._make = tmp_path_factory, name, make
        self._made: Dict[Hashable, Any] = {}
        self._failed: Dict[Hashable, BaseException] = {}

    def __getitem__(self, key: Hashable) -> Any:
        if key in self._failed:
            raise self._failed[key]
        if key not in self._made:
            words = key if isinstance(key, tuple) else (key,)
            folder = self._factory.mktemp("-".join([self._name, *map(str, words)]))
            try:
                self._made[key] = self._make(folder, key)
            except Exception as e:      # noqa: BLE001  (re-raised, and again for the next test)
                self._failed[key] = e
                raise
        return self._made[key]


# ------------------------------------------------------------------ a run's files
def latest_checkpoint(run_dir: Path, best: bool = False) -> Path:
    """The checkpoint a run would resume from (`best`: its best checkpoint), as
    paddle_dist.runs.layout finds it; fails when the run has none.

    Example:
        latest_checkpoint(run_dir) / "meta.json"     # <run>/checkpoints/ckpt_000000120/meta.json
    """
    run = Run(run_dir)
    root = run.best if best else run.checkpoints
    found = latest(root)
    assert found is not None, f"no checkpoint in {root}"
    return found


def checkpoint_arrays(checkpoint: Path, files: Optional[Iterable[str]] = None) -> Arrays:
    """Every array of a checkpoint's .npz files (or of the named ones: "model", "optimizer",
    ...), keyed "<file>.npz:<key>".

    Example:
        checkpoint_arrays(latest_checkpoint(run_dir), ["model", "optimizer"])
    """
    paths = sorted(checkpoint.glob("*.npz")) if files is None else [checkpoint / f"{f}.npz" for f in files]
    return {f"{path.name}:{key}": value for path in paths for key, value in np.load(path).items()}


def final_weights(run_dir: Path, best: bool = False) -> Arrays:
    """The model's arrays in a run's latest checkpoint (`best`: its best one), by name."""
    return dict(np.load(latest_checkpoint(run_dir, best) / "model.npz"))


def read_metrics(run_dir: Path) -> dict:
    """A finished run's metrics.json."""
    return json.loads(Run(run_dir).metrics.read_text())


def rank_status(run_dir: Path, rank: int) -> dict:
    """A rank's status record (status/rank<R>.json), as written."""
    return json.loads(Run(run_dir).rank_status(rank).read_text())


def rank_statuses(run_dir: Path, ranks: int = 2) -> List[dict]:
    """The status records of ranks 0..ranks-1."""
    return [rank_status(run_dir, rank) for rank in range(ranks)]


# ------------------------------------------------------------------ comparing arrays
def max_difference(a: Arrays, b: Arrays) -> float:
    """The largest absolute difference between two sets of arrays with the same keys (in
    float64, whatever the arrays hold: no rounding, no wrap-around of integers).

    Example:
        assert max_difference(final_weights(resumed), final_weights(clean)) <= 1e-6
    """
    assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
    return max(float(np.abs(a[k].astype("float64") - b[k].astype("float64")).max()) for k in a)


def differing(a: Arrays, b: Arrays) -> List[str]:
    """The keys whose arrays are not bitwise equal (the same keys in both)."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return [k for k in a if not np.array_equal(a[k], b[k])]


# ------------------------------------------------------------------ a command's ending
class Ending(NamedTuple):
    """How a command run in this process ended: its exit code, the non-empty lines it wrote
    to stderr, and its stdout."""
    code: int
    lines: List[str]
    out: str


def ending(capfd, call: Callable[[], Any]) -> Ending:
    """Run a command's entry in this process (`call` exits, as options.run does) and say how
    it ended; its output is read at the file descriptors (what a terminal would show). A
    bad-input matrix checks its one line this way; one case per command runs as a real
    process, for the exit-code path.

    Example:
        done = ending(capfd, lambda: run(train_main, ["-o", "train.epoch=3"]))
        assert done.code == 2 and len(done.lines) == 1 and "train.epochs" in done.lines[0]
    """
    capfd.readouterr()
    try:
        call()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    else:
        raise AssertionError("the command returned instead of exiting")
    out, err = capfd.readouterr()
    return Ending(code, [line for line in err.splitlines() if line.strip()], out)


def module_from(path: Path, name: str = ""):
    """The Python file `path` (an example, a tool, a test's script) as a module, run once
    per call.

    Example:
        lm = module_from(ROOT / "docs" / "examples" / "causal_lm.py")
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(name or Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ the machine
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at this moment on `host`, from this test process's
    PORT_RANGE (tests/conftest.py). Another process may take it before the test does: use
    it at once.

    Example:
        f"dist.master=127.0.0.1:{free_port()}"
    """
    import os

    from paddle_dist.runtime.variables import port_range
    from paddle_dist.security.rankgate import free_port as pick
    return pick(host, port_range(os.environ))


# ------------------------------------------------------------------ the other user
NOBODY = 65534          # the other local user the security tests play (uid and gid)


def as_nobody(act: Callable[[], None], umask: Optional[int] = 0) -> None:
    """Run `act()` in a forked child that became uid/gid 65534 (`umask`: 0, what it makes
    anyone may write; None: left as it is); the child does file operations only, within
    30 s (SIGALRM), and never returns into pytest. Fails when `act` raised."""
    import os
    import signal

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(30)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            if umask is not None:
                os.umask(umask)
            act()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def shared_folder():
    """A directory every user may add to, as /tmp is (sticky), outside pytest's own (0700)
    temporary directories: a generator for a fixture (it removes the folder after)."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="pd-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
