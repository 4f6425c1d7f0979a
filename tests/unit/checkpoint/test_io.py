"""Unit tests for paddle_dist.checkpoint: the full training state in npz + JSON, written
atomically (also from a background thread), pruned, validated, never unpickled."""

import json
import pickle
import random
import threading
import warnings
from pathlib import Path

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from paddle_dist import checkpoint as ck
from paddle_dist import compat, models
from paddle_dist.config import config_hash
from paddle_dist.errors import UserError
from tests.integration.procs import run

INPUT = np.linspace(-1.0, 1.0, 12, dtype="float32").reshape(4, 3)
FILES = ["meta.json", "model.npz", "optimizer.npz", "rng.npz"]


def fresh_names():
    """A new Paddle name generator: what a fresh process starts with (public API only)."""
    previous = unique_name.switch()          # installs a fresh generator...
    fresh, _ = unique_name.switch(*previous)  # ...and puts the old one back
    return fresh


def new_model(seed=0, lr=0.05):
    """A Linear(3, 2) + Adam, named as in a fresh process (linear_0, ..._moment1_0).

    Paddle keys optimizer state by parameter name, so a restored optimizer only matches
    a model built the same way: each one gets its own name generator, as a new process would.
    """
    names = fresh_names()
    with unique_name.guard(names):
        paddle.seed(seed)
        net = paddle.nn.Linear(3, 2)
        opt = paddle.optimizer.Adam(learning_rate=lr, parameters=net.parameters())
    return net, opt, names


def train_step(net, opt, names, dropout=0.0):
    """One Adam step; with dropout > 0 the step also depends on Paddle's RNG."""
    with unique_name.guard(names):
        out = paddle.nn.functional.dropout(net(paddle.to_tensor(INPUT)), p=dropout)
        loss = ((out - 1.0) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()


def trained(steps=1, seed=0):
    net, opt, names = new_model(seed)
    for _ in range(steps):
        train_step(net, opt, names)
    return net, opt, names


def meta(step=1, **extra):
    return dict(global_step=step, epoch=0, step_in_epoch=step, world_size=1, model="linear", **extra)


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


def draws():
    """One number from each generator a training step may use."""
    return random.random(), float(np.random.rand()), paddle.rand([3]).numpy().tolist()


@pytest.fixture
def one_step():
    return trained(steps=1)


@pytest.fixture
def saved(tmp_path, one_step):
    net, opt, _ = one_step
    return ck.save(tmp_path / "checkpoints", net, opt, meta(1))


# ---------------------------------------------------------------- random generators
def test_apply_rng_replays_python_numpy_and_paddle():
    arrays_, info = ck.capture_rng()
    first = draws()
    ck.apply_rng(arrays_, info)
    assert draws() == first


def test_rng_state_is_arrays_and_json_only():
    arrays_, info = ck.capture_rng()
    assert all(isinstance(a, np.ndarray) and a.dtype != object for a in arrays_.values())
    assert json.loads(json.dumps(info)) == info


def test_rng_state_survives_a_checkpoint(tmp_path, one_step):
    net, opt, _ = one_step
    ck.save(tmp_path, net, opt, meta(1))
    first = draws()
    state = ck.load(tmp_path)
    ck.restore(state, net, opt)
    assert draws() == first
    draws()
    ck.restore(state, net, opt, rng=False)      # leaves the generators alone
    assert draws() != first


# ---------------------------------------------------------------- layout
def test_save_writes_the_checkpoint_layout(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path / "checkpoints", net, opt, meta(7))
    assert path == tmp_path / "checkpoints" / "ckpt_000000007"
    assert sorted(p.name for p in path.iterdir()) == FILES
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt_000000007"
    assert ck.latest(tmp_path / "checkpoints") == path
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["ckpt_000000007", "latest"]


def test_meta_round_trips_exactly(tmp_path, one_step):
    net, opt, _ = one_step
    given = meta(120, api="loop", config_hash="abc", history=[{"epoch": 1, "eval_acc": 0.75}])
    path = ck.save(tmp_path, net, opt, given)
    on_disk = json.loads((path / "meta.json").read_text())
    assert on_disk["global_step"] == 120 and on_disk["format"] == ck.FORMAT
    assert ck.load(path).meta == given


@pytest.mark.parametrize("bad, match", [
    ({"epoch": 0}, "lacks"),
    (meta(-1), "global_step"),
    (meta(1.0), "global_step"),
    (meta(1, format=3), "reserved"),
    (meta(1, when=object()), "JSON"),
])
def test_bad_meta_fails_on_the_calling_thread(one_step, bad, match):
    net, opt, _ = one_step
    with pytest.raises(ValueError, match=match):
        ck.snapshot(net, opt, bad)


def test_npz_files_hold_plain_arrays_only(saved, one_step):
    net, _, _ = one_step
    for name in ("model.npz", "optimizer.npz", "rng.npz"):
        with np.load(saved / name, allow_pickle=False) as data:
            assert data.files
            assert all(data[key].dtype != object for key in data.files), name
    with np.load(saved / "model.npz", allow_pickle=False) as data:
        assert sorted(data.files) == sorted(net.state_dict())


def test_the_same_state_gives_the_same_bytes(tmp_path, one_step):
    net, opt, _ = one_step
    snap = ck.snapshot(net, opt, meta(3))
    a, b = ck.write(tmp_path / "a", snap), ck.write(tmp_path / "b", snap)
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# ---------------------------------------------------------------- load + restore
def test_load_and_restore_give_identical_model_and_optimizer(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, net, opt, meta(1))

    fresh_net, fresh_opt, fresh_names = new_model(seed=1)   # different initial weights
    assert not np.array_equal(fresh_net.weight.numpy(), net.weight.numpy())
    ck.restore(ck.load(tmp_path), fresh_net, fresh_opt)

    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())

    # The restored Adam moments matter: the next step must land on the same weights.
    train_step(net, opt, names)
    train_step(fresh_net, fresh_opt, fresh_names)
    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())


