"""How a job ended, in one report: read every rank's status record and exit code, name the
rank whose failure ended the job (exception, hang, signal), its log, the ranks stopped as a
consequence, and the exact command that continues the run.

Ranks are named by their global rank. In a job on several machines each machine's launcher
reports what it saw, naming every rank with its host (`rank 3 (host nodeB) killed by
SIGKILL`), from `Machines` (topology.py); a machine whose ranks all stopped because a peer
failed, none of them failing itself, names the machine(s) where the cause must be, and no
more: their own reports name the rank and why. The records are status.py's; what a report
quotes of a rank's log, logs.py's.

Example:
    print(with_resume(root_cause(status.read_all(run_dir), exit_codes), run_dir).text)
"""

from __future__ import annotations

import re
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Union

from .. import errors
from ..errors import REFUSAL_LINE
from ..procfs import pid_alive
from ..security import attest
from .commands import resume_command
from .logs import GLOO_START_HINT, gloo_start_failed, innermost, store_bind_failed, tail_lines, text_of
from .status import (DIVERGED, ENDED_BADLY, HUNG, PREEMPTED, REFUSED, RUNNING, STOPPED, RankStatus,
                     read_all)
from .topology import ONE_MACHINE, Machines
from .layout import Run

POLL_S = 0.2             # how often a waiting loop looks again (here and in supervisor.py)
# Two exits seen this close together count as simultaneous: the order in which the
# launcher sees them then says little, and a SIGABRT among them is the consequence
# (a gloo error thrown through C++ when the peer's connection broke).
SIMULTANEOUS_S = 0.5
SIGABRT_CODE = -signal.SIGABRT
# A peer's address in gloo's messages: "Read error [198.18.0.2]:23443: Connection reset by peer".
PEER_ADDRESS = re.compile(r"\[([0-9A-Fa-f.:]+)\]:\d+")
# shm.PeerGone: a rank on the same machine died in the shared-memory exchange
DIED_HERE = re.compile(r"rank (\d+) \(pid \d+\) died during the shared-memory")


@dataclass(frozen=True)
class Exit:
    """One rank's end as its launcher saw it: `code` is the return code (-N: killed by
    signal N), `at` when the exit was seen (time.monotonic()), `signalled_at` when the
    launcher itself first signalled that process (None: never)."""
    rank: int
    code: int
    at: float
    signalled_at: Optional[float] = None

    @property
    def failed_by_itself(self) -> bool:
        """A non-zero end that the launcher did not cause."""
        return self.code != 0 and (self.signalled_at is None or self.signalled_at > self.at)


def first_failure(exits: Sequence[Exit], simultaneous_s: float = SIMULTANEOUS_S) -> Optional[Exit]:
    """The exit that started the job's end: the first failure by the order the exits were
    seen, never a process the launcher signalled, and a SIGABRT only when no other failure
    came at (about) the same time: a peer's death kills the survivors of a DataParallel
    job with SIGABRT, within milliseconds.

    Example:
        first_failure([Exit(0, -6, at=10.02), Exit(1, -9, at=10.0)]).rank   # 1
    """
    failed = sorted((e for e in exits if e.failed_by_itself), key=lambda e: e.at)
    if not failed:
        return None
    first = failed[0]
    if first.code == SIGABRT_CODE:
        near = [e for e in failed if e.code != SIGABRT_CODE and e.at - first.at <= simultaneous_s]
        return near[0] if near else first
    return first


def how_it_ended(code: Optional[int]) -> str:
    if code is None:
        return "died without reporting an error (killed by a signal?)"
    return f"killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code).name
    except ValueError:
        return f"signal {code}"


@dataclass
class Report:
    code: int
    lines: List[str] = field(default_factory=list)
    diverged: bool = False      # the ranks' weights differed: the run is never continued

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


Records = Mapping[int, Union[RankStatus, dict]]     # a dict: a record as JSON has it (tests, tools)


