"""The check before epoch 1 (trainer/firstbatch.py): it leaves the generators and BatchNorm's statistics as it found them."""

import numpy as np
import paddle


def test_the_check_before_epoch_1_leaves_every_random_generator_as_it_found_it():
    import random

    from paddle_dist.trainer.firstbatch import _kept

    net = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.BatchNorm1D(2))
    before = (random.random(), np.random.rand(), paddle.rand([1]).item())
    random.seed(1), np.random.seed(1), paddle.seed(1)
    expected = (random.random(), np.random.rand(), paddle.rand([1]).item())
    random.seed(1), np.random.seed(1), paddle.seed(1)
    stats = net[1]._mean.numpy().copy()
    with _kept(net):
        random.random(), np.random.rand(4), paddle.rand([3])
        net.train()
        net(paddle.rand([4, 2]) + 5)                    # moves BatchNorm's running mean
    assert (random.random(), np.random.rand(), paddle.rand([1]).item()) == expected != before
    np.testing.assert_array_equal(net[1]._mean.numpy(), stats)