def test_a_random_step_after_restore_matches_going_on_without_a_checkpoint(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, net, opt, meta(1))
    train_step(net, opt, names, dropout=0.5)          # the run that never stopped

    fresh_net, fresh_opt, fresh_names = new_model(seed=1)
    paddle.seed(12345)                                # a new process: other RNG state
    ck.restore(ck.load(tmp_path), fresh_net, fresh_opt)
    train_step(fresh_net, fresh_opt, fresh_names, dropout=0.5)
    assert_same_state(fresh_net.state_dict(), net.state_dict())


def test_a_fresh_optimizer_would_step_differently(one_step):
    # Control for the tests above: without the optimizer state the next step differs.
    net, opt, names = one_step
    other_net, other_opt, other_names = new_model()
    other_net.set_state_dict(net.state_dict())
    train_step(net, opt, names)
    train_step(other_net, other_opt, other_names)
    assert not np.array_equal(net.weight.numpy(), other_net.weight.numpy())


def test_load_keeps_dtypes_and_shapes(saved, one_step):
    net, _, _ = one_step
    state = ck.load(saved)
    for key, value in net.state_dict().items():
        assert state.model[key].shape == tuple(value.shape)
        assert state.model[key].dtype == np.float32


def test_restore_model_only(saved, one_step):
    net, _, _ = one_step
    fresh_net, _, _ = new_model(seed=1)
    ck.restore(ck.load(saved), fresh_net)
    assert_same_state(fresh_net.state_dict(), net.state_dict())


def test_restore_refuses_a_model_of_another_shape(saved):
    with unique_name.guard(fresh_names()):
        other = paddle.nn.Linear(3, 5)
    with pytest.raises(ck.CheckpointError, match="weight"):
        ck.restore(ck.load(saved), other)


def test_load_accepts_a_checkpoint_its_root_or_the_run_dir(tmp_path, one_step):
    net, opt, names = one_step
    first = ck.save(tmp_path / "checkpoints", net, opt, meta(1))
    train_step(net, opt, names)
    ck.save(tmp_path / "checkpoints", net, opt, meta(2))
    assert ck.load(tmp_path / "checkpoints").meta["global_step"] == 2   # follows `latest`
    assert ck.load(tmp_path).meta["global_step"] == 2
    state = ck.load(first)
    assert state.meta["global_step"] == 1 and state.path == first


def test_learning_rate_scheduler_state_round_trips(tmp_path):
    names = fresh_names()
    with unique_name.guard(names):
        net = paddle.nn.Linear(3, 2)
        opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                    parameters=net.parameters())
    train_step(net, opt, names)
    opt._learning_rate.step()
    ck.save(tmp_path, net, opt, meta(1))

    with unique_name.guard(fresh_names()):
        fresh = paddle.nn.Linear(3, 2)
        fresh_opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                          parameters=fresh.parameters())
    ck.restore(ck.load(tmp_path), fresh, fresh_opt)
    assert fresh_opt.get_lr() == pytest.approx(opt.get_lr())
    assert fresh_opt.get_lr() == pytest.approx(0.01)
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())


# ---------------------------------------------------------------- snapshot + background writes
def test_a_snapshot_is_taken_when_made_not_when_written(tmp_path, one_step):
    net, opt, names = one_step
    before = net.weight.numpy().copy()
    snap = ck.snapshot(net, opt, meta(1))
    train_step(net, opt, names)                       # training goes on before the write
    ck.write(tmp_path, snap)
    np.testing.assert_array_equal(ck.load(tmp_path).model["weight"], before)


def test_async_saver_writes_the_same_bytes_as_save(tmp_path, one_step):
    net, opt, _ = one_step
    by_save = ck.save(tmp_path / "a", net, opt, meta(5), keep_last=2)
    saver = ck.AsyncSaver()
    saver.submit(tmp_path / "b", ck.snapshot(net, opt, meta(5)), keep_last=2)
    by_saver = saver.wait()
    assert by_saver == tmp_path / "b" / "ckpt_000000005"
    for name in FILES:
        assert (by_save / name).read_bytes() == (by_saver / name).read_bytes(), name
    assert ck.latest(tmp_path / "b") == by_saver


