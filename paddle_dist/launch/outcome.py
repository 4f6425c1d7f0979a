"""How a supervised job ended, said once (supervisor.py watches, this explains): which rank
failed first and how, and the ranks stopped as a consequence, by global rank (Paddle's
launcher numbers the ranks of each machine from 0: each is mapped to the rank it is in the
job) and, on several machines, with their host. The job's exit code is the root cause's,
not the launcher's; report.py finds it, this module gathers what it reads.

Every supervisor (supervisor.Supervision) hands its JobResult to `report`, which reads it
once: 0 for a job that ended well, else the report printed and the root cause's code.

Example:
    code = report(JobResult("stop", exits=exits, logs={0: "log/workerlog.0"}, run_dir=run_dir))
"""

from __future__ import annotations

import re
import signal
import socket
import sys
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from .. import errors
from ..runs.logs import tail_lines
from ..runs.report import Exit, Report, first_failure, how_it_ended, root_cause, with_resume
from ..runs.status import read_all as read_status
from ..runs.topology import ONE_MACHINE, Machines, Meeting

CONTAINER_FAILED = re.compile(r"Container rank (\d+) status failed .* code (-?\d+)")


@dataclass
class JobResult:
    """How a supervised job ended, as its supervisor saw it: what `report` reads."""

    request: Optional[str] = None                  # interrupt | stop | None: the launcher's signals
    exits: Optional[List[Exit]] = None             # each rank's end, first hand (ranks, spawn)
    exit_codes: Optional[Dict[int, int]] = None    # by global rank, as Paddle's launcher logged them
    launcher_code: int = 0                         # Paddle's launcher's own exit code
    launcher_log: Optional[Path] = None            # its messages (launcher.err)
    logs: Dict[int, str] = field(default_factory=dict)     # global rank -> its log
    machines: Machines = ONE_MACHINE
    run_dir: Optional[Path] = None
    rerun: Tuple[str, ...] = ()                    # the command that runs a user's script again
    started: bool = True                           # whether any rank started (Paddle's launcher)
    start_timeout: float = 0.0
    meeting: Optional[Meeting] = None

    @property
    def ended_well(self) -> bool:
        return (self.started and not self.request and self.launcher_code == 0
                and all(e.code == 0 for e in self.exits or ()))


def report(result: JobResult) -> int:
    """The job's exit code: 0 when it ended well; else its report, printed once."""
    if result.ended_well:
        return 0
    if not result.started:
        return unstarted(result.request, result.start_timeout, result.launcher_log, result.meeting)
    return finish(result.request, result.run_dir, result.logs, exits=result.exits, exit_codes=result.exit_codes,
                  launcher_code=result.launcher_code or 1, launcher_log=result.launcher_log,
                  rerun=result.rerun, machines=result.machines)


def launcher_exit_codes(stderr_file: Path) -> Dict[int, int]:
    """The real exit codes Paddle's launcher saw ("Container rank 1 ... code -9")."""
    try:
        text = stderr_file.read_text(errors="replace")
    except OSError:
        return {}
    return {int(m.group(1)): int(m.group(2)) for m in CONTAINER_FAILED.finditer(text)}


def global_ranks(places, meeting: Optional[Meeting] = None) -> Callable[[int], int]:
    """local rank -> global rank of this machine's ranks under Paddle's launcher: from the
    ranks' own variables (jobprocs.place_of), else from the meeting's numbering (a rank
    that ended before its variables were read), else unchanged (one machine).

    Example:
        global_ranks([(0, 2, 2), (1, 3, 2)])(1)      # 3
    """
    found = {local: rank for local, rank, _ in places}
    block = meeting.ranks_of(meeting.node_rank) if meeting else range(0)

    def number(local: int) -> int:
        if local in found:
            return found[local]
        return block[local] if local < len(block) else local
    return number


