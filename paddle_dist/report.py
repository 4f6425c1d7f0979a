"""How a job ended, in one report: read every rank's status record and exit code, name the
rank whose failure ended the job (exception, hang, signal), its log, the ranks stopped as a
consequence, and the exact command that continues the run.

Example:
    print(with_resume(root_cause(read_status(run_dir), exit_codes), run_dir).text)
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from . import faults, rundir

POLL_S = 0.2             # how often a waiting loop looks again (here and in supervisor.py)


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
        lines += [f"  | {line}" for line in tail_lines(output, 6)] if output else []
    others = sorted((set(status) | set(exit_codes)) - {rank})
    if others:
        lines.append("  stopped as a consequence: " + ", ".join(f"rank {r}" for r in others))
    return Report(code, lines)


def tail_lines(path: str, count: int) -> List[str]:
    """The last `count` lines of a text file ([] when it cannot be read)."""
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


def with_resume(report: Report, run_dir: Optional[Path]) -> Report:
    """`report` ending with the exact command that continues the run (rundir.resume_command),
    when the job can be continued and the command is known."""
    command = rundir.resume_command(run_dir) if run_dir and report.code != faults.EXIT_USAGE else ""
    if command:
        report.lines.append(f"paddle_dist: to continue this run, run: {command}")
    return report
