"""A plain Paddle script with the "three changes" and no paddle_dist import.

`python -m paddle_dist.launch --nprocs 2 three_changes.py --out DIR` must run it
data-parallel; each rank writes its weights and the variables it was given.
"""

import argparse
import json
import os
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.linear1 = paddle.nn.Linear(10, 10)
        self.linear2 = paddle.nn.Linear(10, 1)

    def forward(self, x):
        return self.linear2(self.linear1(x))


class RandomData(paddle.io.Dataset):
    def __init__(self, n=256):
        rng = np.random.RandomState(0)
        self.x = rng.randn(n, 10).astype("float32")
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype("float32")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    opts = parser.parse_args()
    dist.init_parallel_env()                                   # change 1
    paddle.seed(1)
    net = paddle.DataParallel(Net())                           # change 2
    data = RandomData()
    sampler = paddle.io.DistributedBatchSampler(data, batch_size=16, shuffle=True)  # change 3
    loader = paddle.io.DataLoader(data, batch_sampler=sampler)
    opt = paddle.optimizer.SGD(0.05, parameters=net.parameters())
    seen = 0
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = paddle.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            seen += x.shape[0]
    rank = dist.get_rank()
    out = Path(opts.out)
    np.savez(out / f"rank{rank}.npz", **{k: v.numpy() for k, v in net.state_dict().items()})
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "OMP_", "PADDLE_TRAINERS"))}
    (out / f"rank{rank}.json").write_text(json.dumps({"world": dist.get_world_size(), "seen": seen,
                                                      "env": env, "loss": float(loss)}))


if __name__ == "__main__":
    main()
