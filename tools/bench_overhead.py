"""Framework overhead: paddle_dist's training step against the raw Paddle recipe's, measured
step by step in the same ranks, so that the machine's drift cancels out.

Usage:
    python tools/bench_overhead.py --model lenet                       # paddle_dist_dpsync
    python tools/bench_overhead.py --model mlp --variants paddle_dist_dpsync,paddle_dist_hapi_dpsync
    python tools/bench_overhead.py --model lenet --min-ratio 0.98      # a gate: exit 1 below

Why: on a shared machine the speed of a core changes by up to 1.5x for a few seconds at a
time (measured here: 16-18 ms LeNet steps for a while, then 25 ms, and back). Whole runs minutes apart (bench_train.py), and even
blocks of steps a second apart, then differ by 10-30 %, far more than a 2 % overhead.

How: each of the `--nprocs` ranks runs a paddle_dist job (the variant, through
`worker.main`, unchanged) and, in the same process, the raw recipe of bench_train.py
(`init_parallel_env`, `DataParallel`, `DistributedBatchSampler` + `DataLoader`, Adam) on
its own copy of the model. The two alternate one step each: the loader handed to
paddle_dist's trainer runs one raw step, timed, before it yields each of paddle_dist's
batches. On rank 0:
- raw step i     = the time of that raw step (its batch fetch included);
- paddle_dist's  = the rest of the cycle until the next raw step: its batch fetch, its
                   step, and all its bookkeeping (progress, watchdog, status file, lr).
The two of a pair run tens of milliseconds apart, in the same state of the machine.

Compare like with like: the variants that keep the raw recipe's sync and data path
(paddle_dist_dpsync, and paddle_dist_hapi_dpsync for paddle.Model.fit) measure paddle_dist's
own cost. With another sync (the default's shared memory), the time one rank waits for the
other moves between the two steps of a pair; compare syncs with bench_train.py instead.

Result: A/B = time(raw) / time(paddle_dist) over each chunk of `--chunk` steps (a
throughput ratio), the median over all chunks of all `--launches` fresh jobs, and a
distribution-free 95 % confidence interval for that median (binomial order statistics).
With several variants, also each one against the first (e.g. hapi against the loop).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import bench_train  # noqa: E402  (the variants, the raw recipe)

PROG = "bench_overhead"
VARIANTS = tuple(bench_train.PADDLE_DIST_VARIANTS)
DEFAULT_STEPS = {"lenet": 600, "mlp": 2000}


def _fail(message: str) -> None:
    bench_train._fail(message, PROG)


def _ratio(text: str) -> float:
    try:
        if float(text) > 0:
            return float(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    positive = bench_train._positive
    p = bench_train._Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    p.add_argument("--variants", default="paddle_dist_dpsync",
                   help=f"comma-separated, each against the raw recipe: {', '.join(VARIANTS)} "
                        "(default paddle_dist_dpsync: the raw recipe's own sync and data path)")
    p.add_argument("--nprocs", type=positive, default=2, help="ranks (2)")
    p.add_argument("--batch", type=positive, default=64, help="samples per rank per step (64)")
    p.add_argument("--steps", type=positive, help="timed steps per job (lenet 600, mlp 2000)")
    p.add_argument("--warmup", type=positive, default=30, help="untimed steps first (30)")
    p.add_argument("--chunk", type=positive, default=25, help="steps per ratio (25)")
    p.add_argument("--launches", type=positive, default=3, help="fresh jobs per variant (3)")
    p.add_argument("--min-ratio", type=_ratio, metavar="R",
                   help="exit 1 unless the 95%% interval of the first variant's A/B lies above R")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=positive, default=900, help="seconds per job (900)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    check_variants(args, VARIANTS, _fail)
    return args


def check_variants(args, known: Sequence[str], fail: Callable[[str], None]) -> None:
    """Set args.names from --variants; `fail` (one line, exit 2) unless each is one of
    `known`, none twice, and --chunk fits in --steps (bench_tokens.py checks its own so)."""
    args.names = [n.strip() for n in args.variants.split(",") if n.strip()]
    for name in args.names:
        if name not in known:
            fail(f"unknown variant {name!r}; choose from {', '.join(known)}")
    if not args.names or len(set(args.names)) != len(args.names):
        fail(f"--variants {args.variants!r}: give one or more different variants")
    if args.chunk > args.steps:
        fail(f"--chunk {args.chunk} is longer than --steps {args.steps}; lower it")


# ---------------------------------------------------------------- statistics
def median_interval(values: Sequence[float], confidence: float = 0.95):
    """(low, high): a distribution-free interval that holds the median with at least
    `confidence`, from order statistics (the count of values below the median is
    Binomial(n, 1/2)). None when there are too few values (n < 6 at 95 %)."""
    n, ordered = len(values), sorted(values)
    tail = (1 - confidence) / 2
    k, below = -1, 0.0          # the largest k with P(X <= k) <= tail
    while k + 1 < n and below + math.comb(n, k + 1) / 2 ** n <= tail:
        k += 1
        below += math.comb(n, k) / 2 ** n
    return None if k < 0 else (ordered[k], ordered[n - 1 - k])


def chunk_ratios(raw: Sequence[float], ours: Sequence[float], chunk: int) -> List[float]:
    """time(raw) / time(ours) over consecutive chunks of `chunk` step pairs (whole chunks)."""
    return [sum(raw[i:i + chunk]) / sum(ours[i:i + chunk])
            for i in range(0, len(raw) - chunk + 1, chunk)]


def summarise(args, jobs: Dict[str, List[dict]]) -> dict:
    out = {}
    for name, found in jobs.items():
        ratios = [r for job in found for r in chunk_ratios(job["raw"], job["ours"], args.chunk)]
        raw = [t for job in found for t in job["raw"]]
        ours = [t for job in found for t in job["ours"]]
        interval = median_interval(ratios)
        out[name] = {"ratio_median": statistics.median(ratios),
                     "ratio_interval_95": list(interval) if interval else None,
                     "ratio_overall": sum(raw) / sum(ours), "chunks": len(ratios),
                     "step_ms": 1000 * statistics.median(ours),
                     "raw_step_ms": 1000 * statistics.median(raw),
                     "per_job": [_overall(job) for job in found],
                     "per_job_other_ranks": [job["other_ranks"] for job in found]}
    return out


def report(args, s: dict) -> str:
    lines = ["| variant | vs raw recipe: median | 95 % interval | all steps | chunks | "
             "step (ms) | raw step (ms) |", "|---|---:|---|---:|---:|---:|---:|"]
    for name, v in s.items():
        low_high = "-" if v["ratio_interval_95"] is None else "{:.3f}-{:.3f}".format(*v["ratio_interval_95"])
        lines.append(f"| {name} | {v['ratio_median']:.3f} | {low_high} | {v['ratio_overall']:.3f} | "
                     f"{v['chunks']} | {v['step_ms']:.2f} | {v['raw_step_ms']:.2f} |")
    pairs = [(later, earlier) for i, earlier in enumerate(args.names) for later in args.names[i + 1:]]
    if pairs:
        lines.append("")
    for name, base in pairs:
        lines.append(f"{name} against {base}: "
                     f"{s[name]['ratio_median'] / s[base]['ratio_median']:.3f} (ratio of the medians)")
    return "\n".join(lines)


# ---------------------------------------------------------------- the driver
def launch_once(args, name: str, workdir: Path, index: int) -> dict:
    out = workdir / f"{name}-{index}.json"
    me = str(Path(__file__).resolve())
    tail = [me, "--worker", "--model", args.model, "--variants", name, "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--chunk", str(args.chunk),
            "--out", str(out)]
    return run_job(args, name, workdir, index, tail, out)


def run_jobs(args, launch: Callable, prog: str, line: Callable[[int, str, dict], str]):
    """`args.launches` jobs of every variant, `launch(args, name, workdir, index)` each, the
    variants' order rotating every round so that none always runs first; `line` says each
    job. {variant: [job, ...]}, or None when a job failed (said on stderr)."""
    jobs: Dict[str, List[dict]] = {name: [] for name in args.names}
    try:
        with tempfile.TemporaryDirectory(prefix=f"{prog}-") as tmp:
            for index in range(args.launches):
                for name in args.names[index % len(args.names):] + args.names[:index % len(args.names)]:
                    job = launch(args, name, Path(tmp), index)
                    jobs[name].append(job)
                    print(line(index, name, job), flush=True)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return jobs


def gate(args, summary: dict, prog: str, against: str) -> int:
    """--min-ratio: 1 unless the first variant's 95 % interval lies above it, else 0."""
    if args.min_ratio is None:
        return 0
    interval = summary[args.names[0]]["ratio_interval_95"]
    if interval is None or interval[0] < args.min_ratio:
        shown = "too few chunks" if interval is None else f"from {interval[0]:.3f}"
        print(f"{prog}: FAILED: the 95 % interval of {args.names[0]} against {against} "
              f"({shown}) does not lie above {args.min_ratio}", file=sys.stderr)
        return 1
    print(f"{args.names[0]} is above {args.min_ratio} of {against} with 95 % confidence")
    return 0


