"""A run on disk and how it ended (imports no paddle: launchers and `python -m paddle_dist.runs`
read runs without it).

- status: RankStatus, the record each rank keeps in `<run>/status/rank<N>.json`;
- rundir: which directory a job writes to (given, continued or new), run.json, locks;
- commands: how this process was started, and the command that continues a run;
- report: the root cause of a job's end (logs.py: what it quotes of a log);
- topology: which ranks ran on which machine (Meeting, Machines);
- listing, __main__: `python -m paddle_dist.runs`, recent runs and how each ended.

Example:
    print(with_resume(root_cause(read_all(run_dir)), run_dir).text)
"""

from .commands import invoking_command, own_command, resume_command
from .report import Exit, Report, explain_from_rank, first_failure, root_cause, with_resume
from .rundir import choose, clear_status, release
from .status import RankStatus, read, read_all
from .topology import ONE_MACHINE, Machines, Meeting, Node

__all__ = ["ONE_MACHINE", "Exit", "Machines", "Meeting", "Node", "RankStatus", "Report", "choose",
           "clear_status", "explain_from_rank", "first_failure", "invoking_command", "own_command",
           "read", "read_all", "release", "resume_command", "root_cause", "with_resume"]