def test_async_saver_writes_off_the_calling_thread_one_at_a_time(tmp_path, one_step, monkeypatch):
    net, opt, _ = one_step
    release, entered, writers, real_write = threading.Event(), threading.Event(), [], ck.write

    def slow_write(root, snap, keep_last):
        writers.append(threading.current_thread())
        entered.set()
        assert release.wait(timeout=60)
        return real_write(root, snap, keep_last)

    monkeypatch.setattr(ck.io, "write", slow_write)          # what the saver calls
    saver = ck.AsyncSaver()
    saver.submit(tmp_path, ck.snapshot(net, opt, meta(1)), keep_last=0)
    # The writer has taken snapshot 1 (else snapshot 2 would replace it in the queue).
    assert entered.wait(timeout=60)
    assert ck.latest(tmp_path) is None                # submit returned; the write is blocked
    release.set()
    saver.submit(tmp_path, ck.snapshot(net, opt, meta(2)), keep_last=0)   # waits for the 1st
    saver.close()
    assert threading.current_thread() not in writers and len(writers) == 2
    assert [p.name for p in sorted(tmp_path.glob("ckpt_*"))] == ["ckpt_000000001", "ckpt_000000002"]
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000002"


def test_async_saver_reraises_a_failed_write_once(tmp_path, one_step):
    net, opt, _ = one_step
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the checkpoints root should be")
    saver = ck.AsyncSaver()
    saver.submit(blocker, ck.snapshot(net, opt, meta(1)))
    with pytest.raises(OSError):
        saver.wait()
    assert saver.wait() is None                       # reported once, then cleared
    saver.submit(tmp_path / "ok", ck.snapshot(net, opt, meta(1)))
    assert saver.wait() == tmp_path / "ok" / "ckpt_000000001"


class _StartInterrupted(threading.Thread):
    """Ctrl-C inside Thread.start(): the thread runs only once `gate` is set, or never."""
    gate = None
    made: list = []

    def start(self):
        _StartInterrupted.made.append(self)
        if self.gate is not None:
            super().start()
        raise KeyboardInterrupt

    def run(self):
        assert self.gate.wait(timeout=60)
        super().run()


@pytest.mark.parametrize("runs", ["never", "late"])
def test_ctrl_c_while_the_writer_starts_still_writes_the_checkpoint_once(tmp_path, one_step,
                                                                        monkeypatch, runs):
    net, opt, _ = one_step
    writers, real_write = [], ck.write
    monkeypatch.setattr(ck.io, "write", lambda *a: writers.append(threading.current_thread()) or real_write(*a))
    monkeypatch.setattr(_StartInterrupted, "gate", threading.Event() if runs == "late" else None)
    monkeypatch.setattr(_StartInterrupted, "made", [])
    saver = ck.AsyncSaver()
    with monkeypatch.context() as patched:
        patched.setattr(threading, "Thread", _StartInterrupted)
        with pytest.raises(KeyboardInterrupt):
            saver.submit(tmp_path, ck.snapshot(net, opt, meta(7)), keep_last=0)
    assert saver.wait() == tmp_path / "ckpt_000000007"       # written here, on this thread
    assert writers == [threading.current_thread()]
    if runs == "late":
        _StartInterrupted.gate.set()
        (late,) = _StartInterrupted.made
        late.join(timeout=60)
        assert not late.is_alive() and writers == [threading.current_thread()]
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000007"
    saver.submit(tmp_path, ck.snapshot(net, opt, meta(8)), keep_last=0)   # a new writer thread
    assert saver.wait() == tmp_path / "ckpt_000000008" and writers[-1] is not threading.current_thread()


# ---------------------------------------------------------------- names, pruning, crashes
def test_keep_last_two_after_four_saves(tmp_path, one_step):
    net, opt, names = one_step
    for step in (10, 20, 30, 40):
        ck.save(tmp_path, net, opt, meta(step), keep_last=2)
        train_step(net, opt, names)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000000030", "ckpt_000000040", "latest"]
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000040"
    assert ck.load(tmp_path).meta["global_step"] == 40


def test_names_sort_by_step_beyond_nine_digits(tmp_path, one_step):
    net, opt, _ = one_step
    for step in (999_999_999, 1_000_000_000):
        ck.save(tmp_path, net, opt, meta(step), keep_last=1)
    assert [p.name for p in tmp_path.glob("ckpt_*")] == ["ckpt_1000000000"]


def test_keep_last_zero_keeps_everything(tmp_path, one_step):
    net, opt, _ = one_step
    for step in range(1, 4):
        ck.save(tmp_path, net, opt, meta(step), keep_last=0)
    assert len(list(tmp_path.glob("ckpt_*"))) == 3


def test_pruning_never_deletes_the_checkpoint_just_written(tmp_path, one_step):
    # Resumed from an older checkpoint in the same root: the new one is `latest` and stays.
    net, opt, _ = one_step
    for step in (10, 20):
        ck.save(tmp_path, net, opt, meta(step), keep_last=1)
    path = ck.save(tmp_path, net, opt, meta(15), keep_last=1)
    assert ck.latest(tmp_path) == path and path.is_dir()


