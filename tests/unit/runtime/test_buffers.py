"""runtime/scripthooks: how `python -m paddle_dist.launch` hooks a plain script's
paddle.DataParallel (--sync-buffers, or the warning) through the ranks' PYTHONPATH.

Start-up is checked in fresh interpreters (a stand-in `paddle` package where paddle itself
is not needed); attach()'s rules in this process, with the world size patched.
"""

import os
import types

import paddle
import pytest

from paddle_dist.runtime import protocol
from paddle_dist.runtime.scripthooks import buffers

HOOKS = protocol.SCRIPT_HOOKS


def test_the_hooks_directory_holds_only_sitecustomize():
    assert sorted(n for n in os.listdir(HOOKS) if n != "__pycache__") == ["sitecustomize.py"]


def test_script_hooks_put_the_directory_first_once_and_pass_the_option():
    given = {"PYTHONPATH": os.pathsep.join([HOOKS, "/mine"])}
    assert protocol.script_hooks(False, given) == {"PYTHONPATH": os.pathsep.join([HOOKS, "/mine"])}
    assert protocol.script_hooks(True, {}) == {"PYTHONPATH": HOOKS, protocol.SYNC_BUFFERS: "1"}
    assert protocol.sync_buffers({protocol.SYNC_BUFFERS: "1"}) and not protocol.sync_buffers({})


def test_start_up_chains_the_next_sitecustomize_and_imports_nothing_else(tmp_path, fresh_python):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import sys\nsys.path.append('/added')\nRAN = True\n")
    out, _ = fresh_python("import sys, sitecustomize as s\n"
                          "print(type(sys.meta_path[0]).__name__, s.chained.RAN, s.__file__ == s.HERE + '/sitecustomize.py')\n"
                          "print(sys.path.index(s.HERE) < sys.path.index(%r), '/added' in sys.path)\n"
                          "print(sorted(m for m in ('paddle', 'paddle_dist', 'numpy') if m in sys.modules))\n" % str(other),
                          HOOKS, other)
    assert out.split("\n")[:3] == ["PaddleFinder True True", "True True", "[]"]


def test_a_failing_next_sitecustomize_is_reported_as_python_does_and_the_hook_stays(tmp_path, fresh_python):
    (tmp_path / "sitecustomize.py").write_text("raise RuntimeError('broken')\n")
    out, err = fresh_python("import sys; print(type(sys.meta_path[0]).__name__)", HOOKS, tmp_path)
    assert out.strip() == "PaddleFinder"
    assert "Error in sitecustomize; set PYTHONVERBOSE for traceback:\nRuntimeError: broken" in err


def test_every_data_parallel_class_is_hooked_once_paddle_has_run(tmp_path, fresh_python):
    """A stand-in paddle: its DataParallel, a subclass and its own loader seen by the package."""
    fake = tmp_path / "fake"
    (fake / "paddle").mkdir(parents=True)
    (fake / "paddle" / "__init__.py").write_text(
        "LOADER = __loader__\n"
        "class DataParallel:\n"
        "    def __init__(self, layers):\n"
        "        self.layers = layers\n")
    out, _ = fresh_python("import sys, sitecustomize as s\n"
                          "made = []\n"
                          "s.attach = made.append\n"
                          "import paddle\n"
                          "class Mine(paddle.DataParallel):\n"
                          "    def __init__(self, layers):\n"
                          "        super().__init__(layers)\n"
                          "a, b = paddle.DataParallel(1), Mine(2)\n"
                          "print(made == [a, b], paddle.LOADER is paddle.__loader__ is paddle.__spec__.loader,\n"
                          "      type(paddle.__loader__).__name__)\n",
                          HOOKS, fake)
    assert out.strip() == "True True SourceFileLoader"


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
