"""Sparse embedding tables: paddle_dist.fit() against the raw DataParallel loop, with the
bytes each step exchanges for the tables.

Usage:
    python tools/bench_sparse.py                               # 1M x 16, 2 ranks, 3 reps
    python tools/bench_sparse.py --rows 100000 --reps 1 --variants fit,raw,fit_dense
    python tools/bench_sparse.py --json out.json

The model: one table of --rows x --dim looked up by --fields ids per sample (uniform over
the table, so a step touches about batch x fields rows), the embeddings concatenated into
an MLP (64, 1), BCEWithLogitsLoss, SGD; --batch samples per rank, pre-built batches
(a Dataset with batch(), which fit() gathers in one call).

Variants (--variants, comma-separated):
- raw: raw Paddle, as its docs write it: init_parallel_env, DataParallel over the model
  with nn.Embedding(sparse=True) (Paddle's reducer averages the rows), the same batches
- fit: paddle_dist.fit() in its default mode (sync.mode=auto: fused over shared memory,
  the table's rows all-gathered, sync/sparse.py)
- fit_dataparallel: fit() with sync.mode=dataparallel (Paddle's reducer for the MLP)
- fit_dense: fit() with the table built sparse=False: its whole gradient averaged each step
- raw_dense: the raw loop with sparse=False

What is measured, in every rank: samples/s over --steps optimizer steps after --warmup
(rank 0's clock; all ranks step together), the peak resident memory of each rank through
the last step (MiB; fit()'s final checkpoint, which the raw loop does not write, comes
after and is left out: about twice the table more), and for fit the bytes this rank sent per step for the tables (Tables.sent_bytes) against
the rows this rank looked up per step. Every process runs one OpenMP thread; the variants
run interleaved, rep by rep in a rotated order, and the table shows medians.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import bench_train  # noqa: E402  (one-line errors)

VARIANTS = ("raw", "fit", "fit_dataparallel", "fit_dense", "raw_dense")


def parse(argv: List[str]) -> argparse.Namespace:
    p = bench_train._Parser(prog="bench_sparse", description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
    p.add_argument("--dim", type=int, default=16, help="width of the table")
    p.add_argument("--fields", type=int, default=8, help="ids looked up per sample")
    p.add_argument("--batch", type=int, default=512, help="samples per rank and step")
    p.add_argument("--steps", type=int, default=50, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps before the timing starts")
    p.add_argument("--nprocs", type=int, default=2, help="ranks")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each variant")
    p.add_argument("--variants", default="raw,fit,fit_dense", help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--json", help="write the measurements here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bad = [v for v in args.variants.split(",") if v not in VARIANTS]
    if bad:
        p.error(f"unknown variant {bad[0]!r}; choose from {', '.join(VARIANTS)}")
    if min(args.rows, args.dim, args.fields, args.batch, args.steps, args.nprocs, args.reps) < 1 or args.warmup < 0:
        p.error("--rows, --dim, --fields, --batch, --steps, --nprocs and --reps must be at least 1")
    return args


# ----------------------------------------------------------------- inside a rank
def build(paddle, args, sparse: bool):
    nn = paddle.nn

    class Tabular(nn.Layer):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(args.rows, args.dim, sparse=sparse)
            self.mlp = nn.Sequential(nn.Linear(args.fields * args.dim, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, ids):
            return self.mlp(self.table(ids).reshape([-1, args.fields * args.dim]))

    class Impressions(paddle.io.Dataset):
        def __init__(self, count):
            super().__init__()
            rng = np.random.RandomState(0)
            self.ids = rng.randint(0, args.rows, size=(count, args.fields)).astype("int64")
            self.y = (rng.rand(count, 1) < 0.3).astype("float32")

        def __getitem__(self, i):
            return self.ids[i], self.y[i]

        def __len__(self):
            return len(self.ids)

        def batch(self, indices):
            return self.ids[indices], self.y[indices]

    paddle.seed(1)
    return Tabular(), Impressions((args.warmup + args.steps) * args.batch * args.nprocs)


def rss_mib() -> float:
    """The process's peak resident memory so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def samples_per_s(times: List[float], args) -> float:
    return args.steps * args.batch * args.nprocs / (times[-1] - times[args.warmup - 1 if args.warmup else 0])


def raw(paddle, args, sparse: bool) -> dict:
    import paddle.distributed as dist

    dist.init_parallel_env()
    net, data = build(paddle, args, sparse)
    model = paddle.DataParallel(net)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    loss_fn = paddle.nn.BCEWithLogitsLoss()
    sampler = paddle.io.DistributedBatchSampler(data, args.batch, shuffle=False)
    batches = [[paddle.to_tensor(a) for a in data.batch(np.asarray(b))] for b in sampler]
    times = []
    for ids, y in batches:
        loss_fn(model(ids), y).backward()
        opt.step()
        opt.clear_grad()
        times.append(time.perf_counter())
    rows = statistics.mean(len(np.unique(ids.numpy())) for ids, _ in batches)
    return {"samples_per_s": samples_per_s(times, args), "rss_mib": rss_mib(), "rows_per_step": rows}


