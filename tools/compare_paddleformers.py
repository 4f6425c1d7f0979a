"""PaddleFormers' Trainer against paddle_dist's fit() on the same job: docs/examples/causal_lm.py
with `--llama` (PaddleFormers' LlamaForCausalLM from its config, random weights), the same
micro-batches at every step, the same AdamW, schedule and clipping, the same steps.

Usage (with an interpreter that has paddleformers, which paddle_dist never depends on):
    /tmp/pf-venv/bin/pip install paddlepaddle==3.3.1 paddleformers "pyarrow<22"
    /tmp/pf-venv/bin/python tools/compare_paddleformers.py                 # 3 pairs, 2 ranks x 2
    /tmp/pf-venv/bin/python tools/compare_paddleformers.py --pairs 5 --json pf.json

Each pair runs both jobs one after the other (the order alternating), 2 ranks, one OpenMP
thread per rank:
- paddle_dist: `python -m paddle_dist.launch --nprocs 2 -o train.accumulate_steps=2
  -o train.log_every=1 docs/examples/causal_lm.py --llama`, unchanged: fit() with the
  model's own loss and train.loss_count=labels (each step trains on the token mean of its
  4 micro-batches); its losses from the progress lines, its tokens/s from metrics.json.
- PaddleFormers: `paddleformers.trainer.Trainer` under `python -m paddle.distributed.launch`,
  given the example's model, its optimizer and schedule (`optimizers=(opt, scheduler)`),
  and a stream in the order of fit()'s plan: per step, lane 0's 8 sequences, lane 1's, ...
  lane 3's (lane l reads files l, l + 4, ...), which the Trainer's IterableDatasetShard
  deals out as fit() does (each step's 4 micro-batches are the same 4 lanes' batches). Its
  loss is its own rule: each micro-batch's mean, averaged over micro-batches and ranks.
  Three settings it needs on CPU: amp_master_grad=False (its default True is refused
  without fp16/bf16), sharding="" (its default stage1 asserts amp_master_grad), and, with
  gradient accumulation, a no-op `paddle.device.synchronize` (Paddle's raises on CPU).

Tokens/s is the same on both sides: the non-padding labels of the 40 steps' micro-batches
over all ranks, over the time from the start of the first step (the epoch's start) to the
end of the last. Then one process replays the 40 steps twice: on the token mean (what
fit() promises) and on the mean of the micro-batches' means (PaddleFormers' rule); each
side's final weights are compared with both, and evaluated alike on the example's eval set.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

TOOLS = Path(__file__).resolve().parent
ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))

import bench_train  # noqa: E402  (the parser, the threads)
import bench_tokens  # noqa: E402  (the example, loaded as a module)

PROG = "compare_paddleformers"
EXAMPLE = ROOT / "docs" / "examples" / "causal_lm.py"
SIDES = ("paddle_dist", "paddleformers")
PROGRESS = re.compile(r"loss ([\d.]+) .* step (\d+)/\d+$")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    positive = bench_train._positive
    p = bench_train._Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=positive, default=3, help="pairs of jobs, the order alternating (3)")
    p.add_argument("--nprocs", type=positive, default=2, help="ranks (2)")
    p.add_argument("--accumulate", type=positive, default=2, help="micro-batches per rank per step (2)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--timeout", type=positive, default=600, help="seconds per job (600)")
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side is None and importlib.util.find_spec("paddleformers") is None:
        bench_train._fail("paddleformers is not installed for this Python; run the tool with an interpreter "
                          "that has it (pip install paddleformers \"pyarrow<22\" in a venv of its own)", PROG)
    return args


def example():
    """docs/examples/causal_lm.py as a module."""
    return bench_tokens.example()


def lanes_of(lm, lanes: int):
    """Each lane's sequences (shifted, as PaddleFormers' models take them), pass after pass
    over its files: the stream rule of docs/own_model.md."""
    files = lm.corpus()[0]

    def lane(l):
        for _ in itertools.count():
            for path in files[l::lanes]:
                yield from (lm.sample(piece, shifted=True) for piece in lm.sequences(path))

    return [lane(l) for l in range(lanes)]


def step_batches(lm, lanes: int, steps: int):
    """Each step's micro-batches (padded), lane by lane."""
    readers = lanes_of(lm, lanes)
    for _ in range(steps):
        yield [lm.pad([next(r) for _ in range(lm.BATCH)]) for r in readers]


def tokens_of(batch) -> int:
    return int((batch["labels"] != -100).sum())


