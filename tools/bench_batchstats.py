"""What keeping BatchNorm's statistics equal on every rank costs `fit()` per step.

Usage:
    python tools/bench_batchstats.py                    # 2 ranks, 4 pairs of jobs
    python tools/bench_batchstats.py --nprocs 2 --pairs 6 --json out.json
    python tools/bench_batchstats.py --pairs 1 --samples 256     # a quick check that it runs

How: pairs of jobs, one after the other, `python -m paddle_dist.launch --nprocs N` running
this file as its script: `fit()` of a small CNN with BatchNorm (three conv + BatchNorm +
ReLU + pool blocks on 3x32x32, Momentum, batch 32 per rank, 2,048 random samples, one
epoch). In one job of each pair paddle_dist runs as it ships (sync/batchstats.py: the
forward pre-hooks' per-channel sums, carried by the gradients' exchange, and one update
per step); in the other every BatchStats finds no BatchNorm layer, so it hooks, carries
and updates nothing, and the ranks' weights check is off (each rank then keeps its own
statistics, which the check would refuse). A job without that finds no BatchStats built
fails, rather than timing the shipped path twice. fit()'s samples per second (its
progress clock) of each job are compared pair by pair.

Result: the median over the pairs of the ratio (as shipped / without), and each pair's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OFF = "PADDLE_DIST_BENCH_NO_BATCHSTATS"


def without_batchstats() -> list:
    """Turn BatchNorm's sync off in this process: every BatchStats (sync/batchstats.py, where
    the class lives, so wherever the trainer builds one) sees a net without BatchNorm, and
    the ranks' weights check does nothing. Returns the list each BatchStats built is added
    to: empty after fit(), the patch missed the trainer.

    Example:
        built = without_batchstats(); paddle_dist.fit(...); assert built
    """
    import paddle

    from paddle_dist.sync import batchstats
    from paddle_dist.trainer import agreement

    built, init = [], batchstats.BatchStats.__init__

    def no_layers(self, net, *args, **kwargs):
        init(self, paddle.nn.Layer(), *args, **kwargs)
        built.append(self)
    batchstats.BatchStats.__init__ = no_layers
    agreement.check = agreement.check_evaluated = lambda *args, **kwargs: None
    return built


def job(samples: int) -> None:
    """One rank of one job (run by the launcher)."""
    import numpy as np
    import paddle

    import paddle_dist

    built = without_batchstats() if os.environ.get(OFF) == "1" else None

    class Images(paddle.io.Dataset):
        def __init__(self, count):
            rng = np.random.RandomState(0)
            self.x = rng.randn(count, 3, 32, 32).astype("float32")
            self.y = rng.randint(0, 10, (count, 1)).astype("int64")

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)

    def block(given, made):
        return [paddle.nn.Conv2D(given, made, 3, padding=1), paddle.nn.BatchNorm2D(made),
                paddle.nn.ReLU(), paddle.nn.MaxPool2D(2)]

    paddle.seed(0)
    net = paddle.nn.Sequential(*block(3, 16), *block(16, 32), *block(32, 64), paddle.nn.Flatten(),
                               paddle.nn.Linear(64 * 16, 10))
    optimizer = paddle.optimizer.Momentum(0.01, parameters=net.parameters())
    result = paddle_dist.fit(net, Images(samples), None, paddle.nn.CrossEntropyLoss(), optimizer,
                             epochs=1, batch_size=32)
    if built == []:
        raise SystemExit("bench_batchstats: fit() built no sync.batchstats.BatchStats, so the job "
                         "without BatchNorm's sync would time it with; update without_batchstats()")
    if paddle.distributed.get_rank() == 0:
        print(f"SAMPLES_PER_S {result.samples_per_s}", flush=True)


def run(nprocs: int, off: bool, root: Path, samples: int) -> float:
    env = dict(os.environ, **{OFF: "1" if off else "0"})
    done = subprocess.run([sys.executable, "-m", "paddle_dist.launch", "--nprocs", str(nprocs),
                           "--log_dir", str(root / "log"), "-o", f"output.root={root / 'runs'}",
                           os.path.abspath(__file__), "--job", "--samples", str(samples)],
                          env=env, cwd=root, capture_output=True, text=True, timeout=600)
    found = [line for line in done.stdout.splitlines() if line.startswith("SAMPLES_PER_S")]
    if done.returncode != 0 or not found:
        raise SystemExit(f"a job failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return float(found[-1].split()[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--samples", type=int, default=2048, help="random images per job")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.job:
        job(args.samples)
        return 0
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)      # alternate who goes first
            speeds = {off: run(args.nprocs, off, Path(tmp), args.samples) for off in order}
            pairs.append((speeds[False], speeds[True]))
            print(f"pair {i + 1}: as shipped {speeds[False]:,.0f} samples/s, without {speeds[True]:,.0f}: "
                  f"ratio {speeds[False] / speeds[True]:.3f}", flush=True)
    ratio = statistics.median(a / b for a, b in pairs)
    print(f"{args.nprocs} ranks: median ratio {ratio:.3f} (as shipped / without BatchNorm sync)")
    if args.json:
        Path(args.json).write_text(json.dumps({"nprocs": args.nprocs, "pairs": pairs, "median_ratio": ratio}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
