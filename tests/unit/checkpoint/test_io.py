"""Unit tests for paddle_dist.checkpoint.io: the full training state in npz + JSON, written
atomically (also from a background thread), pruned, validated, never unpickled. The models,
states and checks defined here serve the package's other test files too."""

import threading

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from paddle_dist import checkpoint as ck
from paddle_dist.errors import UserError
from paddle_dist.runs.layout import Run

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


@pytest.fixture
def one_step():
    return trained(steps=1)


@pytest.fixture
def saved(tmp_path, one_step):
    net, opt, _ = one_step
    return ck.save(Run(tmp_path).checkpoints, net, opt, meta(1))


# ---------------------------------------------------------------- layout
def test_save_writes_the_checkpoint_layout(tmp_path, one_step):
    net, opt, _ = one_step
    path = ck.save(tmp_path / "checkpoints", net, opt, meta(7))
    assert path == tmp_path / "checkpoints" / "ckpt_000000007"
    assert sorted(p.name for p in path.iterdir()) == FILES
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "ckpt_000000007"
    assert ck.latest(tmp_path / "checkpoints") == path
    assert sorted(p.name for p in Run(tmp_path).checkpoints.iterdir()) == ["ckpt_000000007", "latest"]


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


def test_load_keeps_dtypes_and_shapes(saved, one_step):
    net, _, _ = one_step
    state = ck.load(saved)
    for key, value in net.state_dict().items():
        assert state.model[key].shape == tuple(value.shape)
        assert state.model[key].dtype == np.float32


def test_load_accepts_a_checkpoint_its_root_or_the_run_dir(tmp_path, one_step):
    net, opt, names = one_step
    first = ck.save(Run(tmp_path).checkpoints, net, opt, meta(1))
    train_step(net, opt, names)
    ck.save(Run(tmp_path).checkpoints, net, opt, meta(2))
    assert ck.load(Run(tmp_path).checkpoints).meta["global_step"] == 2   # follows `latest`
    assert ck.load(tmp_path).meta["global_step"] == 2
    state = ck.load(first)
    assert state.meta["global_step"] == 1 and state.path == first


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


def test_async_saver_says_each_checkpoints_size_and_write_time_from_the_writer(tmp_path, one_step):
    net, opt, _ = one_step
    said = []
    saver = ck.AsyncSaver(on_written=lambda written: said.append((written, threading.current_thread())))
    saver.submit(tmp_path, ck.snapshot(net, opt, meta(7)), keep_last=2)
    path = saver.wait()
    (written, thread), = said
    assert thread is not threading.current_thread() and written.path == path and written.step == 7
    assert written.size == sum(f.stat().st_size for f in path.iterdir()) and written.seconds > 0
    assert written.line() == f"checkpoint for step 7 written: {written.size / 1e6:,.1f} MB in {written.seconds:.2f} s"


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


# ---------------------------------------------------------------- export and command line
def test_export_gives_weights_plain_paddle_loads(saved, tmp_path, one_step):
    net, _, _ = one_step
    out = ck.export_pdparams(saved, tmp_path / "out" / "model.pdparams")
    loaded = paddle.load(str(out))
    assert sorted(loaded) == sorted(net.state_dict())
    for key, value in net.state_dict().items():
        np.testing.assert_array_equal(np.asarray(loaded[key]), value.numpy(), err_msg=key)


def test_o2_decorates_with_float32_saving(monkeypatch):
    from paddle_dist.trainer import amp

    calls = []
    monkeypatch.setattr(paddle.amp, "decorate", lambda **kwargs: calls.append(kwargs) or ("net", "opt"))
    amp.decorate("net", "opt", amp.AmpPlan("O2", "bfloat16"))
    assert calls[0]["save_dtype"] == "float32" and calls[0]["level"] == "O2"