def root_cause(status: Records, exit_codes: Optional[Dict[int, int]] = None,
               launcher_code: int = 1, logs: Optional[Dict[int, str]] = None,
               exits: Optional[Sequence[Exit]] = None, machines: Machines = ONE_MACHINE) -> Report:
    """Name the rank whose failure ended the job, from status records and exits (all by
    global rank; `machines`: where they run, see Machines).

    Order of evidence: a rank that reported a failure or a hang (earliest first); then a
    rank that died without reporting (killed by a signal, e.g. SIGKILL or the OOM
    killer), the first by the order of `exits` when the launcher saw them (first_failure),
    else the lowest rank; ranks that stopped because of a peer are consequences, never
    the cause; when every rank here stopped so, on several machines, the cause is on
    another machine. Every rank ending with 75 (a requested stop, saved) is not a failure.
    Ranks whose weights check found them diverged (every rank finds it at once) come first:
    that line is the report. A root cause that refused its input (a user error: a
    "refused" record, or exit 2 with errors.REFUSAL_LINE in its output) is reported as the
    one line it printed, with its code 2 (_refused).

    Example:
        root_cause({0: RankStatus(0, state="stopped", ...), 1: RankStatus(1, state="failed", ...)}).code  # 1
    """
    status = {rank: RankStatus.of(record) for rank, record in status.items()}
    logs = logs or {}
    if exits is not None:
        exit_codes = {e.rank: e.code for e in exits}
    exit_codes = exit_codes or {}
    preempted = all(r.state == PREEMPTED for r in status.values()) if status else \
        bool(exit_codes) and all(c == errors.EXIT_PREEMPTED for c in exit_codes.values())
    if preempted:
        return Report(errors.EXIT_PREEMPTED, [
            "paddle_dist: the job stopped on request after saving a checkpoint "
            f"(exit {errors.EXIT_PREEMPTED})"])
    diverged = _earliest(r for r in status.values() if r.state == DIVERGED)
    if diverged:
        why = diverged[0].error if diverged[0].error is not None else "the ranks diverged"
        return Report(errors.EXIT_DIVERGED, [f"paddle_dist: job failed (exit {errors.EXIT_DIVERGED}). "
                                             f"Root cause: {why}"], diverged=True)
    breach = _breach(status, exit_codes, exits, logs, machines)
    if breach is not None:
        return breach
    bad = _earliest(r for r in status.values() if r.state in ENDED_BADLY)
    if bad:
        cause = bad[0]
        refusal = _refused(cause, logs) if cause.state == REFUSED else None
        if refusal is not None:
            return refusal
        code = errors.EXIT_HANG if cause.state == HUNG else \
            (cause.exit_code if cause.exit_code is not None else 1)
        return _report(cause, code, _describe(cause, machines), status, exit_codes, logs, machines)
    elsewhere = _elsewhere(status, exit_codes, machines)
    if elsewhere is not None:
        return elsewhere
    silent = _died_silently(status, exit_codes, exits, machines)
    if silent is not None:
        rank, code = silent
        record = status.get(rank) or RankStatus(rank)
        refusal = _refused(record, logs) if code == errors.EXIT_USAGE else None
        if refusal is not None:
            return refusal
        # Its own code unseen, the launcher's may be a consequence's (5): not the cause's.
        unseen = errors.EXIT_FAILED if launcher_code == errors.EXIT_PEER else launcher_code
        exit_code = errors.exit_code_of(code) if code is not None else unseen
        headline = f"{machines.name(rank, record)} {how_it_ended(code)}"
        if code == SIGABRT_CODE and machines.several:
            headline += ("; gloo ends a rank so when a peer fails: a rank on another machine may "
                         "have failed first, see the other machines' reports")
        return _report(record, exit_code or launcher_code, headline, status, exit_codes, logs, machines)
    return Report(launcher_code, [f"paddle_dist: the job failed (exit {launcher_code}) before any rank "
                                  "reported its state; see the launcher's logs"])


def _earliest(records) -> List[RankStatus]:
    """`records` by the time each was written, the earliest first (no time: first of all)."""
    return sorted(records, key=lambda r: r.time or 0)


def _state_of(status: Dict[int, RankStatus], rank: int) -> Optional[str]:
    """Rank `rank`'s recorded state (None: it has no record)."""
    record = status.get(rank)
    return record.state if record is not None else None


def _refused(record: RankStatus, logs: Dict[int, str]) -> Optional[Report]:
    """The report of a rank that refused its input (exit 2): the one line it printed
    (errors.REFUSAL_LINE, in its output), else its record's error; None when it said
    neither (a script's own sys.exit(2) or argparse error: its last lines say more). No
    command follows it (with_resume): run as it was, the job would fail the same way.

    Example:
        _refused(RankStatus(0, state="refused", error="unknown config key 'a.b'"), {}).text
        # "paddle_dist: error: unknown config key 'a.b'"
    """
    output = logs.get(record.rank)
    said = [line[line.index(REFUSAL_LINE):] for line in (tail_lines(output, 20) if output else [])
            if REFUSAL_LINE in line]
    if said:
        return Report(errors.EXIT_USAGE, [said[-1]])
    if record.state == REFUSED and record.error:
        return Report(errors.EXIT_USAGE, [f"{REFUSAL_LINE}{record.error}"])
    return None


