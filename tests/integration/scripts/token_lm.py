"""A small causal language model trained through paddle_dist.fit() with a token-mean loss,
as a language-model user writes it, and the one-process replay it must equal.

    python -m paddle_dist.launch --nprocs W token_lm.py --out DIR [--ref RUN_DIR] [--override K=V]

Variable-length sequences of byte-like tokens, padded per batch (labels -100 on the
padding), AdamW, global-norm clipping at 1.0; 40 steps of 16 sequences: W ranks x 4/W
micro-batches of 4. Two users, one per API level:
- loop: tuple samples (ids, labels) and a loss function returning {"loss", "count"};
- hapi: dict samples {input_ids, labels} and a model that returns its own mean over the
  labels that are not -100 (PaddleFormers' way), with train.loss_count=labels.
Each writes <out>/<api>-rank<N>.npz (its final weights; rank 0 also the initial ones) and
<out>/<api>-rank<N>.json (what fit() returned). With --ref, the loop's user then evaluates
RUN_DIR's last checkpoint (train.eval_only) and writes <out>/eval-rank<N>.json.

`replay(...)` is one process on the union of each step's micro-batches with the token mean
(Σ NLL over every non-pad token of the step / their count), or, with `mean_of_means`, the
mean of the micro-batches' means (what fit() trained before the loss's own weighting).
"""

import argparse
import json
from pathlib import Path

import numpy as np

VOCAB, HIDDEN, IGNORE = 48, 32, -100
SAMPLES, EVAL_SAMPLES = 640, 100
MICRO, GLOBAL = 4, 16             # sequences per micro-batch, per step
STEPS = SAMPLES // GLOBAL         # 40, one epoch
EVAL_BATCH = 8


def sequences(count: int, seed: int):
    rng = np.random.RandomState(seed)
    return [rng.randint(1, VOCAB, size=rng.randint(4, 34)).astype("int64") for _ in range(count)]


def make_data(paddle, count: int = SAMPLES, seed: int = 0, as_dict: bool = False):
    """A map-style Dataset of variable-length sequences: (ids, labels), labels the next token."""
    seqs = sequences(count, seed)

    class Sequences(paddle.io.Dataset):
        def __getitem__(self, i):
            ids, labels = seqs[i][:-1], seqs[i][1:]
            return {"input_ids": ids, "labels": labels} if as_dict else (ids, labels)

        def __len__(self):
            return len(seqs)

    return Sequences()


def pad(samples):
    """Collate: pad every sequence of the batch to its longest (ids 0, labels -100)."""
    as_dict = isinstance(samples[0], dict)
    pairs = [(s["input_ids"], s["labels"]) if as_dict else s for s in samples]
    longest = max(len(ids) for ids, _ in pairs)
    ids = np.zeros((len(pairs), longest), "int64")
    labels = np.full((len(pairs), longest), IGNORE, "int64")
    for i, (x, y) in enumerate(pairs):
        ids[i, :len(x)], labels[i, :len(y)] = x, y
    return {"input_ids": ids, "labels": labels} if as_dict else (ids, labels)


def token_mean(logits, labels):
    """The loss as users write it: Σ NLL over the labels that are not -100 / their count."""
    import paddle

    nll = paddle.nn.functional.cross_entropy(logits, labels.unsqueeze(-1), ignore_index=IGNORE, reduction="none")
    count = (labels != IGNORE).astype("float32").sum()
    return {"loss": nll.sum() / count, "count": count}


def make_model(paddle):
    nn = paddle.nn

    class TinyLM(nn.Layer):
        """Embedding, a GRU (causal), a head; with labels, its own token mean (PaddleFormers')."""

        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, HIDDEN)
            self.gru = nn.GRU(HIDDEN, HIDDEN)
            self.head = nn.Linear(HIDDEN, VOCAB)

        def forward(self, input_ids, labels=None):
            hidden, _ = self.gru(self.embed(input_ids))
            logits = self.head(hidden)
            return logits if labels is None else token_mean(logits, labels)["loss"]

    paddle.seed(7)
    return TinyLM()


def make_optimizer(paddle, net):
    return paddle.optimizer.AdamW(3e-4, parameters=net.parameters(), weight_decay=0.01,
                                  grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0),
                                  apply_decay_param_fun=lambda name: "bias" not in name)


def loader(paddle, data, batch):
    return paddle.io.DataLoader(data, batch_size=batch, shuffle=False, collate_fn=pad)