def run_job(args, name: str, workdir: Path, index: int, tail: List[str], out: Path) -> dict:
    """Job `index` of variant `name`: `python TAIL` on `args.nprocs` ranks (under
    paddle_dist.launch when more than one); rank 0's record from `out`, with the other
    ranks' overall ratios (bench_tokens.py runs its jobs through it too)."""
    cmd = [sys.executable] + tail
    if args.nprocs > 1:
        cmd = [sys.executable, "-m", "paddle_dist.launch", "--nprocs", str(args.nprocs),
               "--log_dir", str(workdir / f"logs-{name}-{index}")] + tail
    env = dict(os.environ, **bench_train.THREADS)
    proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=args.timeout)
    if proc.returncode != 0 or not out.is_file():
        lines = "\n".join(proc.stdout.splitlines()[-15:])
        raise RuntimeError(f"{name}, job {index + 1} failed (exit {proc.returncode}):\n{lines}")
    job = json.loads(out.read_text())
    # The other ranks' view, as a check: a rank that waits for a slower peer inside one
    # variant's step would show a different split.
    job["other_ranks"] = [_overall(json.loads(p.read_text()))
                          for p in sorted(workdir.glob(f"{name}-{index}.rank*.json"))]
    return job


def _overall(job: dict) -> float:
    return sum(job["raw"]) / sum(job["ours"])


