"""BatchNorm's running statistics move once per optimizer step, from every sample of it
(sync/batchstats.py): the same (within float rounding) however the step's batch is
split into micro-batches, one process's on the whole batch, and nothing moves a frozen or evaluating layer."""

from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from paddle_dist.sync.batchstats import BatchStats, batch_norm_layers

ONE = SimpleNamespace(is_distributed=False)


def _net():
    paddle.seed(1)
    return paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4, momentum=0.8),
                                paddle.nn.ReLU(), paddle.nn.Flatten(), paddle.nn.Linear(4 * 6 * 6, 3))


def _batches(steps=4):
    rng = np.random.RandomState(0)
    return [rng.normal(2.0, 3.0, (8, 3, 8, 8)).astype("float32") for _ in range(steps)]


def _train(micro: int, host=None):
    net, batches = _net(), _batches()
    stats = BatchStats(net, ONE, host=host)
    for batch in batches:
        for part in np.split(batch, micro):
            net(paddle.to_tensor(part))
        stats.step()
    return net, batches


def test_one_update_per_step_whatever_the_micro_batches_and_equal_to_the_whole_batch():
    whole, batches = _train(1)
    for micro in (2, 4):
        split, _ = _train(micro)
        # float32 sums of another split: equal within float rounding
        np.testing.assert_allclose(split[1]._mean.numpy(), whole[1]._mean.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(split[1]._variance.numpy(), whole[1]._variance.numpy(), rtol=1e-6)
    # Computed apart, in numpy: momentum 0.8, the biased variance of each step's 8 images.
    net = _net()
    mean, variance = np.zeros(4), np.ones(4)
    for batch in batches:
        h = net[0](paddle.to_tensor(batch)).numpy().astype("float64")
        mean = 0.8 * mean + 0.2 * h.mean(axis=(0, 2, 3))
        variance = 0.8 * variance + 0.2 * h.var(axis=(0, 2, 3))
    np.testing.assert_allclose(whole[1]._mean.numpy(), mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(whole[1]._variance.numpy(), variance, rtol=1e-5)


def test_evaluating_frozen_and_unused_layers_keep_their_statistics():
    net = _net()
    frozen = paddle.nn.BatchNorm1D(3, use_global_stats=True)
    stats = BatchStats(paddle.nn.Sequential(net, frozen), ONE)
    start = net[1]._mean.numpy().copy()
    net.eval()
    net(paddle.to_tensor(_batches(1)[0]))
    stats.step()                              # nothing recorded: nothing moves
    assert np.array_equal(net[1]._mean.numpy(), start)
    assert batch_norm_layers(paddle.nn.Sequential(net, frozen)) == ["0.1"]
    stats.close()
    net.train()
    net(paddle.to_tensor(_batches(1)[0]))     # hooks removed: Paddle's own update again
    assert not np.array_equal(net[1]._mean.numpy(), start)


def test_the_device_path_a_gpu_takes_gives_the_host_paths_statistics():
    """Paddle's ops, on the tensor's device and never read on the host (GPUs), run here on
    the CPU: the same statistics as numpy's path, whatever the micro-batches."""
    host, _ = _train(2)
    for micro in (1, 2, 4):
        device, _ = _train(micro, host=False)
        np.testing.assert_allclose(device[1]._mean.numpy(), host[1]._mean.numpy(), rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(device[1]._variance.numpy(), host[1]._variance.numpy(), rtol=1e-6)


def test_a_sync_batch_norm_on_several_cpu_ranks_is_one_line_and_on_one_a_batch_norm():
    from paddle_dist.errors import UserError
    from paddle_dist.sync.batchstats import sync_batch_norm_on_cpu

    def model():
        return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.SyncBatchNorm(8))
    with pytest.raises(UserError, match=r"SyncBatchNorm layers \('1'\), and Paddle has no CPU kernel for them"):
        sync_batch_norm_on_cpu(model(), "cpu", 2)
    net = model()
    mean = net[1]._mean
    assert sync_batch_norm_on_cpu(net, "gpu:0", 1) == []          # a GPU has the kernel
    assert sync_batch_norm_on_cpu(net, "cpu", 1) == ["1"]
    assert isinstance(net[1], paddle.nn.BatchNorm) and net[1]._mean is mean    # the same tensors
