"""Watch the ranks of a job from the process that started them, and explain its end.

- When a rank fails, the others stop within seconds (they see a `PeerFailure`, or are
  killed after a short grace), and no process of the job is left behind.
- Ctrl+C stops every rank at once; SIGTERM / SIGUSR1 ask the ranks to save a checkpoint
  and stop (preemption), and whatever has not stopped after `dist.stop_timeout` is killed.
- The end of a failed job is explained once (report.py): which rank failed first and how,
  and the ranks stopped as a consequence. The job's exit code is the root cause's, not
  the launcher's.

Example:
    code = supervise_launch(plan.argv, child_env, run_dir, stop_timeout=60)
"""

from __future__ import annotations

import ctypes
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import faults
from .procfs import process_table
from .report import POLL_S, Report, read_status, root_cause, tail_lines, with_resume

PR_SET_PDEATHSIG = 1
GRACE_S = 5.0            # how long survivors get to notice a failure before SIGKILL


def children_of(pid: int) -> List[int]:
    """Direct children of `pid`."""
    return [child for child, _, parent, _ in process_table() if parent == pid]


def die_with_parent() -> None:
    """In a child, before exec: the kernel kills it if its parent dies (Linux), so a job's
    processes never outlive a launcher that was itself killed."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _signal_all(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Requests:
    """Signals to the supervisor, turned into requests handled in its wait loop."""

    def __init__(self):
        self.kind: Optional[str] = None     # interrupt | stop
        self.at = 0.0

    def __enter__(self):
        self.old = {signal.SIGINT: signal.signal(signal.SIGINT, self._interrupt),
                    signal.SIGTERM: signal.signal(signal.SIGTERM, self._stop),
                    signal.SIGUSR1: signal.signal(signal.SIGUSR1, self._stop)}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)

    def _interrupt(self, signum, frame):
        self.kind, self.at = "interrupt", time.monotonic()

    def _stop(self, signum, frame):
        if self.kind is None:
            self.kind, self.at = "stop", time.monotonic()


def _wait_loop(poll: Callable[[], bool], ranks: Callable[[], List[int]], everyone: Callable[[int], None],
               stop_timeout: float) -> Optional[str]:
    """Wait until `poll()` says the job ended, acting on signals; return the request seen."""
    sent = None
    with _Requests() as req:
        while not poll():
            if req.kind and sent != req.kind:
                sent = req.kind
                _signal_all(ranks(), signal.SIGINT if req.kind == "interrupt" else signal.SIGUSR1)
                if req.kind == "interrupt":
                    everyone(signal.SIGINT)
            if req.kind:
                limit = GRACE_S if req.kind == "interrupt" else stop_timeout
                if time.monotonic() - req.at > limit:
                    everyone(signal.SIGKILL)
            time.sleep(POLL_S)
        return req.kind


CONTAINER_FAILED = re.compile(r"Container rank (\d+) status failed .* code (-?\d+)")


def launcher_exit_codes(stderr_file: Path) -> Dict[int, int]:
    """The real exit codes Paddle's launcher saw ("Container rank 1 ... code -9")."""
    try:
        text = stderr_file.read_text(errors="replace")
    except OSError:
        return {}
    return {int(m.group(1)): int(m.group(2)) for m in CONTAINER_FAILED.finditer(text)}


def supervise_launch(argv: List[str], child_env: Dict[str, str], run_dir: Optional[Path],
                     stop_timeout: float, log_dir: Path) -> int:
    """Run `python -m paddle.distributed.launch ...` and report the job's real outcome.

    Paddle's launcher's own messages go to <log_dir>/launcher.err instead of the terminal:
    they blame whichever rank it killed last, and paddle_dist reports the root cause.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    err_path = log_dir / "launcher.err"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(argv, env=child_env, start_new_session=True, stderr=err,
                                preexec_fn=die_with_parent)
    ranks = set()   # Paddle's launcher puts every rank in a session of its own

    def finished():
        ranks.update(children_of(proc.pid))
        return proc.poll() is not None

    def everyone(sig):
        for group in [proc.pid] + sorted(ranks):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                pass

    try:
        request = _wait_loop(finished, lambda: sorted(ranks), everyone, stop_timeout)
    finally:
        everyone(signal.SIGKILL)           # nothing of the job outlives its launcher
    logs = {r: str(log_dir / f"workerlog.{r}") for r in range(64) if (log_dir / f"workerlog.{r}").exists()}
    return _finish(proc.returncode, request, run_dir, launcher_exit_codes(err_path), logs, err_path)


class _Grace:
    """After the first rank fails, the others get GRACE_S seconds to notice and stop."""

    def __init__(self):
        self.failed_at: Optional[float] = None

    def over(self, codes: List[Optional[int]]) -> bool:
        """`codes`: each rank's exit code, None while it runs."""
        if self.failed_at is None and any(c not in (None, 0) for c in codes):
            self.failed_at = time.monotonic()
        return self.failed_at is not None and time.monotonic() - self.failed_at > GRACE_S


