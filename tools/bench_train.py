"""Training throughput: paddle_dist against a raw-Paddle DataParallel loop (and PyTorch DDP
when torch is installed), at 1 rank and at N ranks, on synthetic MNIST-shaped data.

Usage:
    python tools/bench_train.py --model lenet --nprocs 2 [--reps 3] [--json out.json]
    python tools/bench_train.py --model mlp --nprocs 2 --variants paddle_dist,paddle_dist_hapi
    python tools/bench_train.py --model mlp --variant bf16=sync.compress=bf16
    python tools/bench_train.py --model lenet --variants paddle_dist,paddle_dataparallel,no_sync

What is measured: samples/s over `--steps` optimizer steps after `--warmup` steps, timed
inside rank 0 (start-up, data generation and evaluation excluded). Every process runs one
OpenMP thread. The variants run interleaved (rep 1 of each, then rep 2, ...), each rep in
a rotated order, so that drift of the machine spreads over all of them; the table shows
medians.

- efficiency = samples/s at N ranks / (N x samples/s of the same variant on 1 process)
- vs ref = samples/s at N ranks / that of paddle_dataparallel at N ranks (and vs
  paddle_dist: / that of paddle_dist)
- vs no_sync = samples/s at N ranks / that of no_sync (when measured): the share of the
  bound that is left once the ranks talk to each other
All are medians of the ratios within each rep (the samples/s columns are medians).

Variants (--variants, comma-separated):
- paddle_dist: the loop trainer as configured by default (fused gradient sync, batched data)
- paddle_dist_hapi: the same job through paddle.Model.fit (train.api=hapi)
- paddle_dist_dpsync: the loop trainer with Paddle's own DataParallel reducer as the
  reference builds it (find_unused_parameters off: sync.find_unused_parameters=false) and
  unbatched reading, the reference's sync and data path: its gap to the reference is
  paddle_dist's own overhead
- paddle_dist_hapi_dpsync: the same through paddle.Model.fit
- paddle_dataparallel: the raw recipe, written below: init_parallel_env, DataParallel,
  DistributedBatchSampler + DataLoader, Adam
- torch_ddp: the same model and loop in PyTorch with DistributedDataParallel (gloo)
- no_sync: the upper bound. N independent 1-rank paddle_dist processes started together,
  no process group and no communication, each with the same per-rank batch; its samples/s
  is their sum. What N ranks would reach if syncing cost nothing and the machine's cores,
  caches and memory bandwidth were the only limit
- NAME=key=value,key=value (--variant, repeatable): paddle_dist with these config overrides
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from paddle_dist.launch.launcher import free_port  # noqa: E402  (paddle-free)
from paddle_dist.procfs import die_with_parent, process_table  # noqa: E402  (paddle-free)

PROG = "bench_train"
PADDLE_DIST_VARIANTS = {
    "paddle_dist": [],
    "paddle_dist_hapi": ["train.api=hapi"],
    "paddle_dist_dpsync": ["sync.mode=dataparallel", "sync.find_unused_parameters=false", "data.batched=false"],
    "paddle_dist_hapi_dpsync": ["train.api=hapi", "sync.mode=dataparallel", "sync.find_unused_parameters=false",
                                "data.batched=false"],
}
OTHER_VARIANTS = ("paddle_dataparallel", "torch_ddp")
NO_SYNC = "no_sync"     # N separate 1-rank paddle_dist processes: the bound for N ranks
REFERENCE = "paddle_dataparallel"
DEFAULT_STEPS = {"lenet": 300, "mlp": 1000}
LR = 0.001
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def _fail(message: str, prog: str = PROG) -> None:
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    """Bad input: one line and exit 2 (also for the other benchmark tools)."""

    def error(self, message):
        _fail(f"{message} (see --help)", self.prog)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("lenet", "mlp"), default="lenet")
    p.add_argument("--nprocs", type=_positive, default=2, help="ranks of the parallel runs (2)")
    p.add_argument("--batch", type=_positive, default=64, help="samples per rank per step (64)")
    p.add_argument("--steps", type=_positive, help="timed steps (lenet 300, mlp 1000)")
    p.add_argument("--warmup", type=_positive, default=30, help="untimed steps first (30)")
    p.add_argument("--reps", type=_positive, default=3, help="repetitions of each run (3)")
    p.add_argument("--parallel-only", action="store_true",
                   help="skip the 1-rank runs (no efficiency): more reps of the N-rank ratios")
    p.add_argument("--variants", default="",
                   help="comma-separated (default: paddle_dist,paddle_dataparallel and "
                        "torch_ddp when torch is installed)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                   help="an extra paddle_dist variant with config overrides (repeatable)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=_positive, default=600, help="seconds per run (600)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--overrides", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.steps = args.steps or DEFAULT_STEPS[args.model]
    args.custom = dict(_custom_variant(text) for text in args.variant)
    args.names = _variant_names(args)
    return args


def _custom_variant(text: str):
    name, sep, overrides = text.partition("=")
    if not sep or not name or "=" not in overrides:
        _fail(f"--variant {text!r} must look like NAME=key=value[,key=value]")
    return name, overrides.split(",")


def _variant_names(args) -> List[str]:
    known = list(PADDLE_DIST_VARIANTS) + list(OTHER_VARIANTS) + [NO_SYNC] + list(args.custom)
    if args.variants:
        names = [n.strip() for n in args.variants.split(",") if n.strip()]
    else:
        names = ["paddle_dist", REFERENCE] + (["torch_ddp"] if _have_torch() else [])
    names += [n for n in args.custom if n not in names]
    for name in names:
        if name not in known:
            _fail(f"unknown variant {name!r}; choose from {', '.join(known)}")
    if "torch_ddp" in names and not _have_torch():
        _fail("torch_ddp needs PyTorch (pip install torch), which is not installed here")
    return names


def _have_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------------- the driver
def run_once(args, name: str, world: int, workdir: Path) -> List[dict]:
    """Start one run of `name` on `world` ranks; return the reports of its rank 0
    ({"samples_per_s": ..., "world": ...}): one, or for no_sync one per process."""
    stamp = f"{name}-{world}-{time.monotonic_ns()}"
    kind = name if name in OTHER_VARIANTS else "paddle_dist"
    overrides = PADDLE_DIST_VARIANTS.get(name, args.custom.get(name, []))

    def worker(out: Path) -> List[str]:
        return [str(Path(__file__).resolve()), "--worker", kind, "--model", args.model,
                "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--out", str(out), "--overrides", ",".join(overrides)]

    if name == NO_SYNC:
        outs = [workdir / f"{stamp}-p{i}.json" for i in range(world)]
        cmds = [[sys.executable] + worker(out) for out in outs]
    else:
        outs = [workdir / f"{stamp}.json"]
        cmds = [_job_command(args, kind, world, workdir) + worker(outs[0])]
    failed = run_together(cmds, dict(os.environ, **THREADS), workdir, args.timeout)
    if failed or not all(out.is_file() for out in outs):
        code, output = failed or (0, "(no result file written)")
        raise RuntimeError(f"{name} on {world} rank(s) failed (exit {code}):\n{output}")
    return [json.loads(out.read_text()) for out in outs]


def _job_command(args, kind: str, world: int, workdir: Path) -> List[str]:
    """What starts `world` ranks of one job (the worker's argv follows)."""
    if world == 1:
        return [sys.executable]
    if kind == "torch_ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
                "--master_port", str(free_port("127.0.0.1"))]
    return [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(world),
            "--log_dir", str(workdir / "logs"), "--log_level", "ERROR"]