def _breach(status: Dict[int, RankStatus], exit_codes: Dict[int, int], exits: Optional[Sequence[Exit]],
            logs: Dict[int, str], machines: Machines) -> Optional[Report]:
    """A rank that ended with the security code (attest.SecurityError, exit 6) is the root
    cause, ahead of whatever failed after it (the gloo errors of ranks that went on): the
    first such rank the launcher saw end, with the line it printed."""
    ranks = {r for r, code in exit_codes.items() if errors.exit_code_of(code) == errors.EXIT_SECURITY}
    ranks |= {r for r, record in status.items() if record.exit_code == errors.EXIT_SECURITY}
    if not ranks:
        return None
    seen = [e.rank for e in sorted(exits or (), key=lambda e: e.at) if e.rank in ranks]
    rank = (seen or sorted(ranks))[0]
    record = status.get(rank) or RankStatus(rank)
    output = logs.get(rank) or record.log
    said = [line.split(attest.SECURITY_LINE, 1)[1] for line in (tail_lines(output, 20) if output else [])
            if attest.SECURITY_LINE in line]
    headline = f"{machines.name(rank, record)} " + (f"found a breach: {said[-1]}" if said else
                                                     f"exited with code {errors.EXIT_SECURITY} (a breach)")
    return _report(record, errors.EXIT_SECURITY, headline, status, exit_codes, logs, machines)


def _died_silently(status: Dict[int, RankStatus], exit_codes: Dict[int, int],
                   exits: Optional[Sequence[Exit]] = None, machines: Machines = ONE_MACHINE):
    """(rank, exit code or None) of a rank that ended without recording why: the first
    to fail by `exits` when the launcher saw them, else the lowest rank."""
    if exits is not None:
        unrecorded = [e for e in exits if _state_of(status, e.rank) in (None, RUNNING)]
        first = first_failure(unrecorded)
        if first is not None:
            return first.rank, first.code
        exit_codes = {}     # every failure here was caused by the launcher
    for rank, code in sorted(exit_codes.items()):
        if code != 0 and _state_of(status, rank) in (None, RUNNING):
            return rank, code
    for rank, record in sorted(status.items()):
        if record.state == RUNNING and machines.is_here(record) and not pid_alive(record.pid):
            return rank, None
    return None


def _elsewhere(status: Dict[int, RankStatus], exit_codes: Dict[int, int],
               machines: Machines) -> Optional[Report]:
    """On several machines, when no rank here failed by itself but ranks here stopped
    because a peer failed (every rank, or the first ones Paddle's launcher saw end: it
    stops the others itself): the machine(s) where the cause must be (the one whose address
    gloo's messages name, else every other one). Only that machine's report can say which
    rank failed and why: this one says where to look."""
    def by_peer(record: RankStatus) -> bool:
        return record.state == STOPPED and record.exit_code == errors.EXIT_PEER
    if not machines.several or not any(by_peer(r) for r in status.values()):
        return None
    first_seen = exit_codes and all(code == errors.EXIT_PEER for code in exit_codes.values())
    if not first_seen and not all(by_peer(r) for r in status.values()):
        return None
    messages = [r.error for _, r in sorted(status.items()) if r.error]
    died = {int(r) for error in messages for r in DIED_HERE.findall(error)}
    if any(_state_of(status, r) in (None, RUNNING) for r in died & set(status)):
        return None         # the shared-memory exchange saw a rank of this machine die unrecorded
    named = {address for error in messages for address in PEER_ADDRESS.findall(error)}
    meeting = machines.meeting
    others = {n: node for n, node in meeting.nodes.items() if n != meeting.node_rank} if meeting else {}
    suspects = {n: node for n, node in others.items() if node.address in named} or others

    def node_words(n: int) -> str:
        node, ranks = suspects[n], meeting.ranks_of(n)
        where = f"host {node.host} at {node.address}" if node.host else node.address
        listed = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        return f"node {n} ({where}, {listed})"

    there = " or ".join(node_words(n) for n in sorted(suspects)) or \
        (", ".join(sorted(named)) if named else "another machine")
    one = len(suspects) == 1 or (not suspects and len(named) == 1)
    how = "lost their connection to it" if named and one else "stopped when a peer failed"
    reports = "that machine's report names" if one else "those machines' reports name"
    lines = [f"paddle_dist: job failed (exit {errors.EXIT_PEER}). Root cause: a rank on another machine, "
             f"{there}: this machine's ranks {how}; {reports} the rank and why"]
    lines += [f"  this machine's ranks met: {messages[0]}"] if messages else []
    lines.append("  stopped as a consequence: " + ", ".join(
        machines.name(r, status[r]) for r in sorted(status)))
    return Report(errors.EXIT_PEER, lines)


