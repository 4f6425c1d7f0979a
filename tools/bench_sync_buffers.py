"""What `python -m paddle_dist.launch --sync-buffers` costs a plain script's training step.

Usage:
    python tools/bench_sync_buffers.py                       # 2 ranks, 30 chunks of 20 steps each way
    python tools/bench_sync_buffers.py --nprocs 2 --chunks 30 --chunk 20 --batch 32 --json out.json

How: one job, `python -m paddle_dist.launch --nprocs N --sync-buffers` running this file as
its script. Every rank makes two copies of a small CNN with BatchNorm (three conv +
BatchNorm + ReLU blocks on 3x32x32, then a linear layer), each in paddle.DataParallel and so
each hooked by the launcher; the second is unhooked at once (BatchStats.close()), a plain
DataParallel. The two alternate, a chunk of --chunk training steps each (forward, backward,
SGD step, on fixed random batches: no loader), so that the machine's drift hits both alike;
rank 0 times every chunk after the first pair (warm-up).

Result: training steps per second of each (all their timed steps over all their time),
the ratio synced / plain, and the milliseconds the sync adds to a step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

PROG = "bench_sync_buffers"
ROOT = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    def error(self, message):          # bad input: one line, exit 2
        sys.stderr.write(f"{PROG}: error: {message} (see --help)\n")
        sys.exit(2)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return int(text)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nprocs", type=_positive, default=2, help="ranks (2)")
    p.add_argument("--batch", type=_positive, default=32, help="samples per rank per step (32)")
    p.add_argument("--chunk", type=_positive, default=20, help="steps per chunk (20)")
    p.add_argument("--chunks", type=_positive, default=30, help="timed chunks of each model (30)")
    p.add_argument("--json", help="also write the result here")
    p.add_argument("--rank-out", help=argparse.SUPPRESS)    # set for the ranks: rank 0 writes here
    return p.parse_args(argv)


# ---------------------------------------------------------------- in the ranks
def _cnn():
    import paddle.nn as nn

    def block(cin, cout, stride):
        return [nn.Conv2D(cin, cout, 3, stride=stride, padding=1), nn.BatchNorm2D(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 16, 1), *block(16, 32, 2), *block(32, 64, 2),
                         nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(64, 10))


def _chunk(model, opt, batches, steps: int) -> float:
    """Seconds for `steps` training steps of `model` (its last loss read, so all is done)."""
    import paddle.nn.functional as F

    started = time.perf_counter()
    for i in range(steps):
        x, y = batches[i % len(batches)]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    float(loss)
    return time.perf_counter() - started


def rank_main(opts: argparse.Namespace) -> None:
    import paddle
    import paddle.distributed as dist

    dist.init_parallel_env()
    paddle.seed(dist.get_rank())
    synced, plain = paddle.DataParallel(_cnn()), paddle.DataParallel(_cnn())
    stats = getattr(synced, "_paddle_dist_batch_stats", None)
    if stats is None:
        raise SystemExit(f"{PROG}: the DataParallel was not hooked; run under "
                         "python -m paddle_dist.launch --sync-buffers")
    plain._paddle_dist_batch_stats.close()
    models = {"synced": synced, "plain": plain}
    opts_of = {k: paddle.optimizer.SGD(0.01, parameters=m.parameters()) for k, m in models.items()}
    batches = [(paddle.randn([opts.batch, 3, 32, 32]), paddle.randint(0, 10, [opts.batch, 1]))
               for _ in range(4)]
    spent = {name: 0.0 for name in models}
    for chunk in range(opts.chunks + 1):
        for name in (("synced", "plain") if chunk % 2 else ("plain", "synced")):
            seconds = _chunk(models[name], opts_of[name], batches, opts.chunk)
            spent[name] += seconds if chunk else 0.0          # the first pair warms up
    if dist.get_rank() == 0:
        steps = opts.chunks * opts.chunk
        result = {"nprocs": dist.get_world_size(), "batch": opts.batch, "steps": steps,
                  **{f"{name}_steps_per_s": steps / spent[name] for name in models}}
        Path(opts.rank_out).write_text(json.dumps(result))


# ---------------------------------------------------------------- the parent
def main(argv: Optional[Sequence[str]] = None) -> int:
    opts = parse_args(argv)
    if opts.rank_out:
        rank_main(opts)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-sync-buffers-") as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "paddle_dist.launch", "--nprocs", str(opts.nprocs), "--sync-buffers",
                   "--log_dir", str(Path(tmp) / "log"), str(Path(__file__).resolve()),
                   "--batch", str(opts.batch), "--chunk", str(opts.chunk), "--chunks", str(opts.chunks),
                   "--rank-out", str(out)]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        if done.returncode or not out.is_file():
            sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
            sys.stderr.write(f"{PROG}: error: the job failed (exit {done.returncode})\n")
            return 1
        result = json.loads(out.read_text())
    synced, plain = result["synced_steps_per_s"], result["plain_steps_per_s"]
    result["ratio"] = synced / plain
    result["added_ms_per_step"] = 1000 * (1 / synced - 1 / plain)
    print(f"{result['nprocs']} ranks, {result['batch']} samples per rank per step, {result['steps']} timed "
          f"steps each (cpu count {os.cpu_count()})")
    print(f"plain DataParallel   {plain:8.2f} steps/s")
    print(f"--sync-buffers       {synced:8.2f} steps/s")
    print(f"ratio {result['ratio']:.3f}; the sync adds {result['added_ms_per_step']:.2f} ms per step")
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
