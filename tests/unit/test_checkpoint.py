"""Unit tests for paddle_dist.checkpoint: npz + JSON checkpoints, atomic, pruned, never unpickled."""

import json

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from paddle_dist import checkpoint as ck

INPUT = np.linspace(-1.0, 1.0, 12, dtype="float32").reshape(4, 3)


def fresh_names():
    """A new Paddle name generator: what a fresh process starts with (public API only)."""
    previous = unique_name.switch()          # installs a fresh generator...
    fresh, _ = unique_name.switch(*previous)  # ...and puts the old one back
    return fresh


def new_model(seed=0):
    """A Linear(3, 2) + Adam, named as in a fresh process (linear_0, ..._moment1_0).

    Paddle keys optimizer state by parameter name, so a restored optimizer only matches
    a model built the same way: each one gets its own name generator, as a new process would.
    """
    names = fresh_names()
    with unique_name.guard(names):
        paddle.seed(seed)
        net = paddle.nn.Linear(3, 2)
        opt = paddle.optimizer.Adam(learning_rate=0.05, parameters=net.parameters())
    return net, opt, names


def train_step(net, opt, names):
    with unique_name.guard(names):
        loss = ((net(paddle.to_tensor(INPUT)) - 1.0) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()


def trained(steps=1, seed=0):
    net, opt, names = new_model(seed)
    for _ in range(steps):
        train_step(net, opt, names)
    return net, opt, names


def arrays(state):
    """A state_dict as {name: numpy array} (nested dicts flattened, scalars kept)."""
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in arrays(value).items()})
        else:
            out[key] = value.numpy() if isinstance(value, paddle.Tensor) else value
    return out


def assert_same_state(a, b):
    a, b = arrays(a), arrays(b)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


@pytest.fixture
def one_step():
    return trained(steps=1)


# ---------------------------------------------------------------- layout
def test_save_writes_the_checkpoint_layout(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path / "checkpoints", epoch=1, model=net, optimizer=opt)
    assert path == tmp_path / "checkpoints" / "epoch_0001"
    assert sorted(p.name for p in path.iterdir()) == ["meta.json", "model.npz", "optimizer.npz"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "epoch_0001"
    assert ck.latest(tmp_path / "checkpoints") == path
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch_0001", "latest"]


def test_meta_json_holds_the_epoch_and_the_given_meta(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path, epoch=3, model=net, optimizer=opt,
                   meta={"step": 120, "eval_acc": 0.75, "config": {"train": {"epochs": 5}}})
    meta = json.loads((path / "meta.json").read_text())
    assert meta["epoch"] == 3
    assert meta["step"] == 120
    assert meta["eval_acc"] == 0.75
    assert meta["config"] == {"train": {"epochs": 5}}
    state = ck.load(path)
    assert state.meta["epoch"] == 3
    assert state.meta["step"] == 120
    assert "optimizer_scalars" not in state.meta


def test_the_epoch_argument_wins_over_meta(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path, epoch=2, model=net, optimizer=opt, meta={"epoch": 99})
    assert ck.load(path).meta["epoch"] == 2


def test_npz_files_hold_plain_arrays_only(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    for name in ("model.npz", "optimizer.npz"):
        with np.load(path / name, allow_pickle=False) as data:
            assert data.files
            for key in data.files:
                assert data[key].dtype != object, (name, key)
    with np.load(path / "model.npz", allow_pickle=False) as data:
        assert sorted(data.files) == sorted(net.state_dict())


# ---------------------------------------------------------------- load + restore
def test_load_and_restore_give_identical_model_and_optimizer(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt)

    fresh_net, fresh_opt, fresh_names = new_model(seed=1)   # different initial weights
    assert not np.array_equal(fresh_net.weight.numpy(), net.weight.numpy())
    ck.restore(ck.load(tmp_path), fresh_net, fresh_opt)

    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(fresh_opt.state_dict(), opt.state_dict())

    # The restored Adam moments matter: the next step must land on the same weights.
    train_step(net, opt, names)
    train_step(fresh_net, fresh_opt, fresh_names)
    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(fresh_opt.state_dict(), opt.state_dict())


def test_a_fresh_optimizer_would_step_differently(one_step):
    # Control for the test above: without the optimizer state the next step differs.
    net, opt, names = one_step
    other_net, other_opt, other_names = new_model()
    other_net.set_state_dict(net.state_dict())
    train_step(net, opt, names)
    train_step(other_net, other_opt, other_names)
    assert not np.array_equal(net.weight.numpy(), other_net.weight.numpy())


def test_load_keeps_dtypes_and_shapes(tmp_path, one_step):
    net, opt, _ = one_step
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    state = ck.load(tmp_path)
    for key, value in net.state_dict().items():
        assert state.model[key].shape == tuple(value.shape)
        assert state.model[key].dtype == np.float32


def test_restore_model_only(tmp_path, one_step):
    net, opt, _ = one_step
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    fresh_net, _, _ = new_model(seed=1)
    ck.restore(ck.load(tmp_path), fresh_net)
    assert_same_state(fresh_net.state_dict(), net.state_dict())


def test_load_accepts_the_root_or_an_epoch_directory(tmp_path, one_step):
    net, opt, names = one_step
    first = ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    train_step(net, opt, names)
    ck.save(tmp_path, epoch=2, model=net, optimizer=opt)
    assert ck.load(tmp_path).meta["epoch"] == 2          # root: follows `latest`
    assert ck.load(first).meta["epoch"] == 1


def test_learning_rate_scheduler_state_round_trips(tmp_path):
    names = fresh_names()
    with unique_name.guard(names):
        net = paddle.nn.Linear(3, 2)
        opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                    parameters=net.parameters())
    train_step(net, opt, names)
    opt._learning_rate.step()
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt)

    with unique_name.guard(fresh_names()):
        fresh = paddle.nn.Linear(3, 2)
        fresh_opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                          parameters=fresh.parameters())
    ck.restore(ck.load(tmp_path), fresh, fresh_opt)
    assert fresh_opt.get_lr() == pytest.approx(opt.get_lr())
    assert fresh_opt.get_lr() == pytest.approx(0.01)


