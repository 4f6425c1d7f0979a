"""Tokens/s of fit() against a plain DataParallel loop on the same stream, step by step in
the same ranks, and the cost of fit()'s evaluation against the same forward passes in a
plain loop.

Usage:
    python tools/bench_tokens.py                                   # fit and fit_mean, 2 ranks
    python tools/bench_tokens.py --variants fit,fit_mean,fit_hapi,fit_dpsync --launches 3
    python tools/bench_tokens.py --min-ratio 0.95                  # a gate: exit 1 below

The job is docs/examples/causal_lm.py's: its causal LM, its byte stream of text files (the
docs' .md files; lane r of W reads files r, r + W, ... pass after pass, 8 sequences of 2 to
64 bytes at a time, padded per batch), its AdamW, warm-up + cosine and clipping.

How (as tools/bench_overhead.py, whose reasons hold here): each rank runs fit() on the
example and, in the same process, a plain loop on its own copy of the model; the two
alternate one optimizer step each. The loader fit() reads runs one plain step, timed,
before it yields each of fit()'s batches. The plain loop is the one a user writes for
this job: `paddle.DataParallel`, the rank's lane of the same files, the count of the
step's tokens all-reduced first and each rank's NLL sum scaled by W / that count (so that
DataParallel's mean over ranks is Σ NLL / Σ tokens, fit()'s objective), AdamW stepped.
Both read the same micro-batches at every step (checked over the warm-up steps), so a
ratio of times is a ratio of tokens/s. On rank 0:
- plain step i  = its batch read and padded, forward, count all-reduce, backward, step;
- fit()'s step  = the rest of the cycle until the next plain step: its batch read, its
                  step and its bookkeeping (progress, loss, lr, watchdog, status file).
A ratio is time(plain) / time(fit) over a chunk of `--chunk` step pairs (fit()'s tokens/s
over the plain loop's); the table gives the median over all chunks of all `--launches`
jobs and a distribution-free 95 % interval for it (bench_overhead.median_interval).

Variants (--variants, comma-separated), each against the same plain loop:
- fit: the example as it is (its loss returns its mean and its count; the default sync)
- fit_mean: the same run with the loss's plain mean (no count): against `fit`, the cost
  of exchanging the token count
- fit_hapi: `fit` through paddle.Model.fit (train.api=hapi)
- fit_dpsync: `fit` with Paddle's DataParallel reducer (sync.mode=dataparallel), the plain
  loop's own sync: fit()'s overhead, like with like

Evaluation: every `--eval-every` steps fit() evaluates the example's eval set
(train.eval_every_steps), and right before or after it (alternating) the plain loop
evaluates the same batches on the same model (eval_batches: those fit() gives the rank,
read as fit() reads them): no_grad forward, the NLL sum and count of each batch read, one
all-reduce. The ratio is time(fit()'s evaluation, all it does: the check that the ranks
evaluate one model, the progress line, the best-checkpoint decision) / time(the plain
one), per pair; with a counted loss both token means are checked to agree. The time of
both is left out of the step pairs.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import bench_overhead  # noqa: E402  (the statistics)
import bench_train  # noqa: E402  (the parser, the threads, the machine)

PROG = "bench_tokens"
EXAMPLE = ROOT / "docs" / "examples" / "causal_lm.py"
VARIANTS = {                     # name: (config overrides, the loss returns its count)
    "fit": ([], True),
    "fit_mean": ([], False),
    "fit_hapi": (["train.api=hapi"], True),
    "fit_dpsync": (["sync.mode=dataparallel"], True),
}


def _fail(message: str) -> None:
    bench_train._fail(message, PROG)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    positive = bench_train._positive
    p = bench_train._Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="fit,fit_mean",
                   help=f"comma-separated, each against the plain loop: {', '.join(VARIANTS)} (fit,fit_mean)")
    p.add_argument("--nprocs", type=positive, default=2, help="ranks (2)")
    p.add_argument("--steps", type=positive, default=240, help="timed steps per job (240)")
    p.add_argument("--warmup", type=positive, default=20, help="untimed steps first (20)")
    p.add_argument("--chunk", type=positive, default=20, help="steps per ratio (20)")
    p.add_argument("--launches", type=positive, default=2, help="fresh jobs per variant (2)")
    p.add_argument("--eval-every", type=positive, default=20, help="steps between evaluations (20)")
    p.add_argument("--min-ratio", type=bench_overhead._ratio, metavar="R",
                   help="exit 1 unless the 95%% interval of the first variant's ratio lies above R")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=positive, default=600, help="seconds per job (600)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    bench_overhead.check_variants(args, VARIANTS, _fail)
    return args


# ---------------------------------------------------------------- statistics
def _interval(values: Sequence[float]):
    found = bench_overhead.median_interval(values)
    return list(found) if found else None


def summarise(args, jobs: Dict[str, List[dict]]) -> dict:
    """Per variant: the tokens/s ratio (median of chunks, its interval, over all steps),
    both sides' tokens/s and step times, and the evaluation pairs' ratio."""
    out = {}
    for name, found in jobs.items():
        ratios = [r for job in found for r in bench_overhead.chunk_ratios(job["raw"], job["ours"], args.chunk)]
        raw = [t for job in found for t in job["raw"]]
        ours = [t for job in found for t in job["ours"]]
        tokens = sum(sum(job["tokens"]) for job in found)
        evals = [fit / plain for job in found for fit, plain in job["evals"]]
        out[name] = {"ratio_median": statistics.median(ratios), "ratio_interval_95": _interval(ratios),
                     "ratio_overall": sum(raw) / sum(ours), "chunks": len(ratios),
                     "tokens_per_s": tokens / sum(ours), "plain_tokens_per_s": tokens / sum(raw),
                     "step_ms": 1000 * statistics.median(ours), "plain_step_ms": 1000 * statistics.median(raw),
                     "eval_ratio_median": statistics.median(evals) if evals else None,
                     "eval_ratio_interval_95": _interval(evals), "eval_pairs": len(evals),
                     "eval_ms": 1000 * statistics.median(f for job in found for f, _ in job["evals"]) if evals else None,
                     "plain_eval_ms": 1000 * statistics.median(p for job in found for _, p in job["evals"]) if evals else None,
                     "eval_loss_rel_diff": max(job["eval_loss_rel_diff"] for job in found),
                     "per_job": [sum(job["raw"]) / sum(job["ours"]) for job in found],
                     "per_job_other_ranks": [job["other_ranks"] for job in found]}
    return out


def _span(interval) -> str:
    return "-" if interval is None else "{:.3f}-{:.3f}".format(*interval)


def report(args, s: dict) -> str:
    lines = ["| variant | fit() tokens/s vs plain: median | 95 % interval | all steps | chunks | "
             "fit() tokens/s | plain tokens/s | eval vs plain: median | 95 % interval | pairs | "
             "eval (ms) | plain eval (ms) |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, v in s.items():
        evals = ("- | - | 0 | - | -" if v["eval_ratio_median"] is None else
                 f"{v['eval_ratio_median']:.3f} | {_span(v['eval_ratio_interval_95'])} | {v['eval_pairs']} | "
                 f"{v['eval_ms']:.1f} | {v['plain_eval_ms']:.1f}")
        lines.append(f"| {name} | {v['ratio_median']:.3f} | {_span(v['ratio_interval_95'])} | "
                     f"{v['ratio_overall']:.3f} | {v['chunks']} | {v['tokens_per_s']:,.0f} | "
                     f"{v['plain_tokens_per_s']:,.0f} | {evals} |")
    if "fit" in s and "fit_mean" in s:
        lines += ["", "the token count's exchange: fit against fit_mean "
                      f"{s['fit']['ratio_median'] / s['fit_mean']['ratio_median']:.3f} (ratio of the medians)"]
    return "\n".join(lines)


# ---------------------------------------------------------------- the driver
def launch_once(args, name: str, workdir: Path, index: int) -> dict:
    out = workdir / f"{name}-{index}.json"
    tail = [str(Path(__file__).resolve()), "--worker", "--variants", name, "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--chunk", str(min(args.chunk, args.steps)),
            "--eval-every", str(args.eval_every), "--out", str(out)]
    return bench_overhead.run_job(args, name, workdir, index, tail, out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    print(f"{PROG}: causal_lm.py, {', '.join(args.names)} against a plain DataParallel loop, step by "
          f"step; {args.nprocs} rank(s), {args.warmup} + {args.steps} steps, an evaluation every "
          f"{args.eval_every}, {args.launches} job(s) each", flush=True)
    def line(index: int, name: str, job: dict) -> str:
        evals = [f / p for f, p in job["evals"]]
        return (f"job {index + 1}/{args.launches}  {name:<11} tokens/s vs plain "
                f"{bench_overhead.job_ratios(job, args.chunk)}  eval vs plain "
                f"{statistics.median(evals) if evals else float('nan'):.3f} ({len(evals)} pairs)")

    jobs = bench_overhead.run_jobs(args, launch_once, PROG, line)
    if jobs is None:
        return 1
    summary = summarise(args, jobs)
    print()
    print(report(args, summary))
    if args.json:
        result = {"nprocs": args.nprocs, "steps": args.steps, "warmup": args.warmup, "chunk": args.chunk,
                  "launches": args.launches, "eval_every": args.eval_every, "machine": bench_train.machine(),
                  "variants": summary}
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return bench_overhead.gate(args, summary, PROG, "the plain loop")


# ---------------------------------------------------------------- the worker (one per rank)
def example():
    """docs/examples/causal_lm.py as a module."""
    spec = importlib.util.spec_from_file_location("causal_lm", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PlainLoop:
    """The plain DataParallel loop on the example (module docstring), built before fit() and
    wrapped in DataParallel at its first step, once fit() has the process group up."""

    def __init__(self, lm, rank: int, world: int, steps: int):
        self.lm, self.rank, self.world = lm, rank, world
        self.net = lm.build()[0]
        self.optimizer = lm.optimizer(self.net, steps)
        self.model = None
        self.lane = self._lane(lm.corpus()[0][rank::world])
        self.tokens: list = []            # each step's count over all ranks (tensors, read at the end)

    def _lane(self, files):
        for _ in itertools.count():                     # pass after pass over the lane's files
            for path in files:
                yield from (self.lm.sample(piece) for piece in self.lm.sequences(path))

    def train_step(self):
        import paddle
        import paddle.distributed as dist

        if self.model is None:
            self.model = paddle.DataParallel(self.net) if self.world > 1 else self.net
        batch = self.lm.pad([next(self.lane) for _ in range(self.lm.BATCH)])
        ids, mask, labels = (paddle.to_tensor(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
        found = self.lm.next_byte_loss(self.model(ids, attention_mask=mask), labels)
        total = found["count"].clone()
        if self.world > 1:
            dist.all_reduce(total)
        # DataParallel averages over the ranks: W x (NLL sum / the step's count) each.
        nll = found["loss"] * found["count"].astype("float32")
        (nll * (self.world / total.astype("float32"))).backward()
        self.optimizer.step()
        self.optimizer.clear_grad()
        self.optimizer._learning_rate.step()
        self.tokens.append(total)
        return found["loss"], batch

    def evaluate(self, net, loader) -> tuple:
        """(NLL sum, count) over all ranks of the held-out set of `loader` (fit()'s eval
        loader), in the batches fit() evaluates on this rank (eval_batches)."""
        import paddle
        import paddle.distributed as dist

        was_training = net.training
        net.eval()
        nll = count = 0.0
        with paddle.no_grad():
            for samples in eval_batches(loader, self.rank, self.world):
                batch = self.lm.pad(samples)
                ids, mask, labels = (paddle.to_tensor(batch[k]) for k in ("input_ids", "attention_mask", "labels"))
                found = self.lm.next_byte_loss(net(ids, attention_mask=mask), labels)
                n = int(found["count"])
                nll, count = nll + float(found["loss"]) * n, count + n
        sums = paddle.to_tensor([nll, count], "float64")
        if self.world > 1:
            dist.all_reduce(sums)
        if was_training:
            net.train()
        return tuple(sums.numpy().tolist())


def eval_batches(loader, rank: int, world: int):
    """The samples of each batch fit() evaluates on `rank`, read as it reads them
    (docs/own_model.md): a map-style set cut into batches of the loader's size, batches
    rank, rank + W, ...; a stream with shards (at least W of them) cut shard by shard,
    shards rank, rank + W, ... The losses' agreement checks that they are fit()'s."""
    dataset, size = loader.dataset, loader.batch_sampler.batch_size
    if not callable(getattr(dataset, "shards", None)):
        for start in range(size * rank, len(dataset), size * world):
            yield [dataset[i] for i in range(start, min(start + size, len(dataset)))]
        return
    shards = dataset.shards()
    if len(shards) < world:
        raise RuntimeError(f"the eval stream has {len(shards)} shards for {world} ranks; give it at least {world}")
    for shard in shards[rank::world]:
        samples = dataset.read_shard(shard)
        while True:
            batch = list(itertools.islice(samples, size))
            if not batch:
                break
            yield batch


def _tokens(batch) -> int:
    """Next-byte targets of a padded batch (labels that are not -100 after the first)."""
    import numpy as np

    return int(np.sum(np.asarray(batch)[:, 1:] != -100))


class Alternating:
    """fit()'s training loader, with one timed plain step before each of its batches; over
    the warm-up steps, each plain batch's tokens must be fit()'s."""

    def __init__(self, loader, plain: PlainLoop, marks: List[tuple], warmup: int, log_every: int):
        self.loader, self.plain, self.marks, self.warmup, self.log_every = loader, plain, marks, warmup, log_every

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            started = time.perf_counter()
            loss, plain_batch = self.plain.train_step()
            if i % self.log_every == 0:       # a plain loop reads its loss when it logs, as fit() does
                float(loss)
            self.marks.append((started, time.perf_counter()))
            if i < self.warmup and _tokens(plain_batch["labels"]) != _tokens(batch[1][-1].numpy()):
                raise RuntimeError(f"step {i + 1}: the plain loop's batch is not fit()'s (another "
                                   "stream rule?); the benchmark compares the same micro-batches")
            yield batch


def worker_main(args) -> int:
    import paddle_dist
    from paddle_dist.trainer import session as sessionlib
    from paddle_dist.trainer import streamplan

    name = args.names[0]
    overrides, counted = VARIANTS[name]
    total = args.warmup + args.steps
    lm = example()
    rank, world = bench_train._ranks()
    log_every = 10                                      # the example's train.log_every
    plain = PlainLoop(lm, rank, world, total + 1)
    net, train_loader, eval_loader, loss, _ = lm.build()
    optimizer = lm.optimizer(net, total + 1)
    if not counted:
        loss = lambda logits, labels: lm.next_byte_loss(logits, labels)["loss"]  # noqa: E731
    marks: List[tuple] = []
    pauses: List[tuple] = []
    evals: List[tuple] = []
    diffs: List[float] = []

    original_loader = streamplan.train_loader

    def alternating(*a, **k):
        loader, sampler = original_loader(*a, **k)
        return Alternating(loader, plain, marks, args.warmup, log_every), sampler

    original_eval = sessionlib.Session._evaluate_at_step

    def evaluated(session):
        started = time.perf_counter()
        plain_first = len(evals) % 2 == 1              # the same on every rank
        if plain_first:
            sums = plain.evaluate(net, eval_loader)
            middle = time.perf_counter()
        original_eval(session)
        fit_done = time.perf_counter()
        if not plain_first:
            sums = plain.evaluate(net, eval_loader)
        ended = time.perf_counter()
        fit_s = fit_done - (middle if plain_first else started)
        plain_s = (middle - started) if plain_first else (ended - fit_done)
        evals.append((fit_s, plain_s))
        pauses.append((started, ended))
        if counted:          # fit_mean's eval loss weighs each batch by its sequences
            fit_loss = session.result.history[-1]["eval_loss"]
            diffs.append(abs(fit_loss - sums[0] / sums[1]) / abs(fit_loss))

    streamplan.train_loader, sessionlib.Session._evaluate_at_step = alternating, evaluated
    config = paddle_dist.load_config(overrides=[f"train.max_steps={total + 1}", f"train.log_every={log_every}",
                                                f"train.eval_every_steps={args.eval_every}",
                                                f"output.run_dir={Path(args.out).with_suffix('')}", *overrides])
    paddle_dist.fit(net, train_loader, eval_loader, loss, optimizer, config=config)
    # marks[i] = (start, end) of plain step i; fit()'s step i runs from end_i to start_i+1,
    # less the evaluations in between.
    raw = [end - start for start, end in marks[args.warmup:total]]
    ours = [marks[i + 1][0] - marks[i][1] - sum(e - s for s, e in pauses if marks[i][1] <= s < marks[i + 1][0])
            for i in range(args.warmup, total)]
    tokens = [int(t) for t in plain.tokens[args.warmup:total]]
    timed_evals = [pair for pair, (s, _) in zip(evals, pauses) if s > marks[args.warmup][0]]
    out = Path(args.out) if rank == 0 else Path(args.out).with_suffix(f".rank{rank}.json")
    out.write_text(json.dumps({"raw": raw, "ours": ours, "tokens": tokens, "evals": timed_evals,
                               "eval_loss_rel_diff": max(diffs, default=0.0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
