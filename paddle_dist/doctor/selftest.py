"""`python -m paddle_dist.doctor --test`: a short real job on this machine, and a PASS/FAIL
table of what it found.

The job runs on the visible GPUs (NCCL), or on N CPU ranks (gloo; 2 when nothing says
otherwise), started the way train.py starts its ranks: `launcher.plan` then
`launcher.launch`, so the ranks meet through the real process-group path under
paddle_dist's supervisor. Each rank runs the checks of paddle_dist/doctor/checks.py (in
the order and with the deadlines of selftest_plan.py) and writes its rows to a folder of
its own; this process reads them and prints one row per check: all-reduce per dtype,
gradient sync (fused, overlap) against a one-process replay, checkpoint and RNG round
trip, mixed precision (GPUs), export and Paddle Inference.

Nothing waits forever: each check has a deadline on every rank (a watchdog process ends
a rank that hangs, see selftest_rank.run_check), the rendezvous has its own, and the
whole job a last one here. A check that hung or crashed is a FAIL row that says so.

Example:
    $ python -m paddle_dist.doctor --test --nprocs 2
    paddle_dist self-test: 2 ranks, gloo on CPU
    check               ranks  result  time    detail
    process group       2/2    PASS    717 ms  gloo, 2 rank(s), device cpu
    all-reduce float32  2/2    PASS    27 ms   1024 values summed exactly over 2 ranks
    ...
    self-test: 10 passed, 0 failed, 3 skipped in 6.1 s
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import errors
from .. import config as configlib
from ..runtime import devices as devicelib, env as envlib, variables as varlib
from ..launch import launcher
from ..launch.jobspec import JobSpec
from ..errors import UserError
from .selftest_plan import CONFIG_FILE, PLAN, SETUP

RENDEZVOUS_S = 60.0       # the ranks' dist.rendezvous_timeout
MARGIN_S = 60.0           # the whole job's deadline: every check's, the rendezvous's and this
NOT_RUN = "NOT RUN"
RANK_SCRIPT = """import sys
sys.path.insert(0, {root!r})
from paddle_dist.doctor import selftest_rank
sys.exit(selftest_rank.main(sys.argv[1:]))
"""


@dataclass
class Line:
    """One row of the table: a check, over every rank that runs it."""

    check: str
    ranks: str          # "2/2": ranks that passed / ranks that run it
    status: str         # PASS | FAIL | SKIP | NOT RUN
    seconds: float      # the slowest rank's
    detail: str


def run(nprocs: Optional[int] = None, gpus: Optional[str] = None, as_json: bool = False) -> int:
    """Run the self-test and print its table (or JSON); 0 when nothing failed, else 1
    (130 when interrupted). Keeps the ranks' logs when something failed."""
    host = varlib.host_facts()
    cfg = job_config(nprocs, gpus, devicelib.visible_gpus(host.gpus, host.environ))
    here = envlib.detect(gpus=cfg.dist.gpus, backend=cfg.dist.backend, gpu_info=host.gpus,
                         environ=host.environ)
    if here.launcher != "standalone":
        raise UserError("already inside a launched job; run the self-test from a shell")
    folder = Path(tempfile.mkdtemp(prefix="paddle_dist-selftest-"))
    try:
        p = prepare(cfg, here, folder, host)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)        # a refused plan leaves nothing behind
        raise
    started = time.perf_counter()
    code, expired = launch_quietly(p, folder, job_deadline())
    lines = assemble(read_ranks(folder, p.nprocs), p.nprocs, expired)
    show(lines, describe(p), time.perf_counter() - started, folder, as_json)
    if code == errors.EXIT_INTERRUPTED and not expired:
        return code
    if exit_code(lines) == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return exit_code(lines)


def prepare(cfg: configlib.Config, here: envlib.DistEnv, folder: Path,
            host: varlib.HostFacts) -> launcher.LaunchPlan:
    """Write the ranks' config and script into `folder`; the launch plan that runs them
    (launcher.plan: this machine's facts, one rank even, never in this process)."""
    (folder / CONFIG_FILE).write_text(json.dumps(cfg.to_dict()))
    script = folder / "rank.py"
    script.write_text(RANK_SCRIPT.format(root=str(Path(__file__).resolve().parents[2])))
    spec = JobSpec(cfg, host, here, script=str(script), script_args=(str(folder),))
    return launcher.plan(spec, always=True, log_dir=str(folder / "log"))