def run_together(cmds: List[List[str]], env: dict, workdir: Path, timeout: float):
    """Start every command at once and wait for all; None when all succeeded, else
    (exit code, last lines of output) of the first that failed. Past `timeout`,
    subprocess.TimeoutExpired is raised. Each command runs in a session of its own, and
    whatever is left of it at the end (a rank that outlived its launcher) is killed: no
    stray process slows the next run; the commands die with this process. Output goes to
    files in `workdir`: a pipe nobody reads while another command is awaited could fill
    and stall its writer.

    Example:
        run_together([[sys.executable, "-c", "pass"]] * 2, dict(os.environ), Path("."), 60)  # None
    """
    logs = [workdir / f"output-{time.monotonic_ns()}-{i}.log" for i in range(len(cmds))]
    procs = []
    try:
        for cmd, log in zip(cmds, logs):
            with open(log, "w") as sink:
                procs.append(subprocess.Popen(cmd, env=env, cwd=workdir, stdout=sink,
                                              stderr=subprocess.STDOUT, start_new_session=True,
                                              preexec_fn=die_with_parent))
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
    finally:
        for proc in procs:
            _end_session(proc)
    for proc, log in zip(procs, logs):
        if proc.returncode != 0:
            return proc.returncode, "\n".join(log.read_text(errors="replace").splitlines()[-15:])
    return None


