"""GradSync's stop-flag schedule in sync.mode=dataparallel (one process, the all-reduce
stood in for): the ranks exchange the flag about once a second, at steps rank 0 picks."""

from types import SimpleNamespace

import pytest

from paddle_dist import sync


class Clock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(sync, "time", fake)
    return fake


def _train(grad_sync, clock, steps, seconds_per_step, stop_at=None):
    """Run `steps` optimizer steps; return the steps at which the flag was exchanged and
    the first step that saw the stop."""
    exchanged, stopped = [], None
    for step in range(1, steps + 1):
        clock.now += seconds_per_step
        grad_sync.want_stop = lambda s=step: stop_at is not None and s >= stop_at
        before = grad_sync.calls
        grad_sync.average([])
        if grad_sync.calls > before:
            exchanged.append(step)
        if grad_sync.stop_requested and stopped is None:
            stopped = step
    return exchanged, stopped


def _dataparallel(rank, proposal=None):
    """A GradSync of `rank` whose all-reduce adds the other rank's contribution: rank 0's
    proposal for the next interval when this is rank 1."""
    env = SimpleNamespace(is_distributed=True, global_rank=rank, backend="gloo")
    grad_sync = sync.GradSync(env, mode="dataparallel")

    def all_reduce(tensor, what):
        grad_sync.calls += 1
        if proposal is not None:
            tensor[1] = tensor[1] + proposal(grad_sync.steps)
    grad_sync._all_reduce = all_reduce
    return grad_sync


def test_rank_0_spaces_the_exchanges_about_a_second_apart(clock):
    exchanged, stopped = _train(_dataparallel(0), clock, 450, 0.01, stop_at=150)
    assert exchanged == [1, 101, 201, 301, 401]        # 10 ms steps: every 100
    assert stopped == 201                              # the next exchange after the request


def test_slow_steps_exchange_at_every_step_and_fast_ones_at_most_max_apart(clock):
    exchanged, stopped = _train(_dataparallel(0), clock, 5, 2.0, stop_at=3)
    assert exchanged == [1, 2, 3, 4, 5] and stopped == 3
    exchanged, _ = _train(_dataparallel(0), clock, 2500, 1e-6)
    assert exchanged == [1, 1001, 2001]


def test_the_other_ranks_follow_rank_0s_schedule(clock):
    # Rank 1 proposes nothing: it adopts what the all-reduce brings (rank 0's interval).
    exchanged, stopped = _train(_dataparallel(1, proposal=lambda step: 40.0), clock, 100, 0.5,
                                stop_at=50)
    assert exchanged == [1, 41, 81] and stopped == 81


def test_stop_check_interval_bounds():
    assert sync.stop_check_interval(0.025) == 40
    assert sync.stop_check_interval(3.0) == 1
    assert sync.stop_check_interval(0.0) == sync.STOP_CHECK_MAX
    assert sync.stop_check_interval(1e-9) == sync.STOP_CHECK_MAX


def test_gpus_read_the_fused_stop_flag_one_step_late_and_cpus_at_once():
    import paddle

    for device, expected in (("gpu:0", [0.0, 2.0, 0.0]), ("cpu", [2.0, 0.0, 1.0])):
        env = SimpleNamespace(is_distributed=True, global_rank=0, backend="nccl", device=device)
        grad_sync = sync.GradSync(env, mode="fused")
        seen = [grad_sync._read_flag(paddle.to_tensor([v], dtype="float32")) for v in (2.0, 0.0, 1.0)]
        assert seen == expected, device