def _describe(record: RankStatus, machines: Machines = ONE_MACHINE) -> str:
    if record.state == HUNG:
        return record.message if record.message is not None else f"{machines.name(record.rank, record)} hung"
    error_type = record.error_type if record.error_type is not None else "an error"
    return f"{machines.name(record.rank, record)} raised {error_type}: {record.error or ''}"


def _report(cause: RankStatus, code: int, headline: str, status: Dict[int, RankStatus],
            exit_codes: Dict[int, int], logs: Dict[int, str], machines: Machines = ONE_MACHINE) -> Report:
    rank = cause.rank
    lines = [f"paddle_dist: job failed (exit {code}). Root cause: {headline}"]
    said = "\n".join([cause.traceback or "", cause.error or ""]
                     + [text_of(log) for log in (cause.log, logs.get(rank)) if log])
    lines += [f"  {GLOO_START_HINT}"] if gloo_start_failed(said) else []
    lines += [f"  {hint}" for hint in [store_bind_failed(said)] if hint]
    where = [f"last heartbeat at step {cause.step}" if cause.step is not None else "",
             f"pid {cause.pid}" if cause.pid else "",
             f"host {cause.host}" if cause.host else ""]
    if any(where):
        lines.append("  " + ", ".join(w for w in where if w))
    lines += [f"  log: {log}" for log in (cause.log, logs.get(rank)) if log]
    title, trace = innermost(cause.traceback or "", 6)
    if trace:
        lines.append(f"  {title}:")
        lines += [f"  | {line}" for line in trace]
    else:   # no traceback recorded (killed, or not a paddle_dist rank): its last output
        output = logs.get(rank) or cause.log
        lines += [f"  | {line}" for line in tail_lines(output, 6)] if output else []
    others = sorted((set(status) | set(exit_codes)) - {rank})
    if others:
        lines.append("  stopped as a consequence: " + ", ".join(
            machines.name(r, status.get(r), _ending(status.get(r), exit_codes.get(r))) for r in others))
    return Report(code, lines)


def _ending(record: Optional[RankStatus], code: Optional[int]) -> str:
    """How a rank stopped as a consequence ended, when it says more than its status."""
    if (record is not None and record.state in (STOPPED, PREEMPTED)) or code in (None, 0, errors.EXIT_PEER):
        return ""
    return how_it_ended(code)


def explain_from_rank(run_dir: Path, wait_s: float = 3.0) -> None:
    """For a rank stopped by a peer's failure when no paddle_dist launcher watches the job
    (e.g. under a bare `python -m paddle.distributed.launch`): wait briefly for the failed
    rank's record, then print the root cause."""
    deadline = time.monotonic() + wait_s
    while True:
        status = read_all(run_dir)
        settled = any(r.state in ENDED_BADLY for r in status.values()) or \
            _died_silently(status, {}) is not None
        if settled or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    print(with_resume(root_cause(status), run_dir).text, file=sys.stderr, flush=True)


def _after_divergence(run_dir: Optional[Path]) -> str:
    """What a report of diverged weights says instead of a command: the run's checkpoints,
    each checked before it was written, and where the next steps are described."""
    run = Run(run_dir) if run_dir else None
    kept = f"its checkpoints, each checked before it was written, are in {run.checkpoints}" \
        if run is not None and run.has_checkpoints() else "it kept no checkpoint"
    return (f"paddle_dist: this run is not continued; {kept} (docs/faults.md, "
            "\"The ranks' weights differ\", says what to do)")


def with_resume(report: Report, run_dir: Optional[Path], rerun: Sequence[str] = ()) -> Report:
    """`report` ending with the exact command that continues the run (commands.resume_command),
    when the job can be continued and the command is known; otherwise, when given, with
    `rerun`, the command that runs the job again (a user's script that keeps no run). A
    job that failed on its input (exit 2: a refused record, a typo in the script's config)
    gets neither, as it would fail the same way: its one line says what to fix. A job
    whose ranks' weights diverged gets neither: it says where its checkpoints are.

    Example:
        with_resume(report, None, ["python", "-m", "paddle_dist.launch", "x.py"]).lines[-1]
        # 'paddle_dist: to run it again, run: python -m paddle_dist.launch x.py'
    """
    if report.code == errors.EXIT_USAGE:
        return report
    if report.diverged:          # never continued, nor run again as it was
        report.lines.append(_after_divergence(run_dir))
        return report
    command = resume_command(run_dir) if run_dir else ""
    if command:
        report.lines.append(f"paddle_dist: to continue this run, run: {command}")
    elif rerun:
        report.lines.append(f"paddle_dist: to run it again, run: {shlex.join(rerun)}")
    return report