def job_ratios(job: dict, chunk: int) -> str:
    """One job's ratio as its line says it: the median over chunks, their range, all steps
    and the other ranks' view (bench_tokens.py says its jobs so too)."""
    ratios = chunk_ratios(job["raw"], job["ours"], chunk)
    return (f"{statistics.median(ratios):.3f} (chunks {min(ratios):.3f}-{max(ratios):.3f}; all steps "
            f"{_overall(job):.3f}; other ranks {', '.join(f'{r:.3f}' for r in job['other_ranks']) or '-'})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    print(f"{PROG}: {args.model}, {', '.join(args.names)} against the raw recipe, step by step; "
          f"{args.nprocs} rank(s), batch {args.batch}/rank, {args.warmup} + {args.steps} steps, "
          f"{args.launches} job(s) each", flush=True)
    def line(index: int, name: str, job: dict) -> str:
        return f"job {index + 1}/{args.launches}  {name:<20} A/B {job_ratios(job, args.chunk)}"

    jobs = run_jobs(args, launch_once, PROG, line)
    if jobs is None:
        return 1
    summary = summarise(args, jobs)
    print()
    print(report(args, summary))
    if args.json:
        result = {"model": args.model, "nprocs": args.nprocs, "batch_per_rank": args.batch,
                  "steps": args.steps, "warmup": args.warmup, "chunk": args.chunk,
                  "launches": args.launches, "machine": bench_train.machine(), "variants": summary}
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return gate(args, summary, PROG, "the raw recipe")


# ---------------------------------------------------------------- the worker (one per rank)
class Alternating:
    """paddle_dist's training loader, with one timed raw step before each of its batches."""

    def __init__(self, loader, raw_factory, marks: List[tuple]):
        self.loader, self.raw_factory, self.marks = loader, raw_factory, marks

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        raw = self.raw_factory()
        raw_batches = iter(raw.loader)
        for i, batch in enumerate(self.loader):
            started = time.perf_counter()
            loss = raw.train_step(*next(raw_batches))
            if i % 20 == 0:             # bench_train's loop reads the loss every 20 steps
                float(loss)
            self.marks.append((started, time.perf_counter()))
            yield batch


def worker_main(args) -> int:
    from paddle_dist.trainer import job

    total = args.warmup + args.steps
    marks: List[tuple] = []
    built: list = []

    def raw_factory():
        if not built:
            built.append(bench_train.RawRecipe(args, total + 1))
        return built[0]

    # The composition root builds both levels' loader (trainer/job.py): the raw steps go in there.
    original = job.train_loader

    def alternating(parts, cfg, env, plan=None, agree=None):
        loader, sampler = original(parts, cfg, env, plan, agree)
        return Alternating(loader, raw_factory, marks), sampler

    job.train_loader = alternating
    run = argparse.Namespace(model=args.model, batch=args.batch, warmup=args.warmup, steps=args.steps,
                             out=str(Path(args.out).with_suffix(".run.json")),
                             overrides=",".join(bench_train.PADDLE_DIST_VARIANTS[args.names[0]]))
    bench_train._paddle_dist_worker(run, total + 1)     # + 1: the next raw step ends the last
    # marks[i] = (start, end) of raw step i; paddle_dist's step i runs from end_i to start_i+1.
    raw = [end - start for start, end in marks[args.warmup:total]]
    ours = [marks[i + 1][0] - marks[i][1] for i in range(args.warmup, total)]
    rank = bench_train._ranks()[0]
    out = Path(args.out) if rank == 0 else Path(args.out).with_suffix(f".rank{rank}.json")
    out.write_text(json.dumps({"raw": raw, "ours": ours}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