def test_saving_a_step_again_replaces_it(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, net, opt, meta(1, attempt=1))
    train_step(net, opt, names)
    ck.save(tmp_path, net, opt, meta(1, attempt=2))
    state = ck.load(tmp_path)
    assert state.meta["attempt"] == 2
    np.testing.assert_array_equal(state.model["weight"], net.weight.numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000000001", "latest"]


def test_leftover_temp_dir_from_a_crashed_save_is_ignored(tmp_path, one_step):
    net, opt, names = one_step
    for step in range(1, 5):
        ck.save(tmp_path, net, opt, meta(step), keep_last=2)
    # A save of step 5 that died mid-write, in another process.
    crashed = tmp_path / ".ckpt_000000005.tmp-123-abcd"
    crashed.mkdir()
    (crashed / "model.npz").write_bytes(b"PK\x03\x04 half a zip")
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000004"
    state = ck.load(tmp_path)
    assert state.meta["global_step"] == 4
    np.testing.assert_array_equal(state.model["weight"], net.weight.numpy())
    # The next save and its pruning do not trip over it either.
    train_step(net, opt, names)
    ck.save(tmp_path, net, opt, meta(5), keep_last=2)
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000005"
    assert sorted(p.name for p in tmp_path.glob("ckpt_*")) == ["ckpt_000000004", "ckpt_000000005"]
    assert crashed.is_dir()               # same step: it might be another save's, keep it
    ck.save(tmp_path, net, opt, meta(6), keep_last=2)
    assert not crashed.exists()           # an older step's leftover: swept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_000000005", "ckpt_000000006", "latest"]


def test_latest_without_checkpoints_is_none(tmp_path):
    assert ck.latest(tmp_path) is None
    assert ck.latest(tmp_path / "missing") is None
    (tmp_path / "latest").write_text("ckpt_000000009")   # points nowhere
    assert ck.latest(tmp_path) is None


def test_latest_falls_back_to_the_newest_when_the_pointer_is_stale(tmp_path, one_step):
    # A crash between renaming a checkpoint into place and updating `latest`.
    net, opt, _ = one_step
    for step in (1, 2):
        ck.save(tmp_path, net, opt, meta(step))
    (tmp_path / "latest").write_text("ckpt_000000003")
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000002"
    (tmp_path / "latest").write_text("../..")            # never leaves the root
    assert ck.latest(tmp_path) == tmp_path / "ckpt_000000002"


# ---------------------------------------------------------------- loading never unpickles
UNPICKLED = []


def _record_unpickling(tag):
    UNPICKLED.append(tag)
    return tag


class Payload:
    """Pickles to a call of _record_unpickling: proof of whether anything was unpickled."""

    def __reduce__(self):
        return _record_unpickling, ("payload ran",)


def plant_payload(file, key):
    payload = np.empty(1, dtype=object)
    payload[0] = Payload()
    np.savez(file, **{key: payload})   # savez pickles object arrays by default
    UNPICKLED.clear()


def test_the_crafted_payload_does_run_when_unpickled(saved):
    # Control: numpy with allow_pickle=True would run it.
    plant_payload(saved / "model.npz", "weight")
    with np.load(saved / "model.npz", allow_pickle=True) as data:
        data["weight"]
    assert UNPICKLED == ["payload ran"]
    UNPICKLED.clear()


@pytest.mark.parametrize("file, key", [("model.npz", "weight"), ("optimizer.npz", "state"),
                                       ("rng.npz", "python")])
@pytest.mark.parametrize("target", ["checkpoint", "root"])
def test_load_refuses_pickled_objects(saved, file, key, target):
    plant_payload(saved / file, key)
    with pytest.raises(ck.CheckpointError, match="refusing to load .*pickled Python objects") as err:
        ck.load(saved if target == "checkpoint" else saved.parent)
    assert str(saved / file) in str(err.value)
    assert UNPICKLED == []


# ---------------------------------------------------------------- broken checkpoints
def one_line(err):
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, UserError)
    return message


@pytest.mark.parametrize("damage, match", [
    (lambda p: (p / "meta.json").write_text("{not json"), "cannot read .*meta.json"),
    (lambda p: (p / "meta.json").write_text("[1, 2]"), "not a JSON object"),
    (lambda p: (p / "meta.json").write_text('{"format": 1}'), "format 1"),
    (lambda p: (p / "meta.json").unlink(), "incomplete: meta.json is missing"),
    (lambda p: (p / "rng.npz").unlink(), "incomplete: rng.npz is missing"),
    (lambda p: (p / "model.npz").write_bytes(b"PK\x03\x04 half a zip"), "cannot read .*model.npz"),
    (lambda p: (p / "optimizer.npz").write_bytes(b"garbage"), "not an npz archive"),
])
def test_a_broken_checkpoint_is_one_clear_error(saved, damage, match):
    damage(saved)
    with pytest.raises(ck.CheckpointError, match=match) as err:
        ck.load(saved)
    assert "checkpoint.resume=none" in one_line(err)