def _end_session(proc: subprocess.Popen) -> None:
    """Kill `proc` if it still runs, and every other process of its session."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid, state, _, session in process_table():
        if session == proc.pid and state != "Z":
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def measure(args):
    """(samples/s per variant and world size, one per rep; each variant's worker reports
    at N ranks: the world size its processes saw)."""
    runs = {name: {1: [], args.nprocs: []} for name in args.names}
    worlds = [args.nprocs] if args.parallel_only else sorted({1, args.nprocs})
    seen: Dict[str, List[int]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_train-") as tmp:
        for rep in range(args.reps):
            # Each rep starts with another variant: a run's position in the sequence
            # (e.g. right after a 2-rank run) shifts it by several percent here.
            order = args.names[rep % len(args.names):] + args.names[:rep % len(args.names)]
            for world in worlds if rep % 2 == 0 else worlds[::-1]:
                for name in order:
                    reports = run_once(args, name, world, Path(tmp))
                    value = sum(r["samples_per_s"] for r in reports)
                    runs[name][world].append(value)
                    if world == args.nprocs:
                        seen[name] = [r["world"] for r in reports]
                    print(f"rep {rep + 1}/{args.reps}  {name:<22} {world} rank(s)  "
                          f"{value:>10,.0f} samples/s", flush=True)
    return runs, seen


def summarise(args, runs, seen) -> dict:
    """Medians; the ratios are medians of per-rep ratios (runs of one rep ran minutes apart
    at most, so the machine's drift cancels out of them). `process_worlds`: the world size
    each process of the N-rank run reported ([N] for a job, [1] * N for no_sync)."""
    n = args.nprocs
    out = {}
    for name, by_world in runs.items():
        per_rep = [many / (n * one) for one, many in zip(by_world[1], by_world[n])]
        out[name] = {"samples_per_s": statistics.median(by_world[n]),
                     "samples_per_s_1rank": statistics.median(by_world[1]) if by_world[1] else None,
                     "efficiency": statistics.median(per_rep) if per_rep else None,
                     "process_worlds": seen[name],
                     "runs": {str(k): v for k, v in by_world.items()}}
    for key, base in (("vs_reference", REFERENCE), ("vs_paddle_dist", "paddle_dist"),
                      ("vs_no_sync", NO_SYNC)):
        if base in runs:
            for name, entry in out.items():
                entry[key] = statistics.median(
                    mine / other for mine, other in zip(runs[name][n], runs[base][n]))
    return out


def table(args, variants: dict) -> str:
    n = args.nprocs
    keys = ["vs_reference", "vs_paddle_dist"] + (["vs_no_sync"] if NO_SYNC in variants else [])
    lines = [f"| variant | 1 rank (samples/s) | {n} ranks (samples/s) | efficiency | vs ref | "
             "vs paddle_dist |" + (" vs no_sync |" if len(keys) == 3 else ""),
             "|---|---:|---:|---:" + "|---:" * len(keys) + "|"]
    for name, v in variants.items():
        ratios = " | ".join(f"{v[key]:.2f}x" if key in v else "-" for key in keys)
        one, eff = v["samples_per_s_1rank"], v["efficiency"]
        lines.append(f"| {name} | {'-' if one is None else f'{one:,.0f}'} | {v['samples_per_s']:,.0f} | "
                     f"{'-' if eff is None else f'{eff:.2f}'} | {ratios} |")
    return "\n".join(lines)


def machine() -> dict:
    import platform

    import paddle

    info = {"python": platform.python_version(), "paddle": paddle.__version__,
            "cpus": os.cpu_count(), "threads_per_rank": 1}
    if _have_torch():
        import torch

        info["torch"] = torch.__version__
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    print(f"{PROG}: {args.model}, batch {args.batch}/rank, {args.warmup} + {args.steps} steps, "
          f"{'' if args.parallel_only else '1 and '}{args.nprocs} ranks, {args.reps} reps: {', '.join(args.names)}", flush=True)
    try:
        variants = summarise(args, *measure(args))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print()
    print(table(args, variants))
    if args.json:
        result = {"model": args.model, "nprocs": args.nprocs, "batch_per_rank": args.batch,
                  "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                  "machine": machine(), "variants": variants}
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return 0


# ---------------------------------------------------------------- the workers (one per rank)
def worker_main(args) -> int:
    total = args.warmup + args.steps
    times = {"paddle_dist": _paddle_dist_worker, "paddle_dataparallel": _reference_worker,
             "torch_ddp": _torch_worker}[args.worker](args, total)
    rank, world = _ranks()
    if rank == 0:
        elapsed = times[total - 1] - times[args.warmup - 1]
        Path(args.out).write_text(json.dumps(
            {"samples_per_s": args.batch * world * args.steps / elapsed, "world": world}))
    return 0


def _ranks():
    """(global rank, world size) of this worker, however it was started (paddle_dist's
    environment layer reads the launcher's variables: Paddle's, torchrun's)."""
    from paddle_dist.runtime.devices import GpuInfo
    from paddle_dist.runtime.env import detect

    env = detect(gpu_info=GpuInfo())
    return env.global_rank, env.world_size


def _world() -> int:
    return _ranks()[1]


def _num_samples(args, total: int) -> int:
    return args.batch * _world() * total


def _paddle_dist_worker(args, total: int) -> List[float]:
    from paddle_dist import config, worker

    overrides = [f"model.name={args.model}", "data.name=synthetic",
                 f"data.num_samples={_num_samples(args, total)}", "data.num_eval_samples=64",
                 "train.epochs=1", f"train.batch_size={args.batch}", f"train.lr={LR}",
                 "train.drop_last=true", "train.log_every=1000000", "checkpoint.every_epochs=0",
                 f"output.run_dir={Path(args.out).with_suffix('')}"]
    overrides += [o for o in args.overrides.split(",") if o]
    return worker.main(config.load(overrides=overrides)).step_times


class RawRecipe:
    """The raw Paddle recipe, as its documentation writes it: init_parallel_env (which finds
    a group already up), DataParallel, DistributedBatchSampler + DataLoader, Adam. Also the
    reference of bench_overhead.py."""

    def __init__(self, args, total: int):
        import paddle
        import paddle.distributed as dist

        from paddle_dist.data import datasets
        from paddle_dist import models

        world = _world()
        if world > 1:
            dist.init_parallel_env()
        paddle.seed(2024)
        net = models.build(args.model)
        self.model = paddle.DataParallel(net) if world > 1 else net
        dataset = datasets.synthetic_classification(_num_samples(args, total))
        sampler = paddle.io.DistributedBatchSampler(dataset, batch_size=args.batch, shuffle=True,
                                                    drop_last=True)
        self.loader = paddle.io.DataLoader(dataset, batch_sampler=sampler, num_workers=0)
        self.optimizer = paddle.optimizer.Adam(learning_rate=LR, parameters=self.model.parameters())
        self.loss_fn = paddle.nn.CrossEntropyLoss()

    def train_step(self, x, y):
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        return loss


def _reference_worker(args, total: int) -> List[float]:
    recipe = RawRecipe(args, total)
    return _timed(recipe.loader, recipe.train_step)


def _torch_worker(args, total: int) -> List[float]:
    import torch
    import torch.distributed as tdist
    from torch import nn

    from paddle_dist.data import datasets

    torch.set_num_threads(1)
    world = _world()
    if world > 1:
        tdist.init_process_group("gloo")
    torch.manual_seed(2024)
    if args.model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 10))
    else:
        net = nn.Sequential(nn.Conv2d(1, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
                            nn.Linear(84, 10))
    model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    ds = datasets.synthetic_classification(_num_samples(args, total))
    dataset = torch.utils.data.TensorDataset(torch.from_numpy(ds.x), torch.from_numpy(ds.y[:, 0]))
    sampler = (torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True, drop_last=True)
               if world > 1 else torch.utils.data.RandomSampler(dataset))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, sampler=sampler,
                                         drop_last=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    loss_fn = nn.CrossEntropyLoss()

    def train_step(x, y):
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss

    times = _timed(loader, train_step)
    if world > 1:
        tdist.destroy_process_group()
    return times


def _timed(loader, train_step) -> List[float]:
    """Train over `loader`; perf_counter() after each step. The loss is read every 20
    steps, as a loop that logs its progress would."""
    times = []
    for step, (x, y) in enumerate(loader):
        loss = train_step(x, y)
        if step % 20 == 0:
            float(loss)
        times.append(time.perf_counter())
    return times


if __name__ == "__main__":
    sys.exit(main())
