"""SIGKILL a process while it saves checkpoints: `latest` must always name a whole one.

tests/integration/scripts/save_forever.py saves in a loop. Two kinds of crash:
- from outside, on one root, round after round: the test kills it right after answering
  one of its lines, "saving N" (the kill lands in or before the write) or "saved N"
  (between saves). The script waits for an answer to every line (--paced), so it is never
  more than one line ahead of the test, however the two are scheduled;
- from inside, at an exact point of a write (--die-before), one fresh root per point.
No sleeps: output is read line by line, and a watchdog bounds every process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import pytest

from paddle_dist import checkpoint as ck
from paddle_dist.runs.layout import Run

from .procs import PY, ROOT, session_members

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "save_forever.py"
TIMEOUT = 120          # seconds per process: Paddle's import plus a few small saves
# Output lines go saving 1, saved 1, saving 2, ...: line 5 is "saving 3", so >= 2 saves are done.
KILL_AFTER_LINES = (5, 6, 7, 8, 9)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _child_env() -> dict:
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_until_killed(root: Path, log: Path, kill_after: Optional[int] = None,
                     die_before: str = "", saves: int = 0) -> List[Tuple[str, int]]:
    """Run save_forever.py on `root`; SIGKILL it right after its `kill_after`-th line (or
    let it kill itself: --die-before, or after `saves` saves). Returns its lines as
    (word, step) pairs."""
    paced = kill_after is not None
    extra = ["--die-before", die_before] if die_before else []
    extra += ["--saves", str(saves)] if saves else []
    extra += ["--paced"] if paced else []
    with open(log, "w") as err:
        proc = subprocess.Popen([PY, str(SCRIPT), str(root)] + extra, cwd=str(ROOT),
                                env=_child_env(), text=True, stdout=subprocess.PIPE,
                                stdin=subprocess.PIPE if paced else subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
    watchdog = threading.Timer(TIMEOUT, _kill_group, (proc.pid,))
    watchdog.start()
    lines: List[Tuple[str, int]] = []
    try:
        for line in proc.stdout:
            word, step = line.split()
            lines.append((word, int(step)))
            if paced:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.write("go\n")
                    proc.stdin.flush()
            if len(lines) == kill_after:
                _kill_group(proc.pid)
                break
    finally:
        watchdog.cancel()
        _kill_group(proc.pid)
        proc.wait(timeout=60)
        proc.stdout.close()
        if proc.stdin:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        left = session_members(proc.pid)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind by {SCRIPT.name}: {left}"
    assert proc.returncode == -signal.SIGKILL, f"exit {proc.returncode}: {lines}\n{log.read_text()[-3000:]}"
    return lines


def check_latest(root: Path) -> int:
    """`latest` names a checkpoint that loads, whose files all belong to its step."""
    state = ck.load(ck.latest(root))
    step = state.meta["global_step"]
    np.testing.assert_array_equal(state.model["weight"], np.full((256, 256), step, "float32"))
    np.testing.assert_array_equal(state.model["bias"], np.full((256,), step, "float32"))
    assert state.optimizer and state.rng_arrays
    return step


def check_every_checkpoint(root: Path) -> None:
    # Pruning renames a checkpoint away before deleting it: every ckpt_* left is whole.
    for path in root.glob("ckpt_*"):
        assert ck.load(path).meta["global_step"] == int(path.name[5:])


def test_sigkill_from_outside_never_breaks_latest(tmp_path):
    root, step = Run(tmp_path).checkpoints, 0
    for round_, kill_after in enumerate(KILL_AFTER_LINES):
        lines = run_until_killed(root, tmp_path / f"round{round_}.log", kill_after=kill_after)
        assert len(lines) == kill_after, lines
        assert lines[0] == ("saving", step + 1), (lines, step)
        # Killed after "saved N": N. After "saving N": N - 1, or N if the kill came after
        # the write's last rename. The script can't be further: it waits for "saved N"'s answer.
        word, last = lines[-1]
        step = check_latest(root)
        assert step == last or (word == "saving" and step == last - 1), (step, lines)
    check_every_checkpoint(root)


# Die just before: (what is on disk then) -> the step `latest` must name.
POINTS = [
    ("checkpoint._save_npz:1", 2),      # temp dir made, empty
    ("checkpoint._save_npz:3", 2),      # model.npz and optimizer.npz written
    ("checkpoint._write_synced:1", 2),  # all arrays, no meta.json
    ("os.replace:1", 2),                # complete temp dir, not renamed into place
    ("os.replace:2", 2),                # ckpt_3 in place, `latest` not yet moved
    ("os.replace:3", 3),                # `latest` names ckpt_3; pruning not begun
    ("shutil.rmtree:1", 3),             # ckpt_1 renamed away for pruning, not deleted
]


@pytest.mark.parametrize("point, expected", POINTS, ids=[p for p, _ in POINTS])
def test_sigkill_at_each_point_of_a_write(tmp_path, point, expected):
    root = Run(tmp_path).checkpoints
    lines = run_until_killed(root, tmp_path / "die.log", die_before=point)
    assert lines == [("saving", 1), ("saved", 1), ("saving", 2), ("saved", 2), ("saving", 3)]
    assert check_latest(root) == expected
    check_every_checkpoint(root)
    # The next run carries on from there, over whatever the crash left behind. It stops
    # itself after two saves: a kill from outside after "saved" may land one save later.
    lines = run_until_killed(root, tmp_path / "next.log", saves=2)
    assert lines == [("saving", expected + 1), ("saved", expected + 1),
                     ("saving", expected + 2), ("saved", expected + 2)]
    assert check_latest(root) == expected + 2
    check_every_checkpoint(root)
    wreckage = [p.name for p in root.iterdir() if p.name.startswith(".ckpt_00000000") and
                int(p.name[6:15]) <= 3]
    assert not wreckage, "later saves sweep what a crash left behind"
