"""Start-up time: from the command to the end of the first training step, for a 2-rank job
started each way paddle_dist supports, interleaved, `--runs` times each.

Usage:
    python tools/bench_startup.py [--runs 10] [--nprocs 2] [--json out.json]
                                  [--baseline CHECKOUT]

The job is configs/synthetic_lenet.yaml for one step (no checkpoint): the time includes
starting Python, `import paddle` in every rank, the process group, building the model and
data, and one step. The end is rank 0's clock when its first step ended (metrics.json's
`first_step_at`); the start is this process's clock just before it starts the command.

Ways:
- paddle_dist: `python train.py -o dist.nprocs=N` (ranks started by paddle_dist itself)
- paddle_dist_isolated: the same with `-o dist.isolate=true` (a network namespace of its own)
- paddle_dist_spawn: `python tools/spawn_train.py --nprocs N` (paddle.distributed.spawn)
- paddle_launch: `python -m paddle.distributed.launch --nproc_per_node N train.py`
- paddle_dist_baseline (with --baseline CHECKOUT): the paddle_dist way, run from another
  checkout of the project (`git worktree add /tmp/base <commit>`), whose train.py imports
  its own paddle_dist: what a change costs, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
PROG = "bench_startup"
BASELINE = "paddle_dist_baseline"
JOB = ["-c", "configs/synthetic_lenet.yaml", "-o", "train.max_steps=1",
       "-o", "checkpoint.every_epochs=0", "-o", "train.epochs=1"]


def commands(nprocs: int, run_dir: Path) -> Dict[str, List[str]]:
    job = JOB + ["-o", f"output.run_dir={run_dir}"]
    py = sys.executable
    return {
        "paddle_dist": [py, "train.py", "-o", f"dist.nprocs={nprocs}"] + job,
        "paddle_dist_isolated": [py, "train.py", "-o", f"dist.nprocs={nprocs}", "-o", "dist.isolate=true"] + job,
        "paddle_dist_spawn": [py, "tools/spawn_train.py", "--nprocs", str(nprocs)] + job,
        "paddle_launch": [py, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nprocs),
                          "--log_dir", str(run_dir / "launch"), "train.py"] + job,
    }


def once(cmd: List[str], run_dir: Path, timeout: float, cwd: Path = ROOT) -> float:
    """Seconds from starting `cmd` (in `cwd`) to the end of rank 0's first step."""
    start = time.time()
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    metrics = run_dir / "metrics.json"
    if proc.returncode != 0 or not metrics.is_file():
        tail = "\n".join(proc.stdout.splitlines()[-10:])
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return json.loads(metrics.read_text())["first_step_at"] - start


def measure(runs: int, nprocs: int, ways: Sequence[str], timeout: float,
            baseline: Optional[Path] = None) -> Dict[str, List[float]]:
    found: Dict[str, List[float]] = {way: [] for way in ways}
    with tempfile.TemporaryDirectory(prefix="bench_startup-") as tmp:
        for i in range(runs):
            for way in ways:
                run_dir = Path(tmp) / f"{way}-{i}"
                if way == BASELINE:
                    seconds = once(commands(nprocs, run_dir)["paddle_dist"], run_dir, timeout, baseline)
                else:
                    seconds = once(commands(nprocs, run_dir)[way], run_dir, timeout)
                found[way].append(seconds)
                print(f"run {i + 1}/{runs}  {way:<18} {seconds:6.2f} s", flush=True)
    return found


def table(found: Dict[str, List[float]]) -> str:
    lines = ["| way | median (s) | min (s) | max (s) | runs |", "|---|---:|---:|---:|---:|"]
    for way, values in found.items():
        lines.append(f"| {way} | {statistics.median(values):.2f} | {min(values):.2f} | "
                     f"{max(values):.2f} | {len(values)} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--ways", default="paddle_dist,paddle_dist_spawn,paddle_launch")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--baseline", metavar="CHECKOUT", type=Path,
                   help=f"also run the paddle_dist way from this checkout ({BASELINE})")
    args = p.parse_args(argv)
    ways = [w for w in args.ways.split(",") if w]
    if args.baseline:
        if not (args.baseline / "train.py").is_file():
            p.error(f"--baseline {args.baseline} has no train.py: give a checkout of this project")
        ways.append(BASELINE)
    unknown = set(ways) - set(commands(1, Path("."))) - {BASELINE}
    if unknown or args.runs < 1 or args.nprocs < 1:
        p.error(f"need --runs >= 1, --nprocs >= 1 and known --ways (unknown: {sorted(unknown)})")
    try:
        found = measure(args.runs, args.nprocs, ways, args.timeout, args.baseline)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print()
    print(table(found))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"nprocs": args.nprocs, "runs": found,
             "median_s": {w: statistics.median(v) for w, v in found.items()}}, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