def supervise_ranks(argv: List[str], child_env: Dict[str, str], rank_envs: List[Dict[str, str]],
                    run_dir: Optional[Path], stop_timeout: float, log_dir: Path) -> int:
    """Start `argv` once per rank (with `rank_envs[r]` added), each in a session of its
    own with its output in <log_dir>/workerlog.<r> (rank 0's on this terminal too), and
    report the job's real outcome: every rank's exit code or signal is known first hand."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs: List[subprocess.Popen] = []
    tee = None
    grace = _Grace()

    def poll():
        codes = [p.poll() for p in procs]
        if grace.over(codes):
            everyone(signal.SIGKILL)
        return all(c is not None for c in codes)

    def everyone(sig):
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    try:
        for rank, extra in enumerate(rank_envs):
            with open(log_dir / f"workerlog.{rank}", "wb") as log:
                procs.append(subprocess.Popen(
                    argv, env=dict(child_env, **extra), stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if rank == 0 else log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=die_with_parent))
            if rank == 0:
                tee = threading.Thread(target=_tee, args=(procs[0].stdout, log_dir / "workerlog.0"),
                                       daemon=True)
                tee.start()
        request = _wait_loop(poll, lambda: [p.pid for p in procs if p.poll() is None],
                             everyone, stop_timeout)
    finally:
        everyone(signal.SIGKILL)           # nothing of the job outlives its launcher
        for p in procs:
            p.wait()
        if tee is not None:
            tee.join(timeout=5)
    codes = {rank: p.returncode for rank, p in enumerate(procs)}
    logs = {rank: str(log_dir / f"workerlog.{rank}") for rank in codes}
    worst = next((c for c in codes.values() if c), 0)
    return _finish(worst, request, run_dir, codes, logs)


def _tee(stream, path: Path) -> None:
    """Copy a rank's output to this terminal and to its log file as it comes."""
    with open(path, "ab") as log:
        for chunk in iter(lambda: stream.read1(65536), b""):
            log.write(chunk)
            log.flush()
            try:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            except (OSError, ValueError):
                pass


def supervise_spawn(start: Callable, run_dir: Path, stop_timeout: float) -> int:
    """`start()` returns paddle.distributed.spawn's context (its `.processes` in rank order)."""
    context = start()
    procs = context.processes
    grace = _Grace()

    def poll():
        multiprocessing.connection.wait([p.sentinel for p in procs], timeout=POLL_S)
        if grace.over([p.exitcode for p in procs]):
            everyone(signal.SIGKILL)
        return all(p.exitcode is not None for p in procs)

    def everyone(sig):
        _signal_all([p.pid for p in procs if p.exitcode is None], sig)

    try:
        request = _wait_loop(poll, lambda: [p.pid for p in procs if p.exitcode is None],
                             everyone, stop_timeout)
    finally:
        everyone(signal.SIGKILL)
        for p in procs:
            p.join(timeout=5)
    codes = {rank: p.exitcode for rank, p in enumerate(procs)}
    worst = next((c for c in codes.values() if c), 0)
    return _finish(worst, request, run_dir, codes, {})


def _finish(code: int, request: Optional[str], run_dir: Optional[Path], exit_codes: Dict[int, int],
            logs: Dict[int, str], launcher_log: Optional[Path] = None) -> int:
    if code == 0 and not request:
        return 0
    status = read_status(run_dir)
    if request == "interrupt":
        report = Report(faults.EXIT_INTERRUPTED, ["paddle_dist: interrupted; every rank was stopped"])
    else:
        report = root_cause(status, exit_codes, launcher_code=code or 1, logs=logs)
        if not status and not exit_codes and launcher_log is not None:
            report.lines += [f"  launcher log: {launcher_log}"] + \
                [f"  | {line}" for line in tail_lines(str(launcher_log), 8)]
    print(with_resume(report, run_dir).text, file=sys.stderr, flush=True)
    return report.code
