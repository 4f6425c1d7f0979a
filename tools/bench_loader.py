"""Image-folder training read by DataLoader workers: paddle_dist.fit() against plain Paddle's
DataLoader, with 0 and more worker processes per rank, on JPEGs decoded per sample.

Usage:
    python tools/bench_loader.py [--runs 3] [--workers 0,2] [--json out.json]
    python tools/bench_loader.py --frameworks paddle,paddle_dist,paddle_dist_loader -o sync.mode=dataparallel

It writes a JPEG folder (`--classes` folders of `--images` 64x64 images, in a temporary
directory or `--root`) and trains a small CNN on it on `--nprocs` ranks, reading it with the
Dataset a Paddle user writes: paddle.vision's DatasetFolder (Pillow decodes each JPEG in
__getitem__), then a random flip, HWC -> CHW and normalisation (numpy). Frameworks, each
run with every worker count W of --workers:
- paddle: the "three changes" under `python -m paddle.distributed.launch`: init_parallel_env,
  DataParallel, DistributedBatchSampler + DataLoader(num_workers=W), Adam
- paddle_dist: paddle_dist.fit(net, dataset) with data.num_workers=W under `python -m
  paddle_dist.launch` (W=0: samples read in the rank's own process); -o KEY=VALUE adds overrides
- paddle_dist_loader: fit(net, DataLoader(dataset, num_workers=W)), sharded by fit()

Measured: samples/s from the end of `--warmup` steps to the end of `--steps` more, timed in
rank 0 (start-up excluded; epochs end within it, each starting new workers). The variants
interleave, in an order rotated each repeat; the table gives medians, each ratio is the median
of the ratios within a repeat: "vs paddle" against plain Paddle with the same workers, "vs W0"
against the same framework with the first worker count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import bench_train  # noqa: E402  (one-line errors, threads per rank, running commands together)

PROG = "bench_loader"
FRAMEWORKS = ("paddle", "paddle_dist", "paddle_dist_loader")
SIZE, LR = 64, 0.001


def _workers(text: str) -> List[int]:
    found = [int(w) for w in text.split(",") if w.strip().lstrip("-").isdigit()]
    if len(found) != len(text.split(",")) or min(found) < 0 or len(set(found)) != len(found):
        raise argparse.ArgumentTypeError(f"expected different counts >= 0 like 0,2, got {text!r}")
    return found


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    positive = bench_train._positive
    p = bench_train._Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frameworks", default="paddle,paddle_dist",
                   help=f"comma-separated: {', '.join(FRAMEWORKS)}")
    p.add_argument("--workers", type=_workers, default=[0, 2], help="DataLoader workers per rank (0,2)")
    p.add_argument("--nprocs", type=positive, default=2, help="ranks (2)")
    p.add_argument("--classes", type=positive, default=4, help="class folders (4)")
    p.add_argument("--images", type=positive, default=128, help="JPEG images per class (128)")
    p.add_argument("--batch", type=positive, default=32, help="samples per rank per step (32)")
    p.add_argument("--steps", type=positive, default=48, help="timed steps (48)")
    p.add_argument("--warmup", type=positive, default=2, help="untimed steps first (2)")
    p.add_argument("--runs", type=positive, default=3, help="repeats of every variant (3)")
    p.add_argument("-o", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for the paddle_dist runs (repeatable)")
    p.add_argument("--root", type=Path, help="write the images here, and keep them (default: a temporary dir)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=positive, default=600, help="seconds per run (600)")
    p.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    p.add_argument("--num-workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.names = [n.strip() for n in args.frameworks.split(",") if n.strip()]
    if not args.names or set(args.names) - set(FRAMEWORKS) or len(set(args.names)) != len(args.names):
        bench_train._fail(f"--frameworks {args.frameworks!r}: give different ones of "
                          f"{', '.join(FRAMEWORKS)}", PROG)
    if args.images * args.classes < args.batch * args.nprocs:
        bench_train._fail(f"{args.classes} x {args.images} images make no batch of {args.batch} on "
                          f"{args.nprocs} ranks; raise --images", PROG)
    return args


# ---------------------------------------------------------------- the driver
def write_images(root: Path, classes: int, per_class: int) -> None:
    """Smooth random 64x64 JPEGs (an upscaled 8x8 noise pattern tinted by class), as photos
    compress, in root/class_<c>/<i>.jpg; the same files every time."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True, exist_ok=True)
        tint = rng.uniform(0, 255, 3)
        for i in range(per_class):
            low = Image.fromarray(np.uint8(0.5 * rng.uniform(0, 255, (8, 8, 3)) + 0.5 * tint))
            low.resize((SIZE, SIZE), Image.BILINEAR).save(root / f"class_{c}" / f"{i}.jpg", quality=90)