def machines_of(places, meeting: Optional[Meeting], number: Callable[[int], int]) -> Machines:
    """Where this machine's ranks run, for the report (topology.Machines)."""
    places = list(places)
    nnodes = max([n for _, _, n in places] + [len(meeting.nodes) if meeting else 1])
    if nnodes <= 1:
        return ONE_MACHINE
    local = {rank for _, rank, _ in places} | set(meeting.ranks_of(meeting.node_rank) if meeting else ())
    return Machines(socket.gethostname(), tuple(sorted(local)), nnodes, meeting)


def unstarted(request: Optional[str], start_timeout: float, err_path: Path,
              meeting: Optional[Meeting] = None) -> int:
    """The end of a launcher that started no rank: stopped on request, or too late (with
    what node 0's rendezvous refused meanwhile, kvserver.py)."""
    if request == "interrupt":
        code, line = errors.EXIT_INTERRUPTED, "paddle_dist: interrupted; no rank had started"
    elif request:
        code = errors.exit_code_of(-signal.SIGTERM)
        line = (f"paddle_dist: stopped on request before any rank started (exit {code}); "
                "run the same command again to start the job")
    else:
        code = errors.EXIT_RENDEZVOUS
        refused = meeting.rendezvous.refusals() if meeting is not None and meeting.rendezvous else []
        if refused:
            why = (f"the key-value rendezvous at dist.master refused {'; '.join(refused)}: something "
                   "outside the job took part in it (docs/security.md)")
        else:
            why = ("check that every machine reaches node 0 at dist.master (node 0's report names anything "
                   f"outside the job that took part in the key-value rendezvous there), and read {err_path}")
        line = (f"paddle_dist: Paddle's launcher started no rank within {start_timeout:g} s although every "
                f"machine had arrived; {why}")
    print(line, file=sys.stderr, flush=True)
    return code


def pointed_run(pointer: Optional[Path]) -> Optional[Path]:
    """The run directory a fit() wrote into `pointer` (None when it wrote none)."""
    try:
        text = pointer.read_text().strip() if pointer else ""
    except OSError:
        return None
    return Path(text) if text and Path(text).is_dir() else None


def finish(request: Optional[str], run_dir: Optional[Path], logs: Dict[int, str],
           exits: Optional[List[Exit]] = None, exit_codes: Optional[Dict[int, int]] = None,
           launcher_code: int = 1, launcher_log: Optional[Path] = None,
           rerun: Tuple[str, ...] = (), machines: Machines = ONE_MACHINE) -> int:
    """Print the report of a job that failed or was stopped; return its exit code.
    `rerun`: the command that runs a user's script again (supervisor.UserScript.command)."""
    status = read_status(run_dir)
    if request == "interrupt":
        report = Report(errors.EXIT_INTERRUPTED, ["paddle_dist: interrupted; every rank was stopped"])
        if run_dir is None:
            rerun = ()                     # Ctrl+C by a user's script: one line
    else:
        report = root_cause(status, exit_codes, launcher_code=launcher_code, logs=logs, exits=exits,
                            machines=machines)
        if request == "stop" and exits and report.code != errors.EXIT_PREEMPTED and \
                first_failure(exits) is None and not status:
            report = stopped_unsaved(exits)
        if not status and not exit_codes and not exits and launcher_log is not None:
            report.lines += [f"  launcher log: {launcher_log}"] + \
                [f"  | {line}" for line in tail_lines(str(launcher_log), 8)]
    print(with_resume(report, run_dir, rerun).text, file=sys.stderr, flush=True)
    return report.code


def stopped_unsaved(exits: List[Exit]) -> Report:
    """Stopped on request (the launcher got SIGTERM or SIGUSR1 and passed SIGUSR1 on), but
    the ranks did not end with 75: a script that does not handle it dies of the signal."""
    ended = ", ".join(f"rank {e.rank} {how_it_ended(e.code)}" for e in exits)
    code = errors.exit_code_of(-signal.SIGTERM)
    return Report(code, [f"paddle_dist: the job was stopped on request (exit {code}); its ranks did "
                         f"not save and exit {errors.EXIT_PREEMPTED}: {ended}"])