def job_config(nprocs: Optional[int], gpus: Optional[str], visible: Sequence[str]) -> configlib.Config:
    """The job: every visible GPU (or `gpus`), else `nprocs` CPU ranks, 2 by default."""
    if nprocs is not None and nprocs < 1:
        raise UserError(f"--nprocs must be >= 1 (got {nprocs}); use 2 for two processes")
    if gpus is not None and not gpus.strip():
        raise UserError("--gpus is empty; give GPU ids such as 0,1, or drop --gpus")
    if nprocs is None and not gpus:
        nprocs = len(visible) or 2
    overrides = ["dist.launcher=launch", f"dist.rendezvous_timeout={RENDEZVOUS_S:g}"]
    overrides += [f"dist.nprocs={nprocs}"] if nprocs is not None else []
    overrides += [f"dist.gpus={gpus}"] if gpus else []
    return configlib.with_overrides(overrides)


def job_deadline() -> float:
    """Seconds the whole job may take: every check's deadline, the rendezvous and a margin."""
    return sum(c.seconds for c in PLAN) + RENDEZVOUS_S + MARGIN_S


def describe(p: launcher.LaunchPlan) -> str:
    """'2 ranks, gloo on CPU', '4 ranks, NCCL on GPU 0,1,2,3', '1 rank on CPU'."""
    if p.nprocs == 1:
        return f"1 rank on GPU {p.gpus[0]}" if p.gpus else "1 rank on CPU"
    where = f"NCCL on GPU {','.join(p.gpus)}" if p.gpus else "gloo on CPU"
    return f"{p.nprocs} ranks, {where}"


def launch_quietly(p: launcher.LaunchPlan, folder: Path, seconds: float) -> Tuple[int, bool]:
    """Run the job with everything it prints (rank 0's output, the supervisor's report) in
    <folder>/launcher.out instead of this terminal; stop it after `seconds` (as Ctrl+C
    would: the supervisor stops every rank). Returns (exit code, whether time ran out)."""
    expired = threading.Event()

    def stop() -> None:
        expired.set()
        os.kill(os.getpid(), signal.SIGINT)     # the supervisor's wait loop handles it

    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    with open(folder / "launcher.out", "w") as sink, contextlib.redirect_stdout(sink), \
            contextlib.redirect_stderr(sink):
        timer.start()
        try:
            code = launcher.launch(p)
        finally:
            timer.cancel()
    return code, expired.is_set()


def read_ranks(folder: Path, world: int) -> Dict[int, Dict[str, Any]]:
    """Each rank's rows (rank<N>.json) and, for a rank its deadline stopped, why
    (hung<N>.json, written by the watchdog)."""
    ranks = {}
    for rank in range(world):
        # No file: the rank died (or hangs) before it could write one, in its set-up.
        data = _read_json(folder / f"rank{rank}.json") or {"rank": rank, "rows": [], "done": False,
                                                            "running": SETUP}
        hung = _read_json(folder / f"hung{rank}.json")
        data["hung"] = hung.get("error") if hung else None
        data["log"] = str(folder / "log" / f"workerlog.{rank}")
        ranks[rank] = data
    return ranks