def run_once(args, name: str, workers: int, root: Path, workdir: Path) -> float:
    """Samples/s of one `--nprocs`-rank run of `name` with `workers` workers per rank."""
    out, py = workdir / f"{name}-w{workers}-{time.monotonic_ns()}.json", sys.executable
    if name == "paddle":
        launch = [py, "-m", "paddle.distributed.launch", "--nproc_per_node", str(args.nprocs),
                  "--log_dir", str(out.with_suffix(".logs")), "--log_level", "ERROR"]
    else:
        launch = [py, "-m", "paddle_dist.launch", "--nprocs", str(args.nprocs),
                  "--log_dir", str(out.with_suffix(".logs"))] + [a for o in args.overrides for a in ("-o", o)]
    cmd = launch + [str(Path(__file__).resolve()), "--worker", name, "--num-workers", str(workers),
                    "--root", str(root), "--batch", str(args.batch), "--steps", str(args.steps),
                    "--warmup", str(args.warmup), "--out", str(out)]
    failed = bench_train.run_together([cmd], dict(os.environ, **bench_train.THREADS), workdir, args.timeout)
    if failed or not out.is_file():
        code, output = failed or (0, "(no result file written)")
        raise RuntimeError(f"{name} with {workers} worker(s) failed (exit {code}):\n{output}")
    return json.loads(out.read_text())["samples_per_s"]


def measure(args, root: Path, workdir: Path) -> Dict[str, List[float]]:
    variants = [(n, w) for n in args.names for w in args.workers]
    runs: Dict[str, List[float]] = {f"{n}_w{w}": [] for n, w in variants}
    for rep in range(args.runs):
        for name, workers in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            value = run_once(args, name, workers, root, workdir)
            runs[f"{name}_w{workers}"].append(value)
            print(f"run {rep + 1}/{args.runs}  {name:<18} {workers} worker(s)  {value:>8,.0f} samples/s",
                  flush=True)
    return runs


def summarise(args, runs: Dict[str, List[float]]) -> dict:
    """Medians, and the medians of the within-repeat ratios."""
    def ratio(a: str, b: str):
        return statistics.median(x / y for x, y in zip(runs[a], runs[b])) if b in runs else None

    w0 = args.workers[0]
    return {key: {"samples_per_s": statistics.median(values), "runs": values,
                  "vs_paddle": ratio(key, "paddle_w" + key.rsplit("_w", 1)[1]),
                  "vs_w0": ratio(key, f"{key.rsplit('_w', 1)[0]}_w{w0}")}
            for key, values in runs.items()}


def table(args, found: dict) -> str:
    lines = ["| variant | samples/s (median) | vs paddle (same workers) | "
             f"vs {args.workers[0]} workers |", "|---|---:|---:|---:|"]
    for key, v in found.items():
        cells = ["-" if v[k] is None else f"{v[k]:.2f}x" for k in ("vs_paddle", "vs_w0")]
        lines.append(f"| {key} | {v['samples_per_s']:,.0f} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    print(f"{PROG}: {args.classes} x {args.images} JPEGs {SIZE}x{SIZE}, batch {args.batch}/rank, "
          f"{args.nprocs} ranks, {args.warmup} + {args.steps} steps, workers {args.workers}, "
          f"{args.runs} runs: {', '.join(args.names)}", flush=True)
    load = [os.getloadavg()[0]]       # a shared machine: say how busy it was
    with tempfile.TemporaryDirectory(prefix=f"{PROG}-") as tmp:
        root = args.root or Path(tmp) / "images"
        write_images(root, args.classes, args.images)
        try:
            found = summarise(args, measure(args, root, Path(tmp)))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
    load.append(os.getloadavg()[0])
    print(f"\n{table(args, found)}\n\nload average (1 min) before and after: {load[0]:.2f}, {load[1]:.2f}")
    if args.json:
        result = {key: getattr(args, key) for key in ("nprocs", "classes", "images", "batch", "steps",
                                                      "warmup", "runs", "workers", "overrides")}
        result.update(machine=bench_train.machine(), load_average=load, variants=found)
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return 0


