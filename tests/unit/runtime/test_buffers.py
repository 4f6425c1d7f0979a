"""runtime/scripthooks/buffers.py: what the hook does to a plain script's paddle.DataParallel
(--sync-buffers, or the warning): attach()'s rules, in this process, with the world size
patched. How the hook gets into the ranks: test_sitecustomize.py."""

import types

import paddle
import pytest

from paddle_dist.runtime import protocol
from paddle_dist.runtime.scripthooks import buffers


# ---------------------------------------------------------------- attach()'s rules
def bn_net():
    return paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3), paddle.nn.BatchNorm2D(4))


class Wrapper(paddle.nn.Layer):
    """What attach() reads of a paddle.DataParallel: its one sublayer and its group."""

    def __init__(self, net):
        super().__init__()
        self.inner, self.group = net, None


def wrapped(net):
    return Wrapper(net)


@pytest.fixture
def world(monkeypatch):
    """attach() as in rank `rank` of `size` (paddle.distributed patched in buffers)."""
    def set_world(size, rank=0):
        monkeypatch.setattr(buffers, "dist", types.SimpleNamespace(get_world_size=lambda: size,
                                                                   get_rank=lambda: rank))
        monkeypatch.setattr(buffers, "_warned", False)
    return set_world


def test_rank_0_of_several_warns_once_and_only_for_its_own_statistics(world, capsys, monkeypatch):
    monkeypatch.delenv(protocol.SYNC_BUFFERS, raising=False)
    world(2, rank=1)
    buffers.attach(wrapped(bn_net()))
    world(2, rank=0)
    buffers.attach(wrapped(paddle.nn.Linear(2, 2)))                    # no BatchNorm
    buffers.attach(wrapped(paddle.nn.SyncBatchNorm(4)))                # its statistics are global
    assert capsys.readouterr().err == ""
    buffers.attach(wrapped(bn_net()))
    buffers.attach(wrapped(bn_net()))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1 BatchNorm layer;" in err and "--sync-buffers" in err


def test_one_rank_gets_nothing_even_with_the_option(world, capsys, monkeypatch):
    monkeypatch.setenv(protocol.SYNC_BUFFERS, "1")
    world(1)
    assert buffers.attach(wrapped(bn_net())) is None
    assert capsys.readouterr().err == ""


def test_a_data_parallel_that_fit_makes_is_left_alone(world, capsys, monkeypatch):
    """fit()'s trainer updates the statistics itself (sync/batchstats.py, once per step)."""
    monkeypatch.delenv(protocol.SYNC_BUFFERS, raising=False)
    world(2)
    trainer = {"__name__": "paddle_dist.trainer.session", "attach": buffers.attach, "net": wrapped(bn_net())}
    exec("def make():\n    return attach(net)\n", trainer)
    assert trainer["make"]() is None
    assert capsys.readouterr().err == ""


def test_the_statistics_step_after_training_forwards_only(monkeypatch):
    net = bn_net()
    with pytest.warns(UserWarning):                  # one process: "return to single-card operation"
        model = paddle.DataParallel(net)
    stats = buffers.sync(model, types.SimpleNamespace(is_distributed=False))
    steps = []
    monkeypatch.setattr(stats, "step", lambda: steps.append(1))
    x = paddle.randn([2, 3, 5, 5])
    model.train()
    model(x)
    net.eval()                                       # the wrapped net switched, not the wrapper
    model(x)
    model.eval()
    model(x)
    assert steps == [1]
    stats.close()
    model.train()
    model(x)
    assert steps == [1]


def test_rank_0_says_once_that_the_statistics_are_synced(world, capsys, monkeypatch):
    """--sync-buffers costs step rate (docs/benchmarks.md): a job that has it on says so."""
    monkeypatch.setenv(protocol.SYNC_BUFFERS, "1")
    monkeypatch.setattr(buffers, "_said", False)
    monkeypatch.setattr(buffers, "sync", lambda data_parallel, env: "synced")
    world(2, rank=1)
    assert buffers.attach(wrapped(bn_net())) == "synced"
    assert capsys.readouterr().err == ""
    world(2, rank=0)
    assert buffers.attach(wrapped(bn_net())) == "synced"
    assert buffers.attach(wrapped(bn_net())) == "synced"
    err = capsys.readouterr().err
    assert err == ("paddle_dist: --sync-buffers: the statistics of 1 BatchNorm layer are all-reduced "
                   "after each training forward, so every rank evaluates and saves the same (the cost "
                   "grows with the number of BatchNorm layers: docs/benchmarks.md)\n")
