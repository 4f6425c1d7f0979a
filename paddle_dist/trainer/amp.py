"""Mixed precision (`train.amp: off | O1 | O2`, `train.amp_dtype`, `train.loss_scale`) for
both API levels.

O1 runs each op in the 16-bit dtype where Paddle's lists allow it (`paddle.amp.auto_cast`);
O2 also keeps the weights in 16 bits with a float32 master copy in the optimizer
(`paddle.amp.decorate`). float16 needs loss scaling (dynamic, from `train.loss_scale`);
bfloat16 has float32's range and runs unscaled.

Where it runs: Paddle 3.3 casts only on CUDA, XPU and custom devices. On CPU its
`auto_cast` and `GradScaler` warn and do nothing, and CPU kernels such as conv2d have no
bfloat16 version, so `train.amp` on CPU is refused with a message instead of silently
training in float32.

Gradients with loss scaling: the scaler checks the gradients for inf/nan before the
optimizer steps, but paddle_dist averages them inside the optimizer step (sync.GradSync).
Checked before averaging, one rank could skip a step another takes; `SyncedScaler`
averages first, so every rank sees the same gradients and makes the same decision.
On an overflow it updates the scale by Paddle's rule, but says so in one log line
instead of Paddle's message, whose `float()` of the one-element scale numpy 2.4 refuses:
on Paddle 3.x with numpy 2.4 the first skipped step would end the run with a TypeError
(found under tests/gpu_standin.py, which enables the scaler on a CPU).

Example:
    plan = amp.plan(cfg.train, env.device)               # AmpPlan(level="O1", dtype="float16", ...)
    net, opt = amp.decorate(net, opt, plan)              # O2 only
    with amp.autocast(plan):
        loss = loss_fn(model(x), y)
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Callable

from .. import compat
from ..errors import DeviceError

# Paddle is imported where it is used: plan() also runs in the launcher, before any rank
# starts, and the launcher does not import paddle (about a second of start-up).


@dataclass(frozen=True)
class AmpPlan:
    level: str = "O0"                  # O0 (off) | O1 | O2
    dtype: str = "float32"
    loss_scale: float = 0.0            # > 0: dynamic loss scaling from this value

    @property
    def enabled(self) -> bool:
        return self.level != "O0"


def plan(train, device: str, bf16_supported: Callable[[], bool] = None,
         fp16_supported: Callable[[], bool] = None) -> AmpPlan:
    """What `train.amp*` means on `device` ("cpu", "gpu:0", ...); DeviceError where it
    cannot run. `bf16_supported` / `fp16_supported`: whether this GPU has the dtype
    (default: ask Paddle / CUDA, in the rank that uses the GPU)."""
    if train.amp == "off":
        return AmpPlan()
    if not device.startswith(("gpu", "xpu")):
        raise DeviceError(f"train.amp={train.amp} needs a GPU: Paddle runs mixed precision only "
                          f"on CUDA/XPU devices (on {device} it would silently train in float32); "
                          "use train.amp=off on CPU")
    dtype = "float16" if train.amp_dtype == "auto" else train.amp_dtype
    supported = bf16_supported or _bf16_supported
    if dtype == "bfloat16" and not supported():
        raise DeviceError("train.amp_dtype=bfloat16 needs a GPU with bfloat16 support (CUDA "
                          "compute capability 8.0+, e.g. A100); use train.amp_dtype=float16")
    if dtype == "float16" and device.startswith("gpu") and not (fp16_supported or _fp16_supported)():
        raise DeviceError("train.amp_dtype=float16 needs a GPU of CUDA compute capability 7.0 or more: "
                          "on older ones Paddle's autocast turns itself off and would train in float32 "
                          "with a loss scaler on; use train.amp=off")
    return AmpPlan(train.amp, dtype, train.loss_scale if dtype == "float16" else 0.0)


def _fp16_supported() -> bool:
    """Paddle's own rule for its float16 autocast on CUDA (amp/auto_cast.py): compute
    capability 7.0+, or a ROCm build."""
    import paddle

    return paddle.device.cuda.get_device_capability()[0] >= 7 or paddle.is_compiled_with_rocm()


def _bf16_supported() -> bool:
    import paddle

    return bool(paddle.amp.is_bfloat16_supported())


def decorate(net, optimizer, p: AmpPlan):
    """O2: 16-bit weights with float32 master weights in the optimizer, saved as float32;
    otherwise unchanged."""
    if p.level != "O2":
        return net, optimizer
    import paddle

    # save_dtype: state_dict() gives float32, so checkpoints and exports load into a float32
    # model (put_weights casts them back to 16 bits on resume, exactly).
    return paddle.amp.decorate(models=net, optimizers=optimizer, level="O2", dtype=p.dtype,
                               master_weight=True, save_dtype="float32")


def autocast(p: AmpPlan):
    """The forward pass's context: Paddle's auto_cast for the plan, or nothing."""
    if not p.enabled:
        return contextlib.nullcontext()
    import paddle

    return paddle.amp.auto_cast(enable=True, level=p.level, dtype=p.dtype)


def install_autocast(net, p: AmpPlan) -> None:
    """Run `net`'s forward under autocast whoever calls it (paddle.Model calls it itself,
    and its own autocast knows float16 only)."""
    if not p.enabled:
        return
    active = []

    def enter(layer, inputs):
        context = autocast(p)
        context.__enter__()
        active.append(context)

    def leave(layer, inputs, outputs):
        active.pop().__exit__(None, None, None)

    net.register_forward_pre_hook(enter)
    net.register_forward_post_hook(leave)


def scaler(p: AmpPlan, sync):
    """A SyncedScaler when the plan scales the loss, else None."""
    return synced_scaler_class()(sync, p.loss_scale) if p.loss_scale > 0 else None


def scaler_state(scaler) -> dict:
    """The loss scaler's state for a checkpoint's meta.json: its scale and counters, JSON
    numbers ({} for a scaler Paddle left disabled: CPU)."""
    state = scaler.state_dict()
    if not state:
        return {}
    return {"scale": float(state["scale"].reshape([-1])[0]), "incr_count": int(state["incr_count"]),
            "decr_count": int(state["decr_count"])}


def load_scaler_state(scaler, saved: dict) -> None:
    """Put back `scaler_state`'s scale and counters; the rest (ratios, intervals) comes from
    the config, as in the run that saved them."""
    state = scaler.state_dict()
    if not state or not saved:
        return
    import numpy as np

    state.update(scale=np.array([saved["scale"]], dtype=np.float32), incr_count=int(saved["incr_count"]),
                 decr_count=int(saved["decr_count"]))
    scaler.load_state_dict(state)


def synced_scaler_class():
    """SyncedScaler: paddle.amp.GradScaler whose inf/nan check sees the averaged
    gradients, because it has `sync` (a GradSync) average them first (see above)."""
    import paddle

    class SyncedScaler(paddle.amp.GradScaler):
        def __init__(self, sync, init_loss_scaling: float):
            super().__init__(init_loss_scaling=init_loss_scaling)
            self.sync, self.skipped = sync, 0

        def _unscale(self, optimizer):
            self.sync.average_now(optimizer)
            return super()._unscale(optimizer)

        def _update(self):
            """Paddle's rule (dynamic scaling: halve after decr_every_n_nan_or_inf
            overflows, double after incr_every_n_steps clean steps), with a line of ours."""
            if not self._enable:
                return
            if not compat.scaler_found_inf(self):
                self._decr_count, self._incr_count = 0, self._incr_count + 1
                if self._incr_count == self._incr_every_n_steps:
                    self._scale, self._incr_count = self._scale * self._incr_ratio, 0
                return
            self.skipped += 1
            self._incr_count, self._decr_count = 0, self._decr_count + 1
            before = float(self._scale.reshape([-1])[0])
            if self._decr_count == self._decr_every_n_nan_or_inf:
                self._scale, self._decr_count = self._scale * self._decr_ratio, 0
            logging.getLogger("paddle_dist").warning(
                f"paddle_dist: inf/nan in the averaged gradients: the step is skipped on every rank "
                f"(overflow {self.skipped}); loss scale {before:g} -> {float(self._scale.reshape([-1])[0]):g}")

    return SyncedScaler