def test_a_missing_path_is_a_checkpoint_error(tmp_path):
    with pytest.raises(ck.CheckpointError, match="not found") as err:
        ck.load(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in one_line(err)
    with pytest.raises(ck.CheckpointError, match="no checkpoint in"):
        ck.load(tmp_path)


# ---------------------------------------------------------------- resolve_resume
def test_resolve_resume_none_and_auto(tmp_path, one_step):
    net, opt, _ = one_step
    assert ck.resolve_resume("none", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) is None            # nothing saved yet
    path = ck.save(tmp_path / "checkpoints", net, opt, meta(4))
    assert ck.resolve_resume("none", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) == path


def test_resolve_resume_paths(tmp_path, one_step):
    net, opt, _ = one_step
    first = ck.save(tmp_path / "run" / "checkpoints", net, opt, meta(1))
    second = ck.save(tmp_path / "run" / "checkpoints", net, opt, meta(2))
    other_run = tmp_path / "elsewhere"
    assert ck.resolve_resume(str(first), other_run) == first
    assert ck.resolve_resume(str(tmp_path / "run" / "checkpoints"), other_run) == second
    assert ck.resolve_resume(str(tmp_path / "run"), other_run) == second


@pytest.mark.parametrize("bad", ["missing", "empty", "file"])
def test_resolve_resume_bad_path(tmp_path, bad):
    target = tmp_path / bad
    if bad == "empty":
        target.mkdir()
    elif bad == "file":
        target.write_text("x")
    with pytest.raises(ck.CheckpointError, match="checkpoint.resume=") as err:
        ck.resolve_resume(str(target), tmp_path)
    assert str(target) in one_line(err)


# ---------------------------------------------------------------- check_compatible
def test_check_compatible_accepts_the_same_job(saved, one_step):
    net, _, _ = one_step
    ck.check_compatible(ck.load(saved), 1, "linear", net)


def test_check_compatible_world_size(saved):
    with pytest.raises(ck.CheckpointError, match="written by 1 ranks but this job has 3") as err:
        ck.check_compatible(ck.load(saved), 3, "linear")
    assert "dist.nprocs=1" in one_line(err) and str(saved) in str(err.value)


def test_check_compatible_model_name(saved):
    with pytest.raises(ck.CheckpointError, match="holds model 'linear' but the config builds 'lenet'"):
        ck.check_compatible(ck.load(saved), 1, "lenet")


def test_check_compatible_parameter_shapes_and_names(saved):
    with unique_name.guard(fresh_names()):
        wider = paddle.nn.Linear(3, 4)
        deeper = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.Linear(2, 2))
    with pytest.raises(ck.CheckpointError, match=r"weight \(3, 2\) vs \(3, 4\)"):
        ck.check_compatible(ck.load(saved), 1, "linear", wider)
    with pytest.raises(ck.CheckpointError, match="missing in the checkpoint: 0.bias") as err:
        ck.check_compatible(ck.load(saved), 1, "linear", deeper)
    assert "checkpoint.resume=none" in one_line(err)


# ---------------------------------------------------------------- weights into a model exactly
class Net(paddle.nn.Layer):
    """A user's own model."""

    def __init__(self, width=2, depth=1):
        super().__init__()
        self.fc = paddle.nn.Linear(3, width)
        self.more = paddle.nn.LayerList([paddle.nn.Linear(width, width) for _ in range(depth - 1)])

    def forward(self, x):
        return self.fc(x)


class Wrapped(paddle.nn.Layer):
    """The same model wrapped for training: every parameter name gains 'net.'."""

    def __init__(self, net):
        super().__init__()
        self.net = net


def sgd(net):
    return paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())


def weights(net):
    return {k: v.numpy().copy() for k, v in net.state_dict().items()}


