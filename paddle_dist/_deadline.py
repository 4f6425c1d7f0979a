"""Stop a rank that missed a deadline. Run as a plain script (it imports no Paddle).

Why a separate process: native code can hold Python's GIL for as long as it runs (Paddle's
rendezvous while it waits for peers; a C or CUDA call that never returns), and then no
thread of the rank itself can run to notice the time.

Usage:
    python _deadline.py PID SECONDS MESSAGE [STATUS_FILE RANK]
        after SECONDS, print MESSAGE, record it in STATUS_FILE and end PID: SIGQUIT, which
        the rank made _exit(3) (faults.deadline), then SIGKILL if it is still there.
    python _deadline.py --heartbeat PID BEAT_FILE SECONDS STATUS_FILE RANK STACK_FILE LOG
        the hang watchdog: BEAT_FILE is the rank's heartbeat (faults.Heartbeat). When it
        shows no progress for SECONDS outside a collective, ask the rank for its Python
        stack (SIGUSR2: faulthandler writes it to STACK_FILE, even while native code holds
        the GIL), record "hung" in STATUS_FILE, print why, and SIGKILL PID.
Both exit quietly when their stdin closes (the rank finished in time, or died). The rank
starts them in a session of their own, so a terminal's Ctrl+C (which the rank handles) never
reaches them, not even while this interpreter is still starting.
"""

import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time

EXIT_RENDEZVOUS = 3
BEAT_FORMAT = "<dqqq"   # last progress (time.monotonic(): one clock for every process), step, epoch, in a collective
BEAT_SIZE = struct.calcsize(BEAT_FORMAT)
POLL_S = 1.0
STACK_WAIT_S = 3.0
QUIT_WAIT_S = 3.0


def main(pid: int, seconds: float, message: str, status_file: str = "", rank: str = "0") -> int:
    if _stdin_closed(seconds):
        return 0
    sys.stderr.write(f"paddle_dist: {message}\n")
    sys.stderr.flush()
    if status_file:
        _record(status_file, {"rank": int(rank), "pid": pid, "host": socket.gethostname(),
                              "state": "failed", "step": 0, "time": time.time(),
                              "error_type": "RendezvousTimeout", "error": message,
                              "exit_code": EXIT_RENDEZVOUS})
    _end(pid)
    return 0


def _end(pid: int) -> None:
    """SIGQUIT, which the rank turned into _exit(3) (faults.deadline); SIGKILL if it is
    still there a few seconds later."""
    os.kill(pid, signal.SIGQUIT)
    deadline = time.monotonic() + QUIT_WAIT_S
    while time.monotonic() < deadline:
        if not _running(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie waiting for its parent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def watch(pid: int, beat_file: str, seconds: float, status_file: str, rank: str, stack_file: str,
          log: str) -> int:
    """The hang watchdog (module docstring). Removes the heartbeat and stack files when it
    ends, whichever way the rank ended."""
    try:
        with open(beat_file, "r+b") as f:
            beat = mmap.mmap(f.fileno(), BEAT_SIZE)
        while not _stdin_closed(POLL_S):
            progress, step, epoch, in_collective = struct.unpack_from(BEAT_FORMAT, beat)
            silent = time.monotonic() - progress
            if in_collective or silent <= seconds:
                continue
            if struct.unpack_from(BEAT_FORMAT, beat)[0] != progress:   # it moved on meanwhile
                continue
            message = (f"rank {rank} silent for {silent:.0f} s at step {step} "
                       f"(dist.hang_timeout={seconds:g})")
            stack = _stack_of(pid, stack_file)
            if status_file:
                _record(status_file, {"rank": int(rank), "pid": pid, "host": socket.gethostname(),
                                      "state": "hung", "step": step, "epoch": epoch, "phase": "train",
                                      "time": time.time(), "log": log, "message": message,
                                      "traceback": stack[-4000:]})
            sys.stderr.write(f"paddle_dist: {message}; stopping the job\n{stack}")
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
            return 0
        return 0
    finally:
        for path in (beat_file, stack_file):
            try:
                os.unlink(path)
            except OSError:
                pass


def _stdin_closed(seconds: float) -> bool:
    """Wait up to `seconds` for stdin to close; True if it did."""
    ready, _, _ = select.select([sys.stdin], [], [], seconds)
    return bool(ready)


def _stack_of(pid: int, stack_file: str) -> str:
    """The rank's Python stacks, dumped by its faulthandler on SIGUSR2: wait until the
    file has stopped growing (or STACK_WAIT_S has passed)."""
    try:
        os.kill(pid, signal.SIGUSR2)
    except ProcessLookupError:
        return ""
    deadline, size, still = time.monotonic() + STACK_WAIT_S, -1, 0
    while time.monotonic() < deadline and still < 3:
        time.sleep(0.05)
        now = os.path.getsize(stack_file) if os.path.exists(stack_file) else 0
        still = still + 1 if now == size and now > 0 else 0
        size = now
    try:
        with open(stack_file, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _record(status_file: str, record: dict) -> None:
    """Write a rank status record (faults.Monitor's format) atomically."""
    os.makedirs(os.path.dirname(status_file), exist_ok=True)
    tmp = f"{status_file}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, status_file)


if __name__ == "__main__":
    # An interrupt sent to this process by name is the rank's to handle, not this watchdog's:
    # it ends when its stdin closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.argv[1] == "--heartbeat":
        pid_, beat_, seconds_, status_, rank_, stack_, log_ = sys.argv[2:9]
        sys.exit(watch(int(pid_), beat_, float(seconds_), status_, rank_, stack_, log_))
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], *sys.argv[4:6]))
