"""Unit tests for paddle_dist.checkpoint.format: what a checkpoint holds, its meta record's checks and
the random generators' state (every rank's own GPU generator)."""

import json
import random

import numpy as np
import paddle
import pytest

from paddle_dist import checkpoint as ck
from paddle_dist import compat

from tests.unit.checkpoint.test_io import meta
from tests.unit.checkpoint.test_io import one_step  # noqa: F401  (fixtures)


def draws():
    """One number from each generator a training step may use."""
    return random.random(), float(np.random.rand()), paddle.rand([3]).numpy().tolist()


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