def assert_bitwise(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


def saved_pdparams(net, file):
    paddle.save(net.state_dict(), str(file))
    return file


def test_restore_refuses_a_wrapped_models_checkpoint_naming_the_wrapper(tmp_path):
    outer = Wrapped(Net())
    path = ck.save(tmp_path, outer, sgd(outer), meta(1))
    plain = Net()
    before = weights(plain)
    with pytest.raises(ck.CheckpointError, match="not in the model: net.fc.bias, net.fc.weight") as err:
        ck.restore(ck.load(path), plain, rng=False)
    assert "with 'net.' in front" in one_line(err) and str(path) in str(err.value)
    assert_bitwise(weights(plain), before)


def test_restore_refuses_another_dtype_in_one_line(tmp_path):
    """(16-bit and float32 weights load into each other: a mixed-precision run's, exactly;
    test_an_o2_models_16_bit_weights_resume_from_the_float32_they_were_saved_as.)"""
    double = Net()
    double.to(dtype="float64")
    path = ck.save(tmp_path, double, sgd(double), meta(1))
    with pytest.raises(ck.CheckpointError, match=r"dtype \(checkpoint vs model\) of fc.bias float64 "
                                                 r"vs float32, fc.weight float64 vs float32") as err:
        ck.restore(ck.load(path), Net(), rng=False)     # Paddle's own: an AssertionError, midway
    one_line(err)


def test_set_state_dict_skips_a_wrapped_models_weights_with_a_warning_only(tmp_path):
    # Control, the user's report: Paddle loads nothing, warns, and the model stays untrained.
    file = saved_pdparams(Wrapped(Net()), tmp_path / "model.pdparams")
    plain = Net()
    before = weights(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        missing, unexpected = plain.set_state_dict(paddle.load(str(file)))
    assert sorted(missing) == ["fc.bias", "fc.weight"]
    assert sorted(unexpected) == ["net.fc.bias", "net.fc.weight"]
    assert any("Skip loading" in str(w.message) for w in caught)
    assert_bitwise(weights(plain), before)


def test_load_weights_refuses_a_wrapped_models_pdparams_naming_the_keys(tmp_path):
    file = saved_pdparams(Wrapped(Net()), tmp_path / "model.pdparams")
    plain = Net()
    before = weights(plain)
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(plain, file)
    message = one_line(err)
    assert message.startswith(f"{file} does not fit this model: ")
    assert "missing in the file: fc.bias, fc.weight; not in the model: net.fc.bias, net.fc.weight" in message
    assert "with 'net.' in front" in message and "use its 'net'" in message
    assert_bitwise(weights(plain), before)                     # nothing was loaded
    ck.load_weights(Wrapped(Net()), file)                       # the fix the message gives works


def test_load_weights_into_a_wrapper_points_at_its_sublayer(tmp_path):
    file = saved_pdparams(Net(), tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError, match="load into its sublayer 'net'") as err:
        ck.load_weights(Wrapped(Net()), file)
    assert "missing in the file: net.fc.bias, net.fc.weight" in one_line(err)


def test_load_weights_names_a_few_differences_and_how_many_more(tmp_path):
    file = saved_pdparams(Wrapped(Net(depth=4)), tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(Net(depth=4), file)
    assert ("not in the model: net.fc.bias, net.fc.weight, net.more.0.bias, net.more.0.weight "
            "and 4 more;") in one_line(err)


def test_load_weights_refuses_another_shape(tmp_path, saved):
    file = saved_pdparams(Net(width=2), tmp_path / "model.pdparams")
    wider = Net(width=4)
    before = weights(wider)
    with pytest.raises(ck.CheckpointError, match=r"shape \(file vs model\) of fc.bias \(2,\) vs \(4,\), "
                                                 r"fc.weight \(3, 2\) vs \(3, 4\)") as err:
        ck.load_weights(wider, file)
    assert "missing" not in one_line(err) and "not in the model" not in str(err.value)
    assert_bitwise(weights(wider), before)
    with unique_name.guard(fresh_names()):
        linear = paddle.nn.Linear(3, 4)
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint {saved} does not fit this model: "
                                                 r"shape \(checkpoint vs model\) of bias"):
        ck.load_weights(linear, saved.parent.parent)              # a run directory: its latest


def test_load_weights_refuses_another_dtype(tmp_path):
    double = Net()
    double.to(dtype="float64")
    file = saved_pdparams(double, tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError, match=r"dtype \(file vs model\) of fc.bias float64 vs float32"):
        ck.load_weights(Net(), file)


def test_load_weights_takes_a_mixed_precision_runs_16_bit_weights_exactly(tmp_path):
    half = Net()
    half.to(dtype="float16")
    file = saved_pdparams(half, tmp_path / "model.pdparams")
    net = Net()
    ck.load_weights(net, file)
    assert all(np.array_equal(net.state_dict()[k].numpy(), v.astype("float32").numpy())
               for k, v in half.state_dict().items())


def test_load_weights_of_an_exact_match_are_bitwise_equal(tmp_path, one_step):
    net, opt, _ = one_step
    trained_weights = weights(net)
    file = saved_pdparams(net, tmp_path / "model.pdparams")
    checkpoint = ck.save(tmp_path / "run" / "checkpoints", net, opt, meta(1))
    exported = ck.export_pdparams(checkpoint, tmp_path / "exported.pdparams")
    for given, loaded in [(file, file), (checkpoint, checkpoint), (tmp_path / "run", checkpoint),
                          (tmp_path / "run" / "checkpoints", checkpoint), (exported, exported),
                          (str(file), file)]:
        fresh, _, _ = new_model(seed=1)
        assert weights(fresh)["weight"].tobytes() != trained_weights["weight"].tobytes()
        assert ck.load_weights(fresh, given) == loaded
        assert_bitwise(weights(fresh), trained_weights)


def test_load_weights_keeps_buffers_exactly(tmp_path):
    net = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.BatchNorm1D(2))
    net[1]._mean.set_value(paddle.rand([2]))                      # running statistics, as trained
    net[1]._variance.set_value(paddle.rand([2]) + 1)
    file = saved_pdparams(net, tmp_path / "model.pdparams")
    fresh = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.BatchNorm1D(2))
    ck.load_weights(fresh, file)
    assert_bitwise(weights(fresh), weights(net))


def test_load_weights_reads_a_pdparams_without_unpickling_objects(tmp_path):
    file = tmp_path / "model.pdparams"
    with open(file, "wb") as f:
        pickle.dump({"fc.weight": Payload(), "fc.bias": np.zeros(2, np.float32)}, f, protocol=4)
    UNPICKLED.clear()
    paddle.load(str(file))                                      # control: Paddle's loader runs it
    assert UNPICKLED == ["payload ran"]
    UNPICKLED.clear()
    with pytest.raises(ck.CheckpointError, match="refusing to load .*_record_unpickling") as err:
        ck.load_weights(Net(), file)
    assert "could run code" in one_line(err)
    assert UNPICKLED == []


