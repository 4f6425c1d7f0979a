"""Watch the ranks of a job from the process that started them, and explain its end.

- When a rank fails, the others stop within seconds (they see a `PeerFailure`, or are
  killed after a short grace), and no process of the job is left behind.
- Ctrl+C stops every rank at once; SIGTERM / SIGUSR1 ask the ranks to save a checkpoint
  and stop (preemption), and whatever has not stopped after `dist.stop_timeout` is killed.
- The end of a failed job is explained once: which rank failed first, how (exception,
  exit code or signal, hang), its last log lines and log file, and which ranks were only
  stopped as a consequence. The job's exit code is the root cause's, not the launcher's.

Example:
    code = supervise_launch(plan.argv, child_env, run_dir, stop_timeout=60)
"""

from __future__ import annotations

import ctypes
import json
import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from . import faults, rundir

PR_SET_PDEATHSIG = 1
GRACE_S = 5.0            # how long survivors get to notice a failure before SIGKILL
POLL_S = 0.2


# ------------------------------------------------------------------ reading the outcome
def read_status(run_dir: Optional[Path]) -> Dict[int, dict]:
    """Every rank's status record (see faults.Monitor), by global rank."""
    found = {}
    folder = Path(run_dir) / "status" if run_dir else None
    if folder is None or not folder.is_dir():
        return found
    for path in folder.glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[int(record["rank"])] = record
    return found


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


@dataclass
class Report:
    code: int
    lines: List[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def root_cause(status: Dict[int, dict], exit_codes: Optional[Dict[int, int]] = None,
               launcher_code: int = 1, logs: Optional[Dict[int, str]] = None) -> Report:
    """Name the rank whose failure ended the job, from status records and exit codes.

    Order of evidence: a rank that reported a failure or a hang (earliest first); then a
    rank that died without reporting (killed by a signal, e.g. SIGKILL or the OOM
    killer); ranks that stopped because of a peer are consequences, never the cause.

    Example:
        root_cause({0: {"state": "stopped", ...}, 1: {"state": "failed", ...}}).code  # 1
    """
    exit_codes, logs = exit_codes or {}, logs or {}
    if status and all(r.get("state") == "preempted" for r in status.values()):
        return Report(faults.EXIT_PREEMPTED, [
            "paddle_dist: the job stopped on request after saving a checkpoint "
            f"(exit {faults.EXIT_PREEMPTED})"])
    bad = sorted((r for r in status.values() if r.get("state") in ("failed", "hung")),
                 key=lambda r: r.get("time", 0))
    if bad:
        cause = bad[0]
        code = faults.EXIT_HANG if cause["state"] == "hung" else cause.get("exit_code", 1)
        return _report(cause, code, _describe(cause), status, exit_codes, logs)
    silent = _died_silently(status, exit_codes)
    if silent is not None:
        rank, code = silent
        record = status.get(rank, {"rank": rank})
        how = (f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}") \
            if code is not None else "died without reporting an error (killed by a signal?)"
        exit_code = 128 - code if code is not None and code < 0 else (code or launcher_code)
        return _report(record, exit_code, f"rank {rank} {how}", status, exit_codes, logs)
    return Report(launcher_code, [f"paddle_dist: the job failed (exit {launcher_code}) before any rank "
                                  "reported its state; see the launcher's logs"])


def _died_silently(status: Dict[int, dict], exit_codes: Dict[int, int]):
    """(rank, exit code or None) of a rank that ended without recording why."""
    for rank, code in sorted(exit_codes.items()):
        state = status.get(rank, {}).get("state")
        if code != 0 and state in (None, "running"):
            return rank, code
    for rank, record in sorted(status.items()):
        if record.get("state") == "running" and not pid_alive(record.get("pid")):
            return rank, None
    return None


def pid_alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(record: dict) -> str:
    if record["state"] == "hung":
        return record.get("message", f"rank {record['rank']} hung")
    return f"rank {record['rank']} raised {record.get('error_type', 'an error')}: {record.get('error', '')}"


def _report(cause: dict, code: int, headline: str, status: Dict[int, dict],
            exit_codes: Dict[int, int], logs: Dict[int, str]) -> Report:
    rank = cause.get("rank")
    lines = [f"paddle_dist: job failed (exit {code}). Root cause: {headline}"]
    where = [f"last heartbeat at step {cause['step']}" if "step" in cause else "",
             f"pid {cause['pid']}" if cause.get("pid") else "",
             f"host {cause['host']}" if cause.get("host") else ""]
    if any(where):
        lines.append("  " + ", ".join(w for w in where if w))
    lines += [f"  log: {log}" for log in (cause.get("log"), logs.get(rank)) if log]
    trace = [line for line in cause.get("traceback", "").splitlines() if line.strip()]
    if trace:
        lines.append("  traceback (last lines):")
        lines += [f"  | {line}" for line in trace[-6:]]
    else:   # no traceback recorded (killed, or not a paddle_dist rank): its last output
        output = logs.get(rank) or cause.get("log")
        lines += [f"  | {line}" for line in _tail(output, 6)] if output else []
    others = sorted((set(status) | set(exit_codes)) - {rank})
    if others:
        lines.append("  stopped as a consequence: " + ", ".join(f"rank {r}" for r in others))
    return Report(code, lines)


def _tail(path: str, count: int) -> List[str]:
    try:
        return Path(path).read_text(errors="replace").splitlines()[-count:]
    except OSError:
        return []


def explain_from_rank(run_dir: Path, wait_s: float = 3.0) -> None:
    """For a rank stopped by a peer's failure when no paddle_dist launcher watches the job
    (e.g. under a bare `python -m paddle.distributed.launch`): wait briefly for the failed
    rank's record, then print the root cause."""
    deadline = time.monotonic() + wait_s
    while True:
        status = read_status(run_dir)
        settled = any(r.get("state") in ("failed", "hung") for r in status.values()) or \
            _died_silently(status, {}) is not None
        if settled or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    print(with_resume(root_cause(status), run_dir).text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ processes
def process_table() -> Iterator[Tuple[int, str, int, int]]:
    """(pid, state, parent pid, session id) of every process, from /proc: processes are
    found by their relations, never matched by name."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        yield int(entry.name), fields[0], int(fields[1]), int(fields[3])


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
                [f"  | {line}" for line in _tail(str(launcher_log), 8)]
    print(with_resume(report, run_dir).text, file=sys.stderr, flush=True)
    return report.code


def with_resume(report: Report, run_dir: Optional[Path]) -> Report:
    """`report` ending with the exact command that continues the run (rundir.resume_command),
    when the job can be continued and the command is known."""
    command = rundir.resume_command(run_dir) if run_dir and report.code != faults.EXIT_USAGE else ""
    if command:
        report.lines.append(f"paddle_dist: to continue this run, run: {command}")
    return report