def _read_json(path: Path) -> Optional[Dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- the table
def assemble(ranks: Dict[int, Dict[str, Any]], world: int, expired: bool = False) -> List[Line]:
    """One Line per check, from every rank's rows: FAIL when a rank failed it, hung or
    died in it, or when the ranks' weights differ; NOT RUN after a rank stopped."""
    lines = [_line(SETUP, ranks, list(range(world)), expired)]
    for check in PLAN:
        who = [0] if check.first_only else list(range(world))
        lines.append(_line(check.name, ranks, who, expired))
    return lines


def _line(name: str, ranks: Dict[int, Dict[str, Any]], who: List[int], expired: bool) -> Line:
    rows = {r: _row_of(name, ranks[r], expired) for r in who}
    statuses = [row["status"] for row in rows.values()]
    seconds = max((row.get("seconds", 0.0) for row in rows.values()), default=0.0)
    passed = f"{statuses.count('PASS')}/{len(who)}"
    for status in ("FAIL", NOT_RUN):
        if status in statuses:
            return Line(name, passed, status, seconds, _blame(rows, status))
    if all(s == "SKIP" for s in statuses):
        return Line(name, "-", "SKIP", seconds, rows[who[0]]["detail"])
    return _agreement(Line(name, passed, "PASS", seconds, rows[who[0]]["detail"]), rows)


def _blame(rows: Dict[int, Dict[str, Any]], status: str) -> str:
    """'rank 1: <why>' for the most telling of the ranks with `status`, then the others."""
    which = sorted((r for r, row in rows.items() if row["status"] == status),
                   key=lambda r: (_telling(rows[r]), r))
    others = f"; also rank{'s' * (len(which) > 2)} {', '.join(map(str, which[1:]))}" if len(which) > 1 else ""
    return f"rank {which[0]}: {rows[which[0]]['detail']}{others}"


def _telling(row: Dict[str, Any]) -> int:
    """Lowest first: a hang, a wrong result or error of the rank's own, then what follows
    from another rank's failure (a PeerFailure; an end without a result)."""
    if "cause" in row:
        return row["cause"]
    return 2 if row["detail"].startswith("PeerFailure") else 1


def _row_of(name: str, rank: Dict[str, Any], expired: bool) -> Dict[str, Any]:
    """This rank's row for check `name`, or what stands in for it when there is none
    ("cause": how telling it is, see _telling)."""
    found = next((row for row in rank["rows"] if row["check"] == name), None)
    if found is not None:
        return found
    if rank["running"] != name:
        return {"status": NOT_RUN, "detail": "stopped at an earlier check"}
    if rank["hung"]:
        return {"status": "FAIL", "cause": 0, "detail": f"{rank['hung']} (hung; stopped)"}
    if expired:
        return {"status": "FAIL", "cause": 0, "detail": "the self-test ran out of time here (hung; stopped)"}
    return {"status": "FAIL", "cause": 3, "detail": "ended in this check without a result (crashed, "
                                                    f"or stopped after another rank failed: see {rank['log']})"}


def _agreement(line: Line, rows: Dict[int, Dict[str, Any]]) -> Line:
    """A check whose rows carry the weights' digest passes only if every rank's is equal."""
    digests = {r: row.get("digest") for r, row in rows.items() if row.get("digest")}
    if len(digests) < 2:
        return line
    if len(set(digests.values())) == 1:
        line.detail += "; ranks bit-identical"
        return line
    differ = ", ".join(f"rank {r} {d[:12]}" for r, d in digests.items())
    return Line(line.check, line.ranks, "FAIL", line.seconds, f"the ranks' weights differ: {differ}")


def exit_code(lines: List[Line]) -> int:
    return 0 if all(line.status in ("PASS", "SKIP") for line in lines) else 1


def format_table(lines: List[Line]) -> str:
    header = ("check", "ranks", "result", "time", "detail")
    cells = [header] + [(x.check, x.ranks, x.status, _duration(x.seconds), x.detail) for x in lines]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4]
                     for row in cells)


def _duration(seconds: float) -> str:
    if not seconds:
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def summary(lines: List[Line], seconds: float) -> str:
    counts = {s: sum(x.status == s for x in lines) for s in ("PASS", "FAIL", "SKIP", NOT_RUN)}
    text = (f"self-test: {counts['PASS']} passed, {counts['FAIL']} failed, "
            f"{counts['SKIP']} skipped")
    if counts[NOT_RUN]:
        text += f", {counts[NOT_RUN]} not run"
    return f"{text} in {seconds:.1f} s"


def show(lines: List[Line], what: str, seconds: float, folder: Path, as_json: bool) -> None:
    kept = str(folder) if exit_code(lines) else None
    if as_json:
        print(json.dumps({"job": what, "seconds": seconds, "passed": exit_code(lines) == 0,
                          "rows": [asdict(x) for x in lines], "logs": kept}, indent=2))
        return
    print(f"paddle_dist self-test: {what}")
    print(format_table(lines))
    print(summary(lines, seconds))
    if kept:
        print(f"logs kept in {kept} (log/workerlog.N: each rank's output; launcher.out: the "
              "supervisor's report)")
    sys.stdout.flush()
