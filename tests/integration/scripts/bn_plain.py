"""A plain Paddle script, no paddle_dist import: a BatchNorm CNN in paddle.DataParallel,
a DistributedBatchSampler train loader, then every rank evaluates its shard of the eval
set and the sums are all-reduced, as a segmentation or classification repo's own loop does.

    python -m paddle_dist.launch --nprocs 2 [--sync-buffers] bn_plain.py --out DIR
        rank 0 prints `METRIC {...}` and saves DIR/model.pdparams; every rank writes
        DIR/buffers<rank>.npz (its BatchNorm statistics at the end)
    python bn_plain.py --score DIR/model.pdparams --out DIR
        one plain process: the saved weights' metric on the whole eval set (DIR/score.json)
"""

import argparse
import json
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

CLASSES = 4


def net():
    return paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(),
        paddle.nn.Conv2D(8, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(),
        paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten(), paddle.nn.Linear(8, CLASSES))


class Images(paddle.io.Dataset):
    """Noisy 8x8 images whose class shifts their colour; every sample has its own scale,
    so that two shards' batch statistics differ."""

    def __init__(self, n, seed):
        rng = np.random.RandomState(seed)
        self.y = rng.randint(0, CLASSES, n).astype("int64")
        scale = rng.uniform(0.5, 2.0, (n, 1, 1, 1))
        shift = np.eye(CLASSES, 3)[self.y][:, :, None, None] * 1.5
        self.x = (rng.randn(n, 3, 8, 8) * scale + shift + 0.3).astype("float32")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.y)


def evaluate(model, data, batch_size=25):
    """[correct predictions, summed cross-entropy] over `data`, in float64."""
    model.eval()
    total = np.zeros(2)
    with paddle.no_grad():
        for x, y in paddle.io.DataLoader(data, batch_size=batch_size):
            logits = model(x)
            loss = paddle.nn.functional.cross_entropy(logits, y, reduction="none")
            total += [float((logits.argmax(axis=1) == y.reshape([-1])).astype("float64").sum()),
                      float(loss.astype("float64").sum())]
    return total


def train(out: Path):
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    paddle.seed(3)
    model = paddle.DataParallel(net())
    data = Images(384, seed=1)
    sampler = paddle.io.DistributedBatchSampler(data, batch_size=16, shuffle=True)
    loader = paddle.io.DataLoader(data, batch_sampler=sampler)
    opt = paddle.optimizer.Momentum(0.05, parameters=model.parameters())
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            loss = paddle.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
    eval_set = Images(200, seed=2)
    shard = paddle.io.Subset(eval_set, list(range(rank, len(eval_set), world)))
    total = paddle.to_tensor(evaluate(model, shard))
    dist.all_reduce(total)
    # Paddle keeps BatchNorm's running statistics as non-trainable parameters, not buffers.
    stats = {k: v.numpy() for k, v in model.state_dict().items() if k.endswith(("_mean", "_variance"))}
    np.savez(out / f"buffers{rank}.npz", **stats)
    if rank == 0:
        paddle.save(model.state_dict(), str(out / "model.pdparams"))
        metric = {"correct": float(total[0]), "loss": float(total[1])}
        print("METRIC " + json.dumps(metric), flush=True)
        (out / "metric.json").write_text(json.dumps(metric))


def score(weights: str, out: Path):
    model = net()
    model.set_state_dict(paddle.load(weights))
    correct, loss = evaluate(model, Images(200, seed=2))
    (out / "score.json").write_text(json.dumps({"correct": correct, "loss": loss}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--score", help="a saved state_dict: its metric in this one process")
    opts = parser.parse_args()
    if opts.score:
        score(opts.score, Path(opts.out))
    else:
        train(Path(opts.out))


if __name__ == "__main__":
    main()