@pytest.mark.parametrize("content, match", [
    (b"", "is not a file paddle.save wrote"),
    (b"PK\x03\x04 a zip", "is not a file paddle.save wrote"),
    (b"\x80\x04 half a pickle", "cannot read .*paddle.save"),
    (pickle.dumps([np.zeros(2)], protocol=4), "holds a list, not a state dict"),
    (pickle.dumps({"fc.weight": np.zeros((3, 2), np.float32), "epoch": 3}, protocol=4),
     r"holds entries that are not weights \(epoch\)"),
])
def test_load_weights_refuses_a_file_that_is_not_a_state_dict(tmp_path, content, match):
    file = tmp_path / "model.pdparams"
    file.write_bytes(content)
    with pytest.raises(ck.CheckpointError, match=match) as err:
        ck.load_weights(Net(), file)
    assert str(file) in one_line(err)


def test_load_weights_of_a_missing_path_says_what_it_takes(tmp_path):
    with pytest.raises(ck.CheckpointError, match="not found; give a .pdparams file, a checkpoint") as err:
        ck.load_weights(Net(), tmp_path / "nowhere")
    one_line(err)
    with pytest.raises(ck.CheckpointError, match="no checkpoint in"):
        ck.load_weights(Net(), tmp_path)


# ---------------------------------------------------------------- config_hash
CONFIG = {"data": {"name": "mnist"}, "model": {"name": "lenet"},
          "train": {"lr": 0.001, "epochs": 5, "max_steps": 0, "log_every": 20, "seed": 2024},
          "dist": {"nprocs": 2, "max_restarts": 0},
          "checkpoint": {"every_epochs": 1, "keep_last": 3, "resume": "auto"},
          "output": {"root": "runs", "run_dir": ""}, "faults": {"inject": ""}}


def changed(dotted, value):
    cfg = json.loads(json.dumps(CONFIG))
    section, key = dotted.split(".")
    cfg[section][key] = value
    return cfg


def test_config_hash_is_16_hex_digits_and_stable():
    digest = config_hash(CONFIG)
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert config_hash(json.loads(json.dumps(CONFIG, sort_keys=True))) == digest


@pytest.mark.parametrize("dotted, value", [
    ("train.epochs", 50), ("train.max_steps", 7), ("train.log_every", 1), ("dist.max_restarts", 3),
    ("checkpoint.resume", "none"), ("checkpoint.keep_last", 9), ("output.run_dir", "/x"),
    ("faults.inject", "raise:1:5"), ("dist.nprocs", 3)])
def test_config_hash_ignores_what_a_resume_may_change(dotted, value):
    assert config_hash(changed(dotted, value)) == config_hash(CONFIG)


@pytest.mark.parametrize("dotted, value", [
    ("train.lr", 0.01), ("train.seed", 1), ("model.name", "mlp"), ("data.name", "cifar10")])
def test_config_hash_sees_what_changes_training(dotted, value):
    assert config_hash(changed(dotted, value)) != config_hash(CONFIG)


def test_config_hash_leaves_its_input_alone():
    cfg = json.loads(json.dumps(CONFIG))
    config_hash(cfg)
    assert cfg == CONFIG


# ---------------------------------------------------------------- export and command line
def test_export_gives_weights_plain_paddle_loads(saved, tmp_path, one_step):
    net, _, _ = one_step
    out = ck.export_pdparams(saved, tmp_path / "out" / "model.pdparams")
    loaded = paddle.load(str(out))
    assert sorted(loaded) == sorted(net.state_dict())
    for key, value in net.state_dict().items():
        np.testing.assert_array_equal(np.asarray(loaded[key]), value.numpy(), err_msg=key)


def test_cli_show_and_export(saved, tmp_path):
    shown = run(["-m", "paddle_dist.checkpoint", "show", str(saved.parent)], timeout=180)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == meta(1)
    out = tmp_path / "exported.pdparams"
    exported = run(["-m", "paddle_dist.checkpoint", "export", str(saved), str(out)], timeout=180)
    assert exported.returncode == 0, exported.stderr
    loaded = paddle.load(str(out))
    np.testing.assert_array_equal(np.asarray(loaded["weight"]), ck.load(saved).model["weight"])
    fresh, _, _ = new_model(seed=1)
    ck.load_weights(fresh, out)
    assert_bitwise(weights(fresh), ck.load(saved).model)


def test_cli_bad_path_is_one_line_and_exit_2(tmp_path):
    result = run(["-m", "paddle_dist.checkpoint", "show", str(tmp_path / "nowhere")], timeout=180)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found" in lines[0] and str(tmp_path / "nowhere") in lines[0]
    assert result.stdout == ""


def test_cli_export_of_a_wrapped_models_checkpoint_is_refused_in_one_line(tmp_path):
    # A fit() run of a built-in LeNet wrapped in a Layer of the user's: every name is 'net.'...
    outer = Wrapped(models.build("lenet", 10))
    checkpoint = ck.save(tmp_path / "checkpoints", outer, sgd(outer), dict(meta(1), model="lenet"))
    config = str(Path(__file__).resolve().parents[3] / "configs" / "mnist_lenet.yaml")
    result = run(["-m", "paddle_dist.export", str(checkpoint), "-c", config, "--out", str(tmp_path / "out")],
                 timeout=180)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"checkpoint {checkpoint} does not fit this model: missing in the checkpoint: " in lines[0]
    assert "and 6 more; not in the model: net." in lines[0] and "with 'net.' in front" in lines[0]
    assert result.stdout == "" and not (tmp_path / "out").exists()