# ---------------------------------------------------------------- the driver
def run_job(args, side: str, workdir: Path, index: int) -> dict:
    out = workdir / f"{side}-{index}"
    env = dict(os.environ, **bench_train.THREADS, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    if side == "paddle_dist":
        cmd = [sys.executable, "-m", "paddle_dist.launch", "--nprocs", str(args.nprocs), "--log_dir",
               str(out / "log"), "-o", f"train.accumulate_steps={args.accumulate}", "-o", "train.log_every=1",
               "-o", f"output.run_dir={out / 'run'}", str(EXAMPLE), "--llama"]
    else:
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(args.nprocs),
               "--log_dir", str(out / "log"), str(Path(__file__).resolve()), "--side", side,
               "--accumulate", str(args.accumulate), "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=args.timeout)
    if proc.returncode != 0:
        logs = sorted((out / "log").glob("workerlog.0")) or []
        tail = "\n".join((logs[0].read_text(errors="replace") if logs else proc.stdout).splitlines()[-15:])
        raise RuntimeError(f"{side}, job {index + 1} failed (exit {proc.returncode}):\n{tail}")
    return _read_paddle_dist(out, proc.stdout) if side == "paddle_dist" else json.loads((out / "result.json").read_text())


def _read_paddle_dist(out: Path, stdout: str) -> dict:
    from paddle_dist import checkpoint

    losses = {int(m.group(2)): float(m.group(1)) for m in map(PROGRESS.search, stdout.splitlines()) if m}
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    weights = out / "weights.npz"
    import numpy as np

    np.savez(weights, **checkpoint.load(out / "run").model)
    return {"losses": [losses[s] for s in sorted(losses)], "tokens_per_s": metrics["tokens_per_s"],
            "eval_loss": metrics.get("test_loss"), "weights": str(weights)}


def replay(lm, lanes: int, steps: int, token_mean: bool) -> dict:
    """One process on each step's micro-batches: the token mean's gradient (Σ NLL / Σ tokens),
    or the mean of the micro-batches' means."""
    import paddle

    net, _, _, _, opt = lm.build_llama()
    for batches in step_batches(lm, lanes, steps):
        count = sum(tokens_of(b) for b in batches)
        for b in batches:
            ids, mask, labels = (paddle.to_tensor(b[k]) for k in ("input_ids", "attention_mask", "labels"))
            loss = net(ids, attention_mask=mask, labels=labels)[0]
            (loss * (tokens_of(b) / count) if token_mean else loss / lanes).backward()
        opt.step()
        opt.clear_grad()
        opt._learning_rate.step()
    return {k: v.numpy() for k, v in net.state_dict().items()}


def eval_loss(lm, weights: dict) -> float:
    """The token mean of the next-token loss over the example's eval set (one process)."""
    import paddle

    net, _, loader, _, _ = lm.build_llama()
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
    net.eval()
    data = loader.dataset
    samples = [s for s in data] if isinstance(data, paddle.io.IterableDataset) else [data[i] for i in range(len(data))]
    size = getattr(lm, "EVAL_BATCH", 32)
    nll = count = 0.0
    with paddle.no_grad():
        for start in range(0, len(samples), size):
            b = lm.pad(samples[start:start + size])
            ids, mask, labels = (paddle.to_tensor(b[k]) for k in ("input_ids", "attention_mask", "labels"))
            n = tokens_of(b)
            nll, count = nll + float(net(ids, attention_mask=mask, labels=labels)[0]) * n, count + n
    return nll / count


def _distance(a: dict, b: dict) -> float:
    import numpy as np

    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.side == "paddleformers":
        return paddleformers_worker(args)
    lanes = args.nprocs * args.accumulate
    print(f"{PROG}: causal_lm.py --llama, {args.nprocs} ranks x {args.accumulate} micro-batches, "
          f"{args.pairs} pair(s) of jobs", flush=True)
    jobs = {side: [] for side in SIDES}
    try:
        with tempfile.TemporaryDirectory(prefix=f"{PROG}-") as tmp:
            for index in range(args.pairs):
                for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                    jobs[side].append(run_job(args, side, Path(tmp), index))
                    print(f"pair {index + 1}/{args.pairs}  {side:<13} {jobs[side][-1]['tokens_per_s']:,.0f} tokens/s",
                          flush=True)
            summary = summarise(args, jobs, lanes)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print()
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
        print(f"\nwrote {args.json}")
    return 0


def summarise(args, jobs: dict, lanes: int) -> dict:
    import numpy as np

    lm = example()
    steps = lm.STEPS
    wanted = {"token_mean": replay(lm, lanes, steps, True), "mean_of_means": replay(lm, lanes, steps, False)}
    out = {"nprocs": args.nprocs, "accumulate": args.accumulate, "steps": steps, "pairs": args.pairs,
           "machine": bench_train.machine(), "replay_eval_loss": {k: eval_loss(lm, w) for k, w in wanted.items()}}
    finals = {}
    for side, found in jobs.items():
        finals[side] = dict(np.load(found[0]["weights"]))
        out[side] = {"tokens_per_s": [job["tokens_per_s"] for job in found],
                     "losses": found[0]["losses"],
                     "same_losses_every_job": all(job["losses"] == found[0]["losses"] for job in found),
                     "to_token_mean_replay": _distance(finals[side], wanted["token_mean"]),
                     "to_mean_of_means_replay": _distance(finals[side], wanted["mean_of_means"]),
                     "eval_loss": eval_loss(lm, finals[side])}
    ratios = [pd / pf for pd, pf in zip(out["paddle_dist"]["tokens_per_s"], out["paddleformers"]["tokens_per_s"])]
    out["ratio_per_pair"] = ratios
    out["ratio_median"] = statistics.median(ratios)
    out["weights_apart"] = _distance(finals["paddle_dist"], finals["paddleformers"])
    return out


def report(s: dict) -> str:
    pd, pf = s["paddle_dist"], s["paddleformers"]
    lines = ["| | paddle_dist fit() | PaddleFormers Trainer |", "|---|---:|---:|"]
    lines.append("| tokens/s (median of pairs) | {:,.0f} | {:,.0f} |".format(
        statistics.median(pd["tokens_per_s"]), statistics.median(pf["tokens_per_s"])))
    for step in (1, 2, 5, 10, 20, 30, 40):
        if step <= min(len(pd["losses"]), len(pf["losses"])):
            lines.append(f"| train loss, step {step} | {pd['losses'][step - 1]:.4f} | {pf['losses'][step - 1]:.4f} |")
    lines.append(f"| eval loss (token mean, final weights) | {pd['eval_loss']:.5f} | {pf['eval_loss']:.5f} |")
    lines.append(f"| final weights to the token-mean replay | {pd['to_token_mean_replay']:.2g} | "
                 f"{pf['to_token_mean_replay']:.2g} |")
    lines.append(f"| final weights to the mean-of-means replay | {pd['to_mean_of_means_replay']:.2g} | "
                 f"{pf['to_mean_of_means_replay']:.2g} |")
    spread = f"{min(s['ratio_per_pair']):.2f}-{max(s['ratio_per_pair']):.2f}"
    lines += ["", f"paddle_dist / PaddleFormers tokens/s: {s['ratio_median']:.2f} (median of {len(s['ratio_per_pair'])} "
                  f"pairs, {spread}); final weights {s['weights_apart']:.2g} apart; replays' eval loss: token mean "
                  f"{s['replay_eval_loss']['token_mean']:.5f}, mean of means {s['replay_eval_loss']['mean_of_means']:.5f}"]
    return "\n".join(lines)


# ---------------------------------------------------------------- PaddleFormers' side (one per rank)
def paddleformers_worker(args) -> int:
    import numpy as np
    import paddle
    import paddle.distributed as dist

    if not paddle.is_compiled_with_cuda():
        # Its loop calls paddle.device.synchronize() with gradient accumulation; on a CPU
        # build Paddle raises "device should be gpu, xpu, ...": nothing to wait for.
        paddle.device.synchronize = lambda *a, **k: None
    from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments

    lm = example()
    world = dist.get_world_size()
    lanes = world * args.accumulate
    net, _, _, _, opt = lm.build_llama()

    class PlanOrder(paddle.io.IterableDataset):
        """Per step, lane 0's BATCH sequences, lane 1's, ...: IterableDatasetShard gives rank
        r the r-th BATCH of every world x BATCH, so each step's micro-batches are fit()'s."""

        def __iter__(self):
            readers = lanes_of(lm, lanes)
            while True:
                for reader in readers:
                    yield from (next(reader) for _ in range(lm.BATCH))

    def collate(samples):
        return {k: paddle.to_tensor(v) for k, v in lm.pad(samples).items()}

    class Clock(TrainerCallback):
        def __init__(self):
            self.start, self.ends, self.losses = None, [], []

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.start = self.start or time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs and "train_runtime" not in logs:
                self.losses.append(logs["loss"])

    out = Path(args.out)
    settings = TrainingArguments(
        output_dir=str(out / "trainer"), per_device_train_batch_size=lm.BATCH,
        gradient_accumulation_steps=args.accumulate, max_steps=lm.STEPS, logging_steps=1, save_strategy="no",
        report_to="none", seed=2024, disable_tqdm=True, dataloader_num_workers=0,
        amp_master_grad=False,     # its default (True) is refused without fp16/bf16
        sharding="")               # its default (stage1) asserts amp_master_grad
    clock = Clock()
    trainer = Trainer(model=net, args=settings, train_dataset=PlanOrder(), data_collator=collate,
                      optimizers=(opt, opt._learning_rate), callbacks=[clock])
    trainer.train()
    if dist.get_rank() == 0:
        tokens = sum(tokens_of(b) for batches in step_batches(lm, lanes, lm.STEPS) for b in batches)
        np.savez(out / "weights.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
        (out / "result.json").write_text(json.dumps({
            "losses": clock.losses, "tokens_per_s": tokens / (clock.ends[-1] - clock.start),
            "step_ends": [t - clock.start for t in clock.ends], "tokens": tokens,
            "eval_loss": None, "weights": str(out / "weights.npz")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
