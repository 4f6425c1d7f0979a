"""paddle_dist.sync.overlap on one process: bucket plans, launches from inside backward(), arming
with accumulation, failures on the communication thread, and the GPU path's late flag
(its collective stood in for, so the NCCL logic runs on CPU)."""

import threading

import numpy as np
import paddle
import pytest

from paddle_dist.sync import overlap
from paddle_dist.errors import CommThreadError, PeerFailure


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
    # each bucket: a presence number per parameter; the first also carries the flag
    assert rec.sizes == [1 + 4 + 1, 1 + 64, 1 + 16, 1 + 128]
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



def test_a_held_parameter_waits_for_the_step_and_a_table_dropped_never_travels():
    """A parameter that may come as rows (sync/sparse.py) holds its bucket until the first
    exchange; dropped (it came as rows), the buckets left go without it."""
    net, rec = _net(), Recorder()
    w1, b1, w2, b2 = net.parameters()
    ov = overlap.Overlap([w1, b1, w2, b2], rec, cap_bytes=1 << 20, stop=lambda: 1.0, held={id(b1)})
    _backward(net)
    assert [names for names, _ in rec.submitted] == [[b2.name], [w2.name]]   # b1's bucket waits
    ov.drop([b1])
    assert _names(ov.buckets) == [[b2.name], [w2.name], [w1.name]] and rec.sizes[-1] == 1 + 128
    ov.finish()
    assert [names for names, _ in rec.submitted][2:] == [[w1.name]]
    _backward(net)                                 # from now on nothing is held
    assert [names for names, _ in rec.submitted][3:] == [[b2.name], [w2.name], [w1.name]]

class Halver:
    """A reducer whose 'other rank' holds the same arrays: the mean is the array itself;
    records the thread it ran on."""

    def __init__(self, fail_on=None, error=RuntimeError("Connection reset by peer\nmore detail")):
        self.threads, self.fail_on, self.count, self.error = [], fail_on, 0, error

    def all_reduce(self, arrays, scale=1.0):
        self.count += 1
        self.threads.append(threading.current_thread().name)
        if self.count == self.fail_on:
            raise self.error
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


class PeerWithEveryGradient:
    """A reducer whose 'other rank' has a gradient of ones for every parameter: its
    presence numbers are 1 and its gradients 1 (each bucket's arrays: presence, gradients,
    then the flag of the first)."""

    def all_reduce(self, arrays, scale=1.0):
        for a in arrays:
            a += np.float32(1.0)
            a *= np.float32(scale)
        return 1


def test_a_gradient_this_rank_lacks_gets_the_mean_and_one_nobody_has_stays_absent():
    net = _net()
    w1, b1, w2, b2 = net.parameters()
    _backward(net)
    mine = w2.grad.numpy().copy()
    b2.clear_gradient(False)                       # this rank's batch did not reach b2
    assert b2.grad is None
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(PeerWithEveryGradient(), 0.5), 1 << 20)
    ov.finish()
    np.testing.assert_array_equal(b2.grad.numpy(), np.full([4], 0.5, np.float32))   # (0 + 1) / 2
    np.testing.assert_allclose(w2.grad.numpy(), (mine + 1) / 2, rtol=1e-6)
    ov.close()
    # No rank has one (the 'other rank' the same as this one): it stays without.
    net = _net()
    _backward(net)
    net[2].bias.clear_gradient(False)
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(Halver(), 0.5), 1 << 20)
    ov.finish()
    assert net[2].bias.grad is None and net[2].weight.grad is not None
    ov.close()


def test_a_failed_exchange_is_a_peer_failure_at_the_step_and_stops_the_rest():
    net, reducer = _net(), Halver(fail_on=1)
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(reducer, 0.5), 1 << 20)
    _backward(net)                                 # never raises inside backward()
    with pytest.raises(PeerFailure, match="gradient all-reduce failed: Connection reset by peer$"):
        ov.finish()
    assert reducer.count == 1                      # the later buckets were not sent
    ov.close()


def _finish_within(ov, seconds):
    """ov.finish() on a thread of its own; what it raised, or a failure after `seconds`."""
    raised = []

    def finish():
        try:
            ov.finish()
        except BaseException as exc:   # noqa: BLE001 - the test looks at it
            raised.append(exc)

    thread = threading.Thread(target=finish, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    assert not thread.is_alive(), f"the step still waited after {seconds} s"
    return raised[0] if raised else None


@pytest.mark.parametrize("error", [ValueError("output array is read-only"), TypeError("bad operand"),
                                   MemoryError("out of memory")], ids=lambda e: type(e).__name__)
def test_any_error_on_the_thread_reaches_the_step_named_within_a_second(error):
    net, reducer = _net(), Halver(fail_on=2, error=error)
    ov = overlap.Overlap(net.parameters(), overlap.ThreadExchange(reducer, 0.5), 1 << 20)
    _backward(net)
    raised = _finish_within(ov, seconds=1.0)
    assert isinstance(raised, CommThreadError)
    assert str(raised) == f"the gradient-sync thread failed: {type(error).__name__}: {error}"
    assert raised.__cause__ is error and reducer.count == 2     # nothing sent after it
    ov.close()


def test_a_step_waiting_on_a_thread_that_is_gone_fails_instead_of_waiting():
    net = _net()
    exchange = overlap.ThreadExchange(Halver(), 0.5)
    ov = overlap.Overlap(net.parameters(), exchange, 1 << 20)
    exchange.close()                               # the thread ends
    _backward(net)                                 # its buckets queue for a thread that is gone
    raised = _finish_within(ov, seconds=1.0 + 2 * overlap.THREAD_CHECK_S)
    assert isinstance(raised, CommThreadError) and "ended with exchanges outstanding" in str(raised)


class FakeTask:
    def __init__(self, log):
        self.log = log

    def wait(self):
        self.log.append("wait")


def test_gpu_path_sends_async_and_reads_the_stop_flag_one_step_late(monkeypatch):
    monkeypatch.setattr(overlap.LateFlag, "EVERY", 1)       # (every 16 steps: test_grad_sync.py)
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