class FakeGenerator:
    """A GPU generator's state as Paddle pickles it: (device, seed, offset, engine)."""

    def __init__(self, device=0, seed=0, offset=0):
        self.parts = (device, seed, offset, [])

    def __getstate__(self):
        return self.parts

    def __setstate__(self, parts):
        self.parts = tuple(parts)


class FakeGpuProcess:
    """paddle's generators as a process on `gpus` visible GPUs sees them, running on `own`."""

    def __init__(self, monkeypatch, gpus: int, own: str, offsets=None):
        self.states = [FakeGenerator(i, 7, (offsets or {}).get(i, 0)) for i in range(gpus)] or \
            [FakeGenerator(-1, 7, 0)]
        monkeypatch.setattr(paddle, "get_rng_state", lambda: list(self.states))
        monkeypatch.setattr(paddle, "set_rng_state", lambda states: setattr(self, "states", list(states)))
        monkeypatch.setattr(paddle.device, "get_device", lambda: own)
        monkeypatch.setattr(paddle.base.core, "GeneratorState", FakeGenerator)
        monkeypatch.setattr(compat, "engine_saved", lambda: True)

    def offsets(self):
        return [s.parts[2] for s in self.states]


def test_each_rank_resumes_its_own_gpus_generator_whatever_the_gpus_it_sees(monkeypatch):
    # rank 0 ran on gpu:0, whose generator dropout advanced; rank 0's copy of gpu:1's never moved
    FakeGpuProcess(monkeypatch, 2, "gpu:0", offsets={0: 40})
    arrays, info = ck.capture_rng()
    assert info["paddle"] == [[0, 7, 40]]          # its own generator only
    rank1 = FakeGpuProcess(monkeypatch, 2, "gpu:1")
    ck.apply_rng(arrays, info)
    assert rank1.offsets() == [0, 40]               # gpu:1's generator goes on from 40
    elsewhere = FakeGpuProcess(monkeypatch, 4, "gpu:3")   # a machine showing 4 GPUs
    ck.apply_rng(arrays, info)
    assert elsewhere.offsets() == [0, 0, 0, 40]
    FakeGpuProcess(monkeypatch, 0, "cpu")             # no GPU: nowhere to put it, in one line
    with pytest.raises(ck.CheckpointError, match=r"holds a GPU's generator.*\(on cpu\).*--eval-only.*rng=False"):
        ck.apply_rng(arrays, info)


def test_a_checkpoint_with_a_state_per_visible_gpu_goes_back_position_by_position(monkeypatch):
    FakeGpuProcess(monkeypatch, 2, "gpu:0", offsets={0: 40, 1: 3})
    arrays = {"python": np.asarray(random.getstate()[1], dtype=np.int64),
              "numpy": np.random.get_state()[1], "paddle_0": np.zeros(0, np.int64),
              "paddle_1": np.zeros(0, np.int64)}
    _, info = ck.capture_rng()
    info["paddle"] = [[0, 7, 40], [1, 7, 3]]         # as written before: every generator
    rank1 = FakeGpuProcess(monkeypatch, 2, "gpu:1")
    ck.apply_rng(arrays, info)
    assert rank1.offsets() == [40, 3]
    FakeGpuProcess(monkeypatch, 4, "gpu:1")
    with pytest.raises(ck.CheckpointError, match="holds 2 Paddle generator states, one per GPU"):
        ck.apply_rng(arrays, info)


def test_an_o2_models_16_bit_weights_resume_from_the_float32_they_were_saved_as(tmp_path):
    """O2 keeps bfloat16 weights and saves them as float32 (amp.decorate's save_dtype):
    resuming puts the very same 16-bit values back."""
    from paddle_dist.checkpoint.weights import put_weights

    trained = models.build("mlp")
    trained.to(dtype="bfloat16")
    as_saved = {k: v.astype("float32").numpy() for k, v in trained.state_dict().items()}
    resumed = models.build("mlp")
    resumed.to(dtype="bfloat16")
    put_weights(as_saved, resumed, "checkpoint x", "checkpoint")
    for k, v in resumed.state_dict().items():
        assert v.dtype == paddle.bfloat16
        assert np.array_equal(v.astype("float32").numpy(), as_saved[k])
    # a dtype that is not a float width of the model's is still refused
    with pytest.raises(ck.CheckpointError, match="dtype"):
        put_weights({k: v.astype(np.int32) for k, v in as_saved.items()}, resumed, "checkpoint x", "checkpoint")


def test_o2_decorates_with_float32_saving(monkeypatch):
    from paddle_dist.trainer import amp

    calls = []
    monkeypatch.setattr(paddle.amp, "decorate", lambda **kwargs: calls.append(kwargs) or ("net", "opt"))
    amp.decorate("net", "opt", amp.AmpPlan("O2", "bfloat16"))
    assert calls[0]["save_dtype"] == "float32" and calls[0]["level"] == "O2"
