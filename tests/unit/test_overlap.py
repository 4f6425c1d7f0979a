"""paddle_dist.overlap on one process: bucket plans, launches from inside backward(), arming
with accumulation, failures on the communication thread, and the GPU path's late flag
(its collective stood in for, so the NCCL logic runs on CPU)."""

import threading

import numpy as np
import paddle
import pytest

from paddle_dist import overlap, reducers
from paddle_dist.comm import PeerFailure


def _net():
    paddle.seed(3)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 4))


def _backward(net, scale=1.0):
    x = paddle.to_tensor(np.linspace(-1, 1, 24, dtype="float32").reshape(3, 8))
    (net(x).sum() * scale).backward()


class Recorder:
    """An exchange that records what was submitted, and when (inside backward or not)."""

    def __init__(self):
        self.submitted, self.in_backward = [], []
        self.backward_running = False
        self.calls = 0

    def reserve(self, sizes):
        self.sizes = sizes

    def submit(self, params, stop):
        self.submitted.append(([p.name for p in params], stop))
        self.in_backward.append(self.backward_running)

    def wait(self):
        return 0.0

    def close(self):
        pass


def _names(buckets):
    return [[p.name for p in b] for b in buckets]


def test_buckets_follow_backward_order_with_a_quarter_of_the_model_at_most(monkeypatch):
    w1, b1, w2, b2 = _net().parameters()          # 128 + 16 + 64 + 4 floats: 848 bytes
    # A quarter of the model is 212 bytes: every tensor but b2 fills a bucket alone.
    assert _names(overlap.plan_buckets([w1, b1, w2, b2], 25 << 20)) == \
        [[b2.name], [w2.name], [b1.name], [w1.name]]
    monkeypatch.setattr(overlap, "MIN_BUCKETS", 1)
    assert _names(overlap.plan_buckets([w1, b1, w2, b2], 25 << 20)) == \
        [[b2.name, w2.name, b1.name, w1.name]]
    assert _names(overlap.plan_buckets([w1, b1, w2, b2], 400)) == \
        [[b2.name, w2.name, b1.name], [w1.name]]     # the cap in bytes: 16 + 256 + 64 | 512
    frozen = _net()
    frozen[0].weight.stop_gradient = True
    assert all(p.name != frozen[0].weight.name for b in overlap.plan_buckets(frozen.parameters(), 1 << 20)
               for p in b)


def test_buckets_leave_during_backward_in_order_with_the_stop_flag_first():
    net, rec = _net(), Recorder()
    ov = overlap.Overlap(net.parameters(), rec, cap_bytes=1 << 20, stop=lambda: 1.0)
    hook_seen = []
    # A hook on the first layer's weight runs last in backward(): by then the other
    # buckets must have gone.
    net[0].weight._register_backward_hook(lambda: hook_seen.append(len(rec.submitted)))
    _backward(net)
    assert hook_seen[0] >= 3 and len(rec.submitted) == 4
    assert [stop for _, stop in rec.submitted] == [1.0, None, None, None]
    assert rec.sizes == [4 + 1, 64, 16, 128]      # the first bucket carries the flag
    ov.finish()
    assert len(rec.submitted) == 4                # nothing left to send at the step
    _backward(net)
    assert len(rec.submitted) == 8                # re-armed for the next step


def test_with_accumulation_only_the_armed_backward_sends():
    net, rec = _net(), Recorder()
    ov = overlap.Overlap(net.parameters(), rec, cap_bytes=1 << 20, accumulate_steps=2)
    ov.arm(False)
    _backward(net)
    assert rec.submitted == []                     # gradients still accumulate
    ov.arm(True)
    _backward(net)
    assert len(rec.submitted) == 4
    ov.finish()
    _backward(net)                                 # nobody armed it: it all goes at the step
    assert len(rec.submitted) == 4
    ov.finish()
    assert len(rec.submitted) == 8


class Halver:
    """A reducer whose 'other rank' holds the same arrays: the mean is the array itself;
    records the thread it ran on."""

    def __init__(self, fail_on=None):
        self.threads, self.fail_on, self.count = [], fail_on, 0

    def all_reduce(self, arrays, scale=1.0):
        self.count += 1
        self.threads.append(threading.current_thread().name)
        if self.count == self.fail_on:
            raise RuntimeError("Connection reset by peer\nmore detail")
        for a in arrays:
            a *= np.float32(scale * 2)
        return 1


def test_the_thread_averages_in_place_and_returns_the_flag():
    net = _net()
    reducer = Halver()
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(reducer, 0.5), 1 << 20,
                         stop=lambda: 1.0)
    _backward(net)
    before = {p.name: p.grad.numpy().copy() for p in net.parameters()}
    assert ov.finish() == 1.0                      # 0.5 x (1 + 1)
    for p in net.parameters():
        np.testing.assert_array_equal(p.grad.numpy(), before[p.name])
    assert reducer.threads == ["paddle_dist-grad-sync"] * 4
    ov.close()


def test_a_failed_exchange_is_a_peer_failure_at_the_step_and_stops_the_rest():
    net, reducer = _net(), Halver(fail_on=1)
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(reducer, 0.5), 1 << 20)
    _backward(net)                                 # never raises inside backward()
    with pytest.raises(PeerFailure, match="gradient all-reduce failed: Connection reset by peer$"):
        ov.finish()
    assert reducer.count == 1                      # the later buckets were not sent
    ov.close()


class FakeTask:
    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


def test_gpu_path_sends_async_and_reads_the_stop_flag_one_step_late():
    net, log = _net(), []

    def all_reduce(tensor, sync_op=True):
        assert sync_op is False
        log.append("issued")
        tensor.set_value(tensor * 2)               # 2 identical ranks
        return FakeTask(log)

    exchange = overlap.AsyncExchange(world=2, collective_fn=all_reduce)
    flags = iter([1.0, 0.0, 0.0])
    ov = overlap.Overlap(net.parameters(), exchange, 1 << 20, stop=lambda: next(flags))
    seen = []
    for _ in range(3):
        _backward(net)
        before = {p.name: p.grad.numpy().copy() for p in net.parameters()}
        assert log[-4:] == ["issued"] * 4           # issued from backward's hooks
        seen.append(ov.finish())
        for p in net.parameters():
            np.testing.assert_allclose(p.grad.numpy(), before[p.name], rtol=1e-6)
        for p in net.parameters():
            p.clear_gradient()
    assert seen == [0.0, 2.0, 0.0]                 # step 1's request, seen at step 2


def test_bf16_bits_round_like_paddle():
    values = np.random.RandomState(0).standard_normal(10000).astype(np.float32) * 1e3
    values[:4] = [1.0, 1.00390625, 1.01171875, 0.0]      # exact, two ties, zero
    ours = reducers.to_bf16_bits(values)
    theirs = np.from_dlpack(paddle.to_tensor(values).astype("bfloat16").view(paddle.uint16))
    np.testing.assert_array_equal(ours, theirs)