def fit(paddle, args, sparse: bool, overrides: List[str]) -> dict:
    import paddle_dist
    from paddle_dist.sync import sparse as tables_module

    made = []
    plain_init = tables_module.Tables.__init__

    def recording(self, *a, **k):     # the job's Tables, for its bytes
        plain_init(self, *a, **k)
        made.append(self)

    tables_module.Tables.__init__ = recording
    peak = []

    class Peak(paddle.callbacks.Callback):
        def on_train_end(self, logs=None):        # before fit() saves its final checkpoint
            peak.append(rss_mib())

    net, data = build(paddle, args, sparse)
    with tempfile.TemporaryDirectory() as run_dir:
        cfg = paddle_dist.load_config(overrides=["train.shuffle=false", "checkpoint.every_epochs=0",
                                                 "train.log_every=100000", f"output.run_dir={run_dir}/run",
                                                 *overrides])
        result = paddle_dist.fit(net, data, loss=paddle.nn.BCEWithLogitsLoss(), config=cfg, epochs=1,
                                 batch_size=args.batch, optimizer=paddle.optimizer.SGD(0.1, parameters=net.parameters()),
                                 callbacks=[Peak()])
    steps = args.warmup + args.steps
    sent = made[-1].sent_bytes / steps if made else 0.0
    rank, world = paddle.distributed.get_rank(), args.nprocs
    per_step = [len(np.unique(data.ids[(s * world + rank) * args.batch:(s * world + rank + 1) * args.batch]))
                for s in range(steps)]
    return {"samples_per_s": samples_per_s(result.step_times, args), "rss_mib": peak[0],
            "rss_with_save_mib": rss_mib(), "table_bytes_per_step": sent, "rows_per_step": statistics.mean(per_step)}


def worker(args) -> None:
    import paddle

    global np
    import numpy as np
    variant = args.worker
    sparse = not variant.endswith("_dense")
    if variant.startswith("raw"):
        found = raw(paddle, args, sparse)
    else:
        found = fit(paddle, args, sparse, ["sync.mode=dataparallel"] if variant == "fit_dataparallel" else [])
    rank = paddle.distributed.get_rank()
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(found))


# ----------------------------------------------------------------- the parent
def run_variant(args, variant: str, tmp: Path) -> dict:
    out = tmp / variant
    argv = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(args.nprocs),
            "--log_dir", str(tmp / f"log-{variant}"), __file__, "--worker", variant, "--out", str(out),
            *[f"--{k}={getattr(args, k)}" for k in ("rows", "dim", "fields", "batch", "steps", "warmup", "nprocs")]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"bench_sparse: {variant} failed (exit {done.returncode}); see {tmp}/log-{variant}")
    ranks = [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(args.nprocs)]
    return {**ranks[0], "rss_mib": [r["rss_mib"] for r in ranks]}


def main(argv: Optional[List[str]] = None) -> None:
    args = parse(sys.argv[1:] if argv is None else list(argv))
    if args.worker:
        worker(args)
        return
    variants = args.variants.split(",")
    found: Dict[str, List[dict]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for variant in order:
                found[variant].append(run_variant(args, variant, Path(tmp)))
    ref = statistics.median(r["samples_per_s"] for r in found["raw"]) if "raw" in found else None
    print(f"{args.rows} x {args.dim} table, {args.fields} ids per sample, batch {args.batch} per rank, "
          f"{args.nprocs} ranks, {args.steps} steps, medians of {args.reps}")
    print(f"{'variant':18s} {'samples/s':>10s} {'vs raw':>7s} {'peak MiB (ranks)':>18s} {'table bytes/step':>17s} {'rows/step':>9s}")
    for variant, reps in found.items():
        speed = statistics.median(r["samples_per_s"] for r in reps)
        ratio = statistics.median(r["samples_per_s"] for r in reps) / ref if ref else float("nan")
        rss = "/".join(f"{statistics.median(r['rss_mib'][i] for r in reps):.0f}" for i in range(args.nprocs))
        sent = reps[0].get("table_bytes_per_step")
        print(f"{variant:18s} {speed:10,.0f} {ratio:7.2f} {rss:>18s} "
              f"{(f'{sent:,.0f}' if sent is not None else '-'):>17s} {reps[0]['rows_per_step']:9,.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": found}, indent=1))


if __name__ == "__main__":
    main()