def _fit(out: Path, api: str, world: int, extra=()):
    import paddle

    import paddle_dist

    cfg = paddle_dist.load_config(overrides=[
        f"train.api={api}", "train.epochs=1", "train.shuffle=false", "train.log_samples=true",
        f"train.accumulate_steps={GLOBAL // MICRO // world}", "train.log_every=5",
        "train.seed=11", f"output.run_dir={out / api}", *(["train.loss_count=labels"] if api == "hapi" else []),
        *extra])
    env = paddle_dist.setup(cfg)
    net = make_model(paddle)
    initial = {f"initial/{k}": v.numpy() for k, v in net.state_dict().items()} if env.is_main else {}
    as_dict = api == "hapi"
    result = paddle_dist.fit(net, loader(paddle, make_data(paddle, as_dict=as_dict), MICRO),
                             loader(paddle, make_data(paddle, EVAL_SAMPLES, 1, as_dict), EVAL_BATCH),
                             loss="model" if as_dict else token_mean, optimizer=make_optimizer(paddle, net),
                             config=cfg, task="regression")
    rank = env.global_rank
    np.savez(out / f"{api}-rank{rank}.npz", **initial, **{k: v.numpy() for k, v in net.state_dict().items()})
    (out / f"{api}-rank{rank}.json").write_text(json.dumps(
        {"losses": result.losses, "metrics": result.metrics, "run_dir": str(result.run_dir)}))


def _evaluate(out: Path, ref: Path):
    """The loop's user evaluates the reference run's last checkpoint (the same weights at
    any number of ranks)."""
    import paddle

    import paddle_dist
    from paddle_dist.runs.layout import Run, latest

    cfg = paddle_dist.load_config(overrides=[
        "train.eval_only=true", f"checkpoint.resume={latest(Run(ref).checkpoints)}", f"output.run_dir={out / 'eval'}"])
    env = paddle_dist.setup(cfg)
    net = make_model(paddle)
    result = paddle_dist.fit(net, loader(paddle, make_data(paddle), MICRO),
                             loader(paddle, make_data(paddle, EVAL_SAMPLES, 1), EVAL_BATCH),
                             loss=token_mean, optimizer=make_optimizer(paddle, net), config=cfg, task="regression")
    (out / f"eval-rank{env.global_rank}.json").write_text(json.dumps(result.metrics))


# ----------------------------------------------------------------- the replay
def step_batches(data, world: int, step: int):
    """The micro-batches of optimizer step `step` on `world` ranks (the data plan without
    shuffling: rank r's batches of Paddle's DistributedBatchSampler, samples r, r+W, ...)."""
    k = GLOBAL // MICRO // world
    found = []
    for rank in range(world):
        shard = list(range(len(data)))[rank::world]
        for j in range(step * k, step * k + k):
            found.append(pad([data[i] for i in shard[j * MICRO:(j + 1) * MICRO]]))
    return found


def step_counts(world: int) -> list:
    """Each step's tokens (labels that are not -100) over every rank."""
    import paddle

    data = make_data(paddle)
    return [float(sum((labels != IGNORE).sum() for _, labels in step_batches(data, world, step)))
            for step in range(STEPS)]


def replay(initial, world: int, mean_of_means: bool = False):
    """One process, the same optimizer, from `initial`: each step on the union of the step's
    micro-batches (as `world` ranks hold them), with the token mean over the whole step.
    Returns (final weights, each step's loss)."""
    import paddle

    net = make_model(paddle)
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in initial.items()})
    opt = make_optimizer(paddle, net)
    data, losses = make_data(paddle), []
    for step in range(STEPS):
        batches = step_batches(data, world, step)
        total = float(sum((labels != IGNORE).sum() for _, labels in batches))
        summed = 0.0
        for ids, labels in batches:
            found = token_mean(net(paddle.to_tensor(ids)), paddle.to_tensor(labels))
            part = found["loss"] / len(batches) if mean_of_means else found["loss"] * found["count"] / total
            part.backward()
            summed += float(found["loss"]) * float(found["count"])
        losses.append(summed / total)
        opt.step()
        opt.clear_grad()
    return {k: v.numpy() for k, v in net.state_dict().items()}, losses


def evaluate_one_process(weights) -> float:
    """The token mean over the whole eval set in one process: the set's batches in order,
    each batch's mean weighed by its count, in float64."""
    import paddle

    net = make_model(paddle)
    net.set_state_dict({k: paddle.to_tensor(v) for k, v in weights.items()})
    net.eval()
    data, summed, count = make_data(paddle, EVAL_SAMPLES, 1), 0.0, 0.0
    with paddle.no_grad():
        for start in range(0, len(data), EVAL_BATCH):
            ids, labels = pad([data[i] for i in range(start, min(start + EVAL_BATCH, len(data)))])
            found = token_mean(net(paddle.to_tensor(ids)), paddle.to_tensor(labels))
            summed += float(found["loss"]) * float(found["count"])
            count += float(found["count"])
    return summed / count


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--apis", default="loop,hapi")
    parser.add_argument("--ref", default="")
    parser.add_argument("--override", action="append", default=[], help="K=V for both fits' config")
    args = parser.parse_args()
    import paddle_dist

    world = paddle_dist.detect().world_size
    for name in args.apis.split(","):
        _fit(Path(args.out), name, world, args.override)
    if args.ref:
        _evaluate(Path(args.out), Path(args.ref))
