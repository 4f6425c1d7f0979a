"""The distributed step (trainer/engine.py): one call per step a reader can follow, what
the step produced returned, BatchNorm's sums carried to the update."""

import numpy as np
import paddle

from paddle_dist.runtime.env import DistEnv
from paddle_dist.sync.grad_sync import GradSync
from paddle_dist.trainer.engine import Engine, StepResult, step
from paddle_dist.trainer.feed import Feed


def _batch(seed):
    rng = np.random.default_rng(seed)
    return ([paddle.to_tensor(rng.standard_normal((4, 3)).astype("float32"))],
            [paddle.to_tensor(rng.standard_normal((4, 2)).astype("float32"))])


def test_a_step_averages_once_seeds_each_micro_batch_and_returns_the_mean_loss():
    paddle.seed(0)
    net = paddle.nn.Linear(3, 2)
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    calls, seeds = [], []
    group = [_batch(1), _batch(2)]
    losses = [float(paddle.nn.functional.mse_loss(net(x[0]), y[0])) for x, y in group]
    result = step(net, paddle.nn.MSELoss(), group, opt, feed=Feed(net, inputs=1),
                  seed=lambda i, n: seeds.append((i, n)), average=lambda: calls.append("average"))
    assert isinstance(result, StepResult) and result.parts == {}
    assert np.isclose(float(result.loss), sum(losses) / 2)
    assert calls == ["average"] and seeds == [(0, 2), (1, 2)]


def test_the_engine_carries_batchnorm_sums_from_the_average_to_the_update():
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.BatchNorm1D(2))
    opt = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    engine = Engine(net, opt, DistEnv(), GradSync(DistEnv()))
    try:
        before = net[1]._mean.numpy().copy()
        engine.step(engine.wrapped(), [_batch(3)], Feed(net, inputs=1), paddle.nn.MSELoss())
        assert engine.batch_stats.received is not None          # the average handed the sums over
        engine.after_update()
        assert engine.batch_stats.received is None and not np.array_equal(net[1]._mean.numpy(), before)
    finally:
        engine.close()
