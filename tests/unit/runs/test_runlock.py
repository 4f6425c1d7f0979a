"""paddle_dist/runs/runlock.py: a run held by one process is refused to another until it
ends, the holder is named, and no lock file is opened through a link."""

import os
import subprocess
import sys

from paddle_dist.runs import runlock


def test_a_held_run_is_refused_to_another_process_and_its_holder_named(tmp_path):
    assert runlock.hold(tmp_path) and runlock.hold(tmp_path)       # holding twice is holding
    code = "import sys; from paddle_dist.runs import runlock; sys.exit(0 if runlock.hold(sys.argv[1]) else 3)"
    other = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert other.returncode == 3
    assert runlock.holder(tmp_path) == f"pid {os.getpid()} on {os.uname().nodename}"
    runlock.release(tmp_path)
    assert subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60).returncode == 0


def test_no_lock_file_is_opened_through_a_link(tmp_path):
    (canary := tmp_path / "canary").write_text("kept\n")
    (run := tmp_path / "run").mkdir()
    (run / runlock.LOCK).symlink_to(canary)
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for attempt in (lambda: runlock.hold(run), lambda: runlock.locked(fd).__enter__()):
            try:
                attempt()
            except OSError:
                pass
            else:
                raise AssertionError("a lock taken through a link")
    finally:
        os.close(fd)
    assert runlock.holder(run) == "another process" and canary.read_text() == "kept\n"
