"""Mixed precision planning and plumbing. Paddle casts only on GPUs, so the GPU choices
are checked through the plan and with Paddle's autocast recorded; the loss-scaling path
itself runs on 2 real ranks in tests/integration/test_sync_options.py."""

import contextlib
import json
import warnings

import numpy as np
import paddle
import pytest

from paddle_dist.trainer import amp
from paddle_dist import config
from paddle_dist.errors import DeviceError
from paddle_dist.trainer import engine


def plan(device, *overrides, bf16=True, fp16=True):
    return amp.plan(config.load(overrides=list(overrides)).train, device,
                    bf16_supported=lambda: bf16, fp16_supported=lambda: fp16)


def test_off_is_plain_float32_everywhere():
    assert plan("cpu") == amp.AmpPlan() and not plan("gpu:0").enabled


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_cpu_is_refused_with_the_fix(level):
    with pytest.raises(DeviceError, match=f"train.amp={level} needs a GPU.*use train.amp=off"):
        plan("cpu", f"train.amp={level}")


def test_gpu_defaults_to_float16_with_dynamic_loss_scaling():
    assert plan("gpu:0", "train.amp=O1") == amp.AmpPlan("O1", "float16", 32768.0)
    assert plan("gpu:1", "train.amp=O2", "train.loss_scale=1024").loss_scale == 1024.0


def test_float16_below_compute_capability_7_is_refused_not_silently_float32():
    with pytest.raises(DeviceError, match="compute capability 7.0 .*use train.amp=off"):
        plan("gpu:0", "train.amp=O1", fp16=False)
    assert plan("gpu:0", "train.amp=O1", "train.amp_dtype=bfloat16", fp16=False).dtype == "bfloat16"


def test_bfloat16_runs_unscaled_where_supported():
    assert plan("gpu:0", "train.amp=O2", "train.amp_dtype=bfloat16") == amp.AmpPlan("O2", "bfloat16", 0.0)
    with pytest.raises(DeviceError, match="compute capability 8.0"):
        plan("gpu:0", "train.amp=O1", "train.amp_dtype=bfloat16", bf16=False)


def test_a_scaler_only_when_the_loss_is_scaled():
    assert amp.scaler(amp.AmpPlan("O1", "bfloat16", 0.0), sync=None) is None
    scaler = amp.scaler(amp.AmpPlan("O1", "float16", 64.0), sync="the sync")
    assert isinstance(scaler, paddle.amp.GradScaler) and scaler.sync == "the sync"


@pytest.fixture
def casts(monkeypatch):
    """Record every paddle.amp.auto_cast entered (Paddle's own does nothing on CPU)."""
    seen = []

    @contextlib.contextmanager
    def auto_cast(enable=True, level="O1", dtype="float16"):
        seen.append(("enter", level, dtype))
        yield
        seen.append(("exit", level, dtype))

    monkeypatch.setattr(paddle.amp, "auto_cast", auto_cast)
    return seen


def test_forward_hooks_run_the_network_under_the_plans_autocast(casts):
    net = paddle.nn.Linear(3, 2)
    amp.install_autocast(net, amp.AmpPlan("O2", "bfloat16"))
    net(paddle.ones([1, 3]))
    assert casts == [("enter", "O2", "bfloat16"), ("exit", "O2", "bfloat16")]


def test_loop_step_casts_scales_and_steps_through_the_scaler(casts):
    net = paddle.nn.Linear(3, 2)
    optimizer = paddle.optimizer.SGD(0.1, parameters=net.parameters())
    calls = []

    class Scaler:
        def scale(self, loss):
            calls.append("scale")
            return loss

        def step(self, opt):
            calls.append("step")
            opt.step()

        def update(self):
            calls.append("update")

    batch = ([paddle.ones([2, 3])], [paddle.zeros([2, 2])])     # (inputs, labels)
    engine.step(net, paddle.nn.MSELoss(), [batch, batch], optimizer,
              amp.AmpPlan("O1", "float16", 8.0), Scaler())
    assert calls == ["scale", "scale", "step", "update"]       # 2 micro-batches, 1 step
    assert [c for c in casts if c[0] == "enter"] == [("enter", "O1", "float16")] * 2


def test_synced_scaler_averages_before_unscaling():
    order = []

    class Sync:
        def average_now(self, optimizer):
            order.append("average")

    scaler = amp.scaler(amp.AmpPlan("O1", "float16", 8.0), Sync())
    scaler._unscale(paddle.optimizer.SGD(0.1, parameters=paddle.nn.Linear(2, 2).parameters()))
    assert order == ["average"]


class GpuScaler:
    """paddle.amp.GradScaler's state_dict()/load_state_dict() as it behaves on a GPU (on a
    CPU place Paddle leaves the scaler disabled, and both do nothing)."""

    def __init__(self, init: float):
        self.state = {"scale": np.array([init], dtype=np.float32), "incr_ratio": 2.0, "decr_ratio": 0.5,
                      "incr_every_n_steps": 1000, "decr_every_n_nan_or_inf": 2, "incr_count": 0,
                      "decr_count": 0, "use_dynamic_loss_scaling": True}

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


def test_the_loss_scalers_scale_and_counters_survive_a_checkpoint_as_json():
    ran = GpuScaler(1024.0)
    ran.state.update(scale=np.array([8192.0], dtype=np.float32), incr_count=7, decr_count=1)   # mid-run
    saved = json.loads(json.dumps(amp.scaler_state(ran)))     # meta.json
    assert saved == {"scale": 8192.0, "incr_count": 7, "decr_count": 1}
    resumed = GpuScaler(1024.0)                               # built from train.loss_scale
    amp.load_scaler_state(resumed, saved)
    got, want = resumed.state_dict(), ran.state_dict()
    assert np.array_equal(got.pop("scale"), want.pop("scale")) and got == want
    # the scaler Paddle builds on a CPU is disabled: nothing to save or restore
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        off = paddle.amp.GradScaler(init_loss_scaling=1024.0)
    assert amp.scaler_state(off) == {} and amp.load_scaler_state(off, saved) is None