# ---------------------------------------------------------------- pruning and crashes
def test_keep_last_two_after_four_saves(tmp_path, one_step):
    net, opt, names = one_step
    for epoch in range(1, 5):
        ck.save(tmp_path, epoch=epoch, model=net, optimizer=opt, keep_last=2)
        train_step(net, opt, names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch_0003", "epoch_0004", "latest"]
    assert ck.latest(tmp_path) == tmp_path / "epoch_0004"
    assert ck.load(tmp_path).meta["epoch"] == 4


def test_keep_last_zero_keeps_everything(tmp_path, one_step):
    net, opt, _ = one_step
    for epoch in range(1, 4):
        ck.save(tmp_path, epoch=epoch, model=net, optimizer=opt, keep_last=0)
    assert len(list(tmp_path.glob("epoch_*"))) == 3


def test_saving_an_epoch_again_replaces_it(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt, meta={"try": 1})
    train_step(net, opt, names)
    ck.save(tmp_path, epoch=1, model=net, optimizer=opt, meta={"try": 2})
    state = ck.load(tmp_path)
    assert state.meta["try"] == 2
    np.testing.assert_array_equal(state.model["weight"], net.weight.numpy())


def test_leftover_temp_dir_from_a_crashed_save_is_ignored(tmp_path, one_step):
    net, opt, names = one_step
    for epoch in range(1, 5):
        ck.save(tmp_path, epoch=epoch, model=net, optimizer=opt, keep_last=2)
    # A save of epoch 5 that died mid-write, in another process.
    crashed = tmp_path / ".epoch_0005.tmp-123"
    crashed.mkdir()
    (crashed / "model.npz").write_bytes(b"PK\x03\x04 half a zip")
    assert ck.latest(tmp_path) == tmp_path / "epoch_0004"
    state = ck.load(tmp_path)
    assert state.meta["epoch"] == 4
    np.testing.assert_array_equal(state.model["weight"], net.weight.numpy())
    # The next save and its pruning do not trip over it either.
    train_step(net, opt, names)
    ck.save(tmp_path, epoch=5, model=net, optimizer=opt, keep_last=2)
    assert ck.latest(tmp_path) == tmp_path / "epoch_0005"
    assert sorted(p.name for p in tmp_path.glob("epoch_*")) == ["epoch_0004", "epoch_0005"]


def test_latest_without_checkpoints_is_none(tmp_path):
    assert ck.latest(tmp_path) is None
    (tmp_path / "latest").write_text("epoch_0009")   # points nowhere
    assert ck.latest(tmp_path) is None


# ---------------------------------------------------------------- loading never unpickles
UNPICKLED = []


def _record_unpickling(tag):
    UNPICKLED.append(tag)
    return tag


class Payload:
    """Pickles to a call of _record_unpickling: proof of whether anything was unpickled."""

    def __reduce__(self):
        return _record_unpickling, ("payload ran",)


@pytest.fixture
def crafted_checkpoint(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    payload = np.empty(1, dtype=object)
    payload[0] = Payload()
    np.savez(path / "model.npz", weight=payload)   # savez pickles object arrays by default
    UNPICKLED.clear()
    return path


def test_the_crafted_payload_does_run_when_unpickled(crafted_checkpoint):
    # Control: numpy with allow_pickle=True would run it.
    with np.load(crafted_checkpoint / "model.npz", allow_pickle=True) as data:
        data["weight"]
    assert UNPICKLED == ["payload ran"]
    UNPICKLED.clear()


@pytest.mark.parametrize("target", ["epoch", "root"])
def test_load_refuses_pickled_objects(crafted_checkpoint, target):
    path = crafted_checkpoint if target == "epoch" else crafted_checkpoint.parent
    with pytest.raises(ValueError, match="allow_pickle"):
        ck.load(path)
    assert UNPICKLED == []


def test_load_refuses_a_pickled_optimizer_file(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path, epoch=1, model=net, optimizer=opt)
    payload = np.empty(1, dtype=object)
    payload[0] = Payload()
    np.savez(path / "optimizer.npz", state=payload)   # savez pickles object arrays by default
    UNPICKLED.clear()
    with pytest.raises(ValueError, match="allow_pickle"):
        ck.load(path)
    assert UNPICKLED == []
