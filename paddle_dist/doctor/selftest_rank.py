"""The self-test's rank side: what each rank of the job runs (selftest.py starts the job
and prints the table; the checks are in paddle_dist/doctor/checks.py).

Each rank sets up exactly as a training rank does (`process.setup`: device, process
group, seed), then runs CHECKS in order (selftest_plan.PLAN, each bound to its function).
Every check runs under a deadline (`monitor.deadline()`: a watchdog process ends a rank
that hangs, even inside native code that holds the GIL), and after every check the rank
rewrites <dir>/rank<N>.json with its rows so far and the check it is in, so that the
parent can say which check hung or crashed. A check's exception is a FAIL row. After a
FAIL the ranks go on to the next check when their collectives still line up: after every
check that all ranks run, they meet in one all-reduce (under a deadline). A wrong number,
a refused kernel or any failure that every rank met alike lets every row run and report;
a rank that crashed or hung in a check ends the job's collectives, and the later checks
are NOT RUN.

What brings paddle (runtime.process, the checks, sync's collectives) is imported by the
functions that a rank runs, never at module level: doctor/ imports no paddle when loaded.

Example (what selftest.py's generated script runs in every rank):
    sys.exit(selftest_rank.main(["/tmp/paddle_dist-selftest-x"]))
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from .. import config as configlib
from ..runtime import env as envlib
from ..runtime import monitor
from .selftest_plan import CONFIG_FILE, PLAN, SETUP

LINE_UP_S = 30.0          # the ranks' meeting after a check

if TYPE_CHECKING:
    from .checks import Job, Row


@dataclass(frozen=True)
class Check:
    name: str
    seconds: float                      # the deadline on each rank
    run: Callable[[Job], Row] = field(repr=False)
    first_only: bool = False            # global rank 0 alone (the others report nothing)


def _call(function: str, args: Tuple[str, ...], job: Job) -> Row:
    """<module>.<function>(*args, job) of doctor/ ("checks_amp.amp_step"; the module
    checks.py when none is named), imported when a rank runs its first check."""
    module, _, name = function.rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{module or 'checks'}"), name)(*args, job)


CHECKS = [Check(c.name, c.seconds, partial(_call, c.function, c.args), c.first_only) for c in PLAN]


# ---------------------------------------------------------------- the rank
class Recorder:
    """This rank's rows so far and the check it is in, rewritten atomically after each."""

    def __init__(self, path: Path, rank: int):
        self.path, self.data = path, {"rank": rank, "running": None, "done": False, "rows": []}

    def start(self, check: str) -> None:
        self.data["running"] = check
        self._write()

    def add(self, row: Row) -> None:
        self.data["rows"].append(dataclasses.asdict(row))
        self.data["running"] = None
        self._write()

    def finish(self) -> None:
        self.data["done"] = True
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)


def run_check(check: Check, job: Job) -> Row:
    """One check under its deadline; an exception is a FAIL row (its traceback goes to
    this rank's log)."""
    from .checks import FAIL, Row
    from ..sync.collectives import first_line
    message = f"self-test: {check.name} gave no result within {check.seconds:g} s"
    with monitor.deadline(check.seconds, message, job.scratch.parent / f"hung{job.env.global_rank}.json",
                         job.env.global_rank):
        started = time.perf_counter()       # the check's own time, not its watchdog's start
        try:
            row = check.run(job)
        except Exception as exc:  # noqa: BLE001 - every failure is a row of the table
            traceback.print_exc()
            row = Row(check.name, FAIL, detail=f"{type(exc).__name__}: {first_line(exc)}")
        row.seconds = time.perf_counter() - started
    return row


def lined_up(job: Job, after: str) -> bool:
    """Whether every rank finished check `after`: one all-reduce of all the ranks (nothing
    to do for one rank), under a deadline that ends a rank whose peers are gone."""
    if not job.env.is_distributed:
        return True
    import paddle
    import paddle.distributed as dist

    message = f"self-test: the ranks did not all finish {after}"
    with monitor.deadline(LINE_UP_S, message, job.scratch.parent / f"hung{job.env.global_rank}.json",
                          job.env.global_rank):
        try:
            count = paddle.to_tensor([1], dtype="int64")
            dist.all_reduce(count)
        except Exception:  # noqa: BLE001 - a peer gone: the collectives are broken
            traceback.print_exc()
            return False
    return int(count.numpy()[0]) == job.env.world_size


def _set_up(cfg: configlib.Config, recorder: Recorder) -> Optional[envlib.DistEnv]:
    """process.setup, as every training rank does it, recorded as the first row."""
    from ..runtime import process
    from .checks import FAIL, PASS, Row
    from ..sync.collectives import first_line
    recorder.start(SETUP)
    started = time.perf_counter()
    try:
        with process.quiet_paddle():
            env = process.setup(cfg)
    except Exception as exc:  # noqa: BLE001
        traceback.print_exc()
        recorder.add(Row(SETUP, FAIL, time.perf_counter() - started, f"{type(exc).__name__}: {first_line(exc)}"))
        return None
    recorder.add(Row(SETUP, PASS, time.perf_counter() - started,
                     f"{env.backend}, {env.world_size} rank(s), device {env.device}"))
    return env


def main(argv: List[str]) -> int:
    """A rank of the self-test; argv: the folder holding config.json, where rank<N>.json goes."""
    from .checks import Job
    folder = Path(argv[0])
    cfg = configlib.from_dict(json.loads((folder / CONFIG_FILE).read_text()))
    rank = envlib.detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend).global_rank
    recorder = Recorder(folder / f"rank{rank}.json", rank)
    env = _set_up(cfg, recorder)
    if env is None:
        return 1
    with tempfile.TemporaryDirectory(prefix=f"rank{rank}-", dir=folder) as scratch:
        job = Job(cfg, env, Path(scratch))
        for check in CHECKS:
            if check.first_only and not env.is_main:
                continue
            recorder.start(check.name)
            row = run_check(check, job)
            recorder.add(row)
            if not check.first_only and not lined_up(job, check.name):
                break                 # the ranks' collectives no longer line up: stop here
    recorder.finish()
    return 0
