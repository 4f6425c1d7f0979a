"""A BatchNorm model trained by paddle_dist.fit() (which keeps the statistics equal itself,
once per optimizer step): under `python -m paddle_dist.launch` the DataParallel that fit()
makes is left alone, with or without --sync-buffers. Writes OUT/buffers<rank>.npz."""

import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_dist


class Data(paddle.io.Dataset):
    def __init__(self):
        rng = np.random.RandomState(0)
        self.x, self.y = rng.randn(64, 3, 8, 8).astype("float32"), (np.arange(64) % 2).astype("int64")

    def __getitem__(self, i):
        return self.x[i], self.y[i]

    def __len__(self):
        return len(self.y)


def main(out: Path):
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4), paddle.nn.Flatten(),
                               paddle.nn.Linear(144, 2))
    opt = paddle.optimizer.SGD(0.01, parameters=net.parameters())
    paddle_dist.fit(net, Data(), None, paddle.nn.CrossEntropyLoss(), opt, epochs=1, batch_size=8)
    stats = {k: v.numpy() for k, v in net.state_dict().items() if k.endswith(("_mean", "_variance"))}
    np.savez(out / f"buffers{dist.get_rank()}.npz", **stats)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
