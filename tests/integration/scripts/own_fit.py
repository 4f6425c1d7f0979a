"""A user's own training script: its own model, data and optimizer through paddle_dist.fit(),
written as a user would, with no override of paddle_dist's config.

    python own_fit.py --out DIR [--root RUNS] [--width 8] [--api loop] [--epochs 2]
                      [--spawn N] [--scheduler] [--skip-allreduce RANK:STEP] [--override K=V]
                      [--lr 0.05]

--skip-allreduce: the model all-reduces a statistic of its activations in every training
forward (as a synchronised batch norm would), except on rank RANK at step STEP: the
classic collective mismatch of a rank-dependent branch.

Run as is, under `python -m paddle.distributed.launch`, under `python -m paddle_dist.launch`
or with `--spawn N` (Paddle's own spawn). Rank 0 writes the initial weights to
<out>/initial.npz; every rank writes its final weights to <out>/rank<N>.npz and what fit()
returned to <out>/rank<N>.json.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import paddle

import paddle_dist

SAMPLES = 256
EVAL_SAMPLES = 100


class SmallCNN(paddle.nn.Layer):
    def __init__(self, width=8):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, width, 3)
        self.head = paddle.nn.Linear(width * 6 * 6, 10)

    def forward(self, x):
        return self.head(paddle.flatten(paddle.nn.functional.relu(self.conv(x)), 1))


class StatsCNN(SmallCNN):
    """SmallCNN that all-reduces the mean of its activations in training, except when
    `skip` (rank, step) says this rank skips it."""

    def __init__(self, width, skip):
        super().__init__(width)
        self.skip, self.steps = skip, 0

    def forward(self, x):
        if self.training:
            self.steps += 1
            if (paddle.distributed.get_rank(), self.steps) != self.skip:
                paddle.distributed.all_reduce(paddle.mean(x).detach())
        return super().forward(x)


class RandomImages(paddle.io.Dataset):
    def __init__(self, count, seed):
        rng = np.random.RandomState(seed)
        self.x = rng.randn(count, 1, 8, 8).astype("float32")
        self.y = rng.randint(0, 10, size=(count, 1)).astype("int64")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def optimizer(opts):
    def build(parameters):
        lr = paddle.optimizer.lr.StepDecay(opts.lr, step_size=1) if opts.scheduler else opts.lr
        return paddle.optimizer.SGD(learning_rate=lr, parameters=parameters)
    return build


def train(opts):
    overrides = [f"train.api={opts.api}", f"train.epochs={opts.epochs}", "train.batch_size=8",
                 f"output.root={opts.root}", "train.log_every=1"]
    cfg = paddle_dist.load_config(overrides=overrides + opts.override)
    env = paddle_dist.setup(cfg)
    net = StatsCNN(opts.width, tuple(map(int, opts.skip_allreduce.split(":")))) if opts.skip_allreduce \
        else SmallCNN(opts.width)
    out = Path(opts.out)
    if env.is_main:
        np.savez(out / "initial.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
    result = paddle_dist.fit(net, RandomImages(SAMPLES, 0), RandomImages(EVAL_SAMPLES, 1),
                             optimizer=optimizer(opts), config=cfg)
    np.savez(out / f"rank{env.global_rank}.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
    (out / f"rank{env.global_rank}.json").write_text(json.dumps({
        "world_size": env.world_size, "steps": result.steps, "run_dir": str(result.run_dir),
        "metrics": result.metrics}))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--root", default="runs")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--api", default="loop")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--spawn", type=int, default=0)
    parser.add_argument("--scheduler", action="store_true")
    parser.add_argument("--skip-allreduce", default="")
    parser.add_argument("--override", action="append", default=[])
    opts = parser.parse_args()
    if opts.spawn:
        paddle.distributed.spawn(train, args=(opts,), nprocs=opts.spawn)
    else:
        train(opts)


if __name__ == "__main__":
    main()
