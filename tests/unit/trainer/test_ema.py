"""The moving averages of the whole state (trainer/ema.py)."""

import numpy as np
import paddle

from paddle_dist.trainer.ema import Ema, warmed_decay


def test_moving_averages_follow_the_weights_and_are_applied_only_inside():
    paddle.seed(1)
    net = paddle.nn.Linear(2, 1)
    ema = Ema(net, 0.5, warmup=False)
    start = net.weight.numpy().copy()
    net.weight.set_value(paddle.to_tensor(start + 2.0))
    ema.update()
    np.testing.assert_allclose(ema.state()["weight"], start + 1.0, rtol=1e-6)
    with ema.applied():
        np.testing.assert_allclose(net.weight.numpy(), start + 1.0, rtol=1e-6)
    np.testing.assert_array_equal(net.weight.numpy(), start + 2.0)
    again = Ema(net, 0.5)
    again.load(ema.state(), ema.updates)
    np.testing.assert_array_equal(again.state()["weight"], ema.state()["weight"])
    assert again.updates == 1
    assert set(ema.weights()) == set(net.state_dict())


def test_moving_averages_warm_up_as_the_suites_and_cover_batchnorm_statistics():
    """min(decay, (1 + n) / (10 + n)): the first update keeps 10 % of the start; the
    BatchNorm statistics are averaged like the weights (PaddleDetection's ModelEMA)."""
    assert warmed_decay(0.999, 0) == 0.1
    assert warmed_decay(0.999, 10 ** 6) == 0.999
    assert warmed_decay(0.999, 0, warmup=False) == 0.999
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.BatchNorm1D(2))
    ema = Ema(net, 0.99)
    assert "1._mean" in ema.shadow and "1._variance" in ema.shadow
    net.train()
    net(paddle.rand([8, 2]) + 5)                  # moves BatchNorm's running mean
    mean = net[1]._mean.numpy().copy()
    ema.update()
    np.testing.assert_allclose(ema.state()["1._mean"], 0.9 * mean, rtol=1e-6)   # 0.1 kept of 0
