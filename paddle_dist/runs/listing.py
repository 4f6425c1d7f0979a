"""Recent runs and how each ended: `python -m paddle_dist.runs [--root runs] [-n 10] [--json]`;
`--clean` removes what this user's killed jobs left in /dev/shm (private.clean).

Reads what every run leaves behind: its ranks' status files (status/rank<N>.json, a
status.RankStatus each, written by runtime/monitor.py), metrics.json (written when the run
finished), the latest checkpoint and run.json (the command that started it: `--json`
gives, for a run that can be continued, the exact command that continues it). Nothing is
written. A job's launcher removes its private directory in /dev/shm (its token, heartbeats,
stacks) when it ends; one killed with SIGKILL cannot, and the next job of the same user, or
`--clean`, does.

States:
- done: every rank finished and metrics.json is there;
- running: a rank is still alive;
- preempted: every rank stopped on request (SIGTERM/SIGUSR1) after saving a checkpoint;
- diverged: the ranks' weights differed at a check (exit 7): never continued;
- refused: a rank ended on a user error (exit 2: a config, a data sample, a checkpoint):
  its command, run as it was, would fail the same way, so none is offered;
- failed: a rank raised, hung or died (killed without a record counts here too);
- unknown: no rank ever reported (a run dir whose job never started training).

Example:
    $ python -m paddle_dist.runs
    run                               state      step  epoch  last checkpoint        updated
    runs/mnist_lenet-20261123-053240  done        504      8  ckpt_000000504         2026-11-23 05:33
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from ..procfs import pid_alive
from ..options import ArgParser
from ..security import private
from .commands import resume_command
from .layout import META, Run, latest
from .status import DIVERGED, DONE, ENDED_BADLY, PREEMPTED, REFUSED, RUNNING, RankStatus, read_all

PROG = "python -m paddle_dist.runs"


def run_state(status: Dict[int, RankStatus], finished: bool) -> str:
    """A run's state from its ranks' status records (module docstring).

    Example:
        run_state({0: RankStatus(0, state="done"), 1: RankStatus(1, state="done")}, finished=True)   # 'done'
    """
    records = list(status.values())
    if not records:
        return "unknown"
    if any(r.state == RUNNING and pid_alive(r.pid) for r in records):
        return RUNNING
    if finished and all(r.state == DONE for r in records):
        return DONE
    if all(r.state == PREEMPTED for r in records):
        return PREEMPTED
    if any(r.state == DIVERGED for r in records):
        return DIVERGED
    # As the report's root cause: the first rank to end by itself.
    ended = sorted((r for r in records if r.state in ENDED_BADLY), key=lambda r: r.time or 0)
    return REFUSED if ended and ended[0].state == REFUSED else "failed"


def describe(run_dir: Path) -> dict:
    """One run's summary: state, progress, last checkpoint, last update (Unix time)."""
    run = Run(run_dir)
    status = read_all(run_dir)
    newest = latest(run.checkpoints)
    state = run_state(status, run.metrics.is_file())
    return {
        "run": str(run_dir),
        "state": state,
        "step": max((_or_0(r.step) for r in status.values()), default=0),
        "epoch": max((_or_0(r.epoch) for r in status.values()), default=0),   # 1-based
        "ranks": len(status),
        "last_checkpoint": str(newest) if newest else None,
        "checkpoint_step": _checkpoint_step(newest),
        # The last record any rank wrote; a run with none: when its directory last changed.
        "updated": max((_or_0(r.time) for r in status.values()), default=run_dir.stat().st_mtime),
        # The exact command that continues it ("" when done, running, refused or diverged).
        "resume": resume_command(run_dir) if state in ("failed", "preempted", "unknown") else "",
    }


def _or_0(value):
    """A record's number, 0 when it has none (a watchdog's record has no epoch)."""
    return 0 if value is None else value


def _checkpoint_step(path: Optional[Path]) -> Optional[int]:
    try:
        return int(json.loads((path / META).read_text())["global_step"]) if path else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def recent(root: Path, count: int) -> List[dict]:
    """The `count` most recently updated runs under `root`, newest first."""
    found = [describe(d) for d in root.iterdir() if d.is_dir() and Run(d).is_run()]
    return sorted(found, key=lambda run: run["updated"], reverse=True)[:count]


def table(runs: List[dict]) -> str:
    width = max([len("run")] + [len(run["run"]) for run in runs])
    lines = [f"{'run':<{width}}  {'state':<9} {'step':>6} {'epoch':>6}  {'last checkpoint':<22} updated"]
    for run in runs:
        ckpt = Path(run["last_checkpoint"]).name if run["last_checkpoint"] else "-"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(run["updated"]))
        lines.append(f"{run['run']:<{width}}  {run['state']:<9} {run['step']:>6} {run['epoch']:>6}  "
                     f"{ckpt:<22} {when}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = ArgParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="runs", help="where the runs are (output.root; default runs)")
    parser.add_argument("-n", "--last", type=int, default=10, help="how many runs, newest first (10)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--clean", action="store_true",
                        help="remove what this user's killed jobs left in /dev/shm (token, heartbeats), and say what")
    args = parser.parse_args(argv)
    if args.clean:
        removed = private.clean()
        print("\n".join(f"removed {path}" for path in removed) or "nothing left by killed jobs")
        return 0
    root = Path(args.root)
    if not root.is_dir():
        print(f"{PROG}: error: no run directory {root}/ here; pass --root with your output.root",
              file=sys.stderr)
        return 2
    if args.last < 1:
        print(f"{PROG}: error: --last must be 1 or more, not {args.last}", file=sys.stderr)
        return 2
    runs = recent(root, args.last)
    print(json.dumps(runs, indent=1) if args.json else table(runs) if runs else f"no runs in {root}/")
    return 0