# ---------------------------------------------------------------- the ranks
def user_dataset(root: Path):
    """The Dataset a Paddle user writes: each JPEG decoded in __getitem__, then numpy transforms."""
    from paddle.vision import transforms as T
    from paddle.vision.datasets import DatasetFolder

    transform = T.Compose([T.RandomHorizontalFlip(), T.Transpose(),
                           T.Normalize(mean=127.5, std=127.5, data_format="CHW")])
    return DatasetFolder(str(root), transform=transform)


def user_net(classes: int):
    """A small CNN, seeded (the same weights in every rank and every run)."""
    import paddle
    from paddle import nn

    paddle.seed(2024)
    return nn.Sequential(nn.Conv2D(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Conv2D(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2D(2),
                         nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(32, classes))


def worker_main(args) -> int:
    total = args.warmup + args.steps
    times = (_plain_worker if args.worker == "paddle" else _fit_worker)(args, total)
    rank, world = bench_train._ranks()
    if len(times) != total:
        raise RuntimeError(f"{args.worker} ran {len(times)} steps, not {total}")
    if rank == 0:
        elapsed = times[total - 1] - times[args.warmup - 1]
        Path(args.out).write_text(json.dumps({"samples_per_s": args.batch * world * args.steps / elapsed}))
    return 0


def _plain_worker(args, total: int) -> List[float]:
    import paddle
    import paddle.distributed as dist

    dist.init_parallel_env()
    dataset = user_dataset(args.root)
    model = paddle.DataParallel(user_net(len(dataset.classes)))
    sampler = paddle.io.DistributedBatchSampler(dataset, batch_size=args.batch, shuffle=True, drop_last=True)
    loader = paddle.io.DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers)
    optimizer = paddle.optimizer.Adam(learning_rate=LR, parameters=model.parameters())
    loss_fn, times, epoch = paddle.nn.CrossEntropyLoss(), [], 0
    while len(times) < total:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            if len(times) % 20 == 0:
                float(loss)             # a loop that logs its progress reads the loss
            times.append(time.perf_counter())
            if len(times) == total:
                break
        epoch += 1
    return times


def _fit_worker(args, total: int) -> List[float]:
    import paddle

    import paddle_dist

    world = bench_train._ranks()[1]
    dataset = user_dataset(args.root)
    per_epoch = len(dataset) // (args.batch * world)
    cfg = paddle_dist.load_config(overrides=[
        f"train.batch_size={args.batch}", "train.drop_last=true", f"train.max_steps={total}",
        f"train.epochs={-(-total // per_epoch)}", f"data.num_workers={args.num_workers}",
        "train.log_every=1000000", "checkpoint.every_epochs=0",
        f"output.run_dir={Path(args.out).with_suffix('.run')}"])
    paddle_dist.setup(cfg)                  # device, process group and seed, before the model
    net, data = user_net(len(dataset.classes)), dataset
    if args.worker == "paddle_dist_loader":
        data = paddle.io.DataLoader(dataset, batch_size=args.batch, shuffle=True, drop_last=True,
                                    num_workers=args.num_workers)
    optimizer = paddle.optimizer.Adam(learning_rate=LR, parameters=net.parameters())
    return paddle_dist.fit(net, data, optimizer=optimizer, config=cfg).step_times


if __name__ == "__main__":
    sys.exit(main())
