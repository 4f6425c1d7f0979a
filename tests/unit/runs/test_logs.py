"""Unit tests for paddle_dist.runs.logs: the lines of a rank's log that a report quotes."""

from paddle_dist.runs import logs


def test_a_hangs_stack_shows_the_stuck_threads_innermost_frames():
    """faulthandler writes the current (stuck) thread last, innermost frame first; a
    Python traceback has its innermost frame last."""
    dump = ("Thread 0x00007f01 (most recent call first):\n  File \"overlap.py\", line 9 in _serve\n\n"
            "Current thread 0x00007f00 (most recent call first):\n  File \"shm.py\", line 247 in _wait\n"
            "  File \"shm.py\", line 190 in all_reduce\n  File \"train.py\", line 3 in <module>\n")
    assert logs.innermost(dump, 2) == ("stack (innermost first)", [
        '  File "shm.py", line 247 in _wait', '  File "shm.py", line 190 in all_reduce'])
    trace = "Traceback (most recent call last):\n  File \"a.py\", line 1\n  x()\nRuntimeError: boom\n"
    assert logs.innermost(trace, 2) == ("traceback (last lines)", ["  x()", "RuntimeError: boom"])


def test_a_rank_logs_first_exception_comes_with_its_last_lines(tmp_path):
    """Two threads' tracebacks: the DataLoader's error, then a KeyError from the thread that
    read its queue; the report's lines keep the first."""
    log = tmp_path / "workerlog.1"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "SystemError: (Fatal) DataLoader process (pid 1) exited is killed by signal: Killed.\n"
                   + "".join(f"  frame {i}\n" for i in range(8)) + "KeyError: 9\n")
    lines = logs.tail_lines(str(log), 6)
    assert lines[0].startswith("SystemError: (Fatal) DataLoader process") and lines[-1] == "KeyError: 9"
    assert len(lines) == 7
    log.write_text("a\nb\nValueError: bad\n")
    assert logs.tail_lines(str(log), 6) == ["a", "b", "ValueError: bad"]


def test_a_warning_logged_before_the_traceback_comes_with_the_last_lines(tmp_path):
    """A killed DataLoader worker: Paddle warns, then the rank's reader fails in words that
    do not name the worker (the order of the two depends on which thread sees it first)."""
    log = tmp_path / "workerlog.1"
    warning = ("[2026-11-26 22:02:39,446] [ WARNING] dataloader_iter.py:733 - DataLoader 1 "
               "workers exit unexpectedly, pids: 27947")
    log.write_text("epoch 1\n" + warning + "\nTraceback (most recent call last):\n"
                   + "".join(f"  frame {i}\n" for i in range(6))
                   + "SystemError: (Fatal) Blocking queue is killed because the data reader raises an exception.\n"
                   "  [Hint: Expected killed_ != true, but received killed_:1 == true:1.]\n\n  \n")
    lines = logs.tail_lines(str(log), 6)      # the blank lines at the end are not quoted
    assert lines[0] == warning and lines[-1].startswith("  [Hint:") and len(lines) == 7
    log.write_text("WARNING:root:disk nearly full\n" + "".join(f"line {i}\n" for i in range(10)))
    assert logs.tail_lines(str(log), 6)[0] == "WARNING:root:disk nearly full"
    log.write_text("[2026-11-26 22:02:39,446] [    INFO] fine\n" + "".join(f"line {i}\n" for i in range(10)))
    assert logs.tail_lines(str(log), 6) == [f"line {i}" for i in range(4, 10)]
