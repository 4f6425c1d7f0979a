"""A user's script whose ranks build different models: rank 1's hidden layer is one wider
(a rank-dependent layer). paddle_dist must stop both before anything starts."""

import numpy as np
import paddle
import paddle_dist

cfg = paddle_dist.load_config(overrides=["train.epochs=1", "checkpoint.every_epochs=0"])
env = paddle_dist.setup(cfg)
width = 8 if env.global_rank == 0 else 9
net = paddle.nn.Sequential(paddle.nn.Linear(4, width), paddle.nn.ReLU(), paddle.nn.Linear(width, 2))


class Data(paddle.io.Dataset):
    def __getitem__(self, i):
        return np.ones(4, "float32") * i, np.int64(i % 2)

    def __len__(self):
        return 32


paddle_dist.fit(net, Data(), config=cfg)
