"""On a CPU, what Paddle does only on a GPU where that changes paddle_dist's behaviour, so
that paddle_dist's GPU paths run in CPU tests: `paddle.amp.decorate` at O2, an enabled
`GradScaler`, 16-bit outputs, and (nothing to do) `dataparallel`'s all-reduce inside
`backward()`.

On a CPU Paddle's `decorate` returns the model and optimizer untouched, `GradScaler`
turns itself off, and `amp.plan` refuses mixed precision, so without this no test ever
saw an O2 model or a loss scaler at work. What it reproduces, with Paddle's own pieces:

- `decorate(level="O2", dtype="bfloat16", master_weight=True, save_dtype="float32")` runs
  the body of Paddle's `amp_decorate` past its device check: `amp_initialize` casts every
  layer's floating parameters and buffers in place to bfloat16, except the layers Paddle
  keeps in float32 (`need_keep_fp32`: BatchNorm*, SyncBatchNorm);
  `_set_multi_precision(optimizer, True)` makes float32 master weights at the first step,
  kept in the optimizer's state_dict as `master_weights`; `StateDictHook(save_dtype)` on
  every sublayer: `state_dict()` hands out float32 copies, `state_dict(use_hook=False)`
  the real tensors.
- The decorated model's outputs are bfloat16 tensors, as an O2 model's last layer hands
  them out on a GPU; their `.numpy()` gives uint16 bits, on a CPU as on a GPU (Paddle's
  own behaviour, nothing to reproduce), and a CPU has no bfloat16 cross-entropy kernel,
  as Paddle 2.6's GPUs have none.
- `GradScaler` (also paddle.Model's and paddle_dist's SyncedScaler, which subclass it) is
  enabled: it is built as on a GPU place, and its scale, unscale and inf/nan check, skipped
  steps and state_dict run through Paddle's own CPU kernels (`check_finite_and_unscale`,
  `update_loss_scaling`).
- `amp.plan` accepts train.amp=O1 (float16 with loss scaling, or bfloat16) and O2 in
  bfloat16, as on a GPU that has both dtypes.
- `dataparallel`: on a CPU too, paddle.DataParallel's reducer all-reduces (over gloo)
  inside `backward()`, unmarked; nothing to reproduce.

What it does not reproduce, and why:
- 16-bit arithmetic. Paddle 3.3.1's CPU kernels have no bfloat16 or float16 version of
  conv2d, matmul, add, relu, mean, pool2d, batch_norm (measured 2026-11-28; cast, concat,
  split, divide by a scalar and gloo's all_reduce have one), so no forward could
  run. Instead each layer that owns parameters computes in float32 from its 16-bit
  weights (an exact widening), with its floating inputs and outputs rounded to bfloat16
  values, as the 16-bit ops under autocast would hand them on; the tensors between layers
  stay float32 by dtype, and functional ops between layers run in float32. The numbers
  therefore are not a GPU's; the state (dtypes, hooks, master weights, what state_dict
  returns, the scaler's) is. `auto_cast` is replaced by a context that switches this on;
  a decorated model whose forward runs outside it raises, as conv2d's dtype check does
  on a GPU. O1 computes in float32 (Paddle's own auto_cast, which on a CPU changes
  nothing but the dtype the scaler reads). Rounding: a GPU's cast to bfloat16 rounds to
  nearest; Paddle 2.6's CPU cast truncates. The layers' inputs and outputs are rounded
  to nearest on every version, but the weights are cast by Paddle's own CPU kernels
  (decorate's, SGD's from the master weights), so on 2.6 they are truncated.
- Optimizers: only SGD has a bfloat16 CPU kernel (Adam, AdamW, Momentum have none), so
  O2 tests use SGD. Its CPU kernel updates the 16-bit weights directly and leaves the
  master weights as they were made (measured on 3.3.1: after 32 steps they still equal the
  initial weights): their dtype, their place in the optimizer's state_dict and their round
  trip through a checkpoint are a GPU's; their values are not, so tests compare the
  model's own weights, not the master weights' values.
- float16 O2: no CPU kernel at all (not even sgd); refused. `master_grad` and
  `excluded_layers` are not supported.

Use, in a test process before paddle_dist builds anything (the config then says e.g.
train.amp=O2 and train.amp_dtype=bfloat16, by the launcher's -o):
    from tests import gpu_standin
    gpu_standin.install()   # paddle.amp.decorate / auto_cast / GradScaler, paddle_dist's amp.plan
or, for every Python process a command starts (the launcher, its ranks, doctor --test's
ranks), `gpu_standin.environ()`'s PYTHONPATH: its sitecustomize installs the stand-in
when paddle_dist's trainer/amp.py is first imported.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import paddle

DTYPE = "bfloat16"
_active = threading.local()       # how many stand-in autocasts are open on this thread


def _open() -> int:
    return getattr(_active, "depth", 0)


def decorate(models, optimizers=None, level="O1", dtype="float16", master_weight=None,
             save_dtype=None, master_grad=False, excluded_layers=None):
    """`paddle.amp.decorate` as on a GPU (see the module's docstring); level O1 and
    anything else than one Layer are passed to Paddle's own."""
    if level != "O2" or not isinstance(models, paddle.nn.Layer):
        extra = {k: v for k, v in (("master_grad", master_grad), ("excluded_layers", excluded_layers)) if v}
        return _ORIGINAL["decorate"](models=models, optimizers=optimizers, level=level, dtype=dtype,
                                     master_weight=master_weight, save_dtype=save_dtype, **extra)
    if dtype != DTYPE or master_grad or excluded_layers is not None:
        raise NotImplementedError(f"the O2 stand-in runs dtype={DTYPE} only, without master_grad "
                                  "and excluded_layers")
    amp = importlib.import_module("paddle.amp.auto_cast")     # the module, not the function
    amp.check_models([models])
    amp.amp_initialize(models=[models], dtype=dtype, excluded_layers=None)
    if optimizers is not None:
        amp.check_optimizers([optimizers])
        amp._set_multi_precision(optimizers, master_weight is not False)
    if save_dtype is not None:
        for layer in models.sublayers(include_self=True):
            layer.register_state_dict_hook(amp.StateDictHook(save_dtype))
    for layer in models.sublayers(include_self=True):
        if any(p is not None for p in layer._parameters.values()):
            _emulate(layer)
    models.register_forward_post_hook(lambda module, inputs, outputs: _sixteen_bit(outputs))
    return models if optimizers is None else (models, optimizers)


def _emulate(layer) -> None:
    """Forward hooks: the layer's 16-bit parameters seen as float32 while it runs, its
    floating inputs and outputs rounded to 16-bit values."""
    real = {name: p for name, p in layer._parameters.items()
            if p is not None and p.dtype in (paddle.bfloat16, paddle.float16)}

    def before(module, inputs):
        for name, p in real.items():      # gradients flow back through the cast
            module._parameters[name] = p.astype("float32")
        return _rounded(inputs)

    def after(module, inputs, outputs):
        module._parameters.update(real)   # the real parameters again, before anything else
        if real and not _open():
            raise RuntimeError(f"{type(module).__name__}'s forward ran outside auto_cast: its weights "
                               f"are {DTYPE} (O2) and its input float32, which a GPU kernel refuses")
        return _rounded(outputs)

    layer.register_forward_pre_hook(before)
    layer.register_forward_post_hook(after)


def _rounded(value: Any) -> Any:
    if isinstance(value, paddle.Tensor):
        return _nearest(value) if value.dtype == paddle.float32 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rounded(v) for v in value)
    return value


def _nearest(x):
    """float32 `x` rounded to the nearest bfloat16 values (ties to even), as a GPU's cast
    rounds; gradients pass through as the cast's do. Paddle 2.6's CPU cast truncates
    (compat.cpu_bf16_cast_rounds), so there the rounding is numpy's."""
    from paddle_dist import compat

    if compat.cpu_bf16_cast_rounds():
        return x.astype(DTYPE).astype("float32")
    bits = x.numpy().view(np.uint32)
    nearest = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16) << 16
    return x + (paddle.to_tensor(nearest.astype(np.uint32).view(np.float32)) - x).detach()


def _sixteen_bit(value: Any) -> Any:
    """The model's float32 outputs as bfloat16 tensors (their values are bfloat16's already)."""
    if isinstance(value, paddle.Tensor):
        return value.astype(DTYPE) if value.dtype == paddle.float32 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_sixteen_bit(v) for v in value)
    if isinstance(value, dict):
        return {k: _sixteen_bit(v) for k, v in value.items()}
    return value


@contextlib.contextmanager
def _emulated_autocast():
    _active.depth = _open() + 1
    try:
        yield
    finally:
        _active.depth = _open() - 1


def auto_cast(enable=True, custom_white_list=None, custom_black_list=None, level="O1",
              dtype="float16", use_promote=True):
    """`paddle.amp.auto_cast`: for bfloat16 O2, the context the stand-in's layers compute
    in (see the module's docstring); otherwise Paddle's own (which on a CPU does nothing)."""
    if enable and level == "O2" and dtype == DTYPE:
        return _emulated_autocast()
    extra = {} if use_promote else {"use_promote": use_promote}     # keywords: 2.6 to 3.3
    return _ORIGINAL["auto_cast"](enable=enable, custom_white_list=custom_white_list,
                                  custom_black_list=custom_black_list, level=level, dtype=dtype, **extra)


def plan(train, device: str, bf16_supported=None, fp16_supported=None):
    """`paddle_dist.trainer.amp.plan` as on a GPU that has float16 and bfloat16; O2 in
    float16 is refused (a DeviceError, as the real plan refuses what a GPU lacks)."""
    from paddle_dist.errors import DeviceError

    found = _ORIGINAL["plan"](train, "gpu:0" if device == "cpu" else device, lambda: True, lambda: True)
    if found.level == "O2" and found.dtype != DTYPE:
        raise DeviceError(f"the GPU stand-in runs train.amp=O2 with train.amp_dtype={DTYPE} only: "
                          "a CPU has no float16 kernels")
    return found


class _GpuPlace:
    """The tracer's place, saying it is a GPU's (for GradScaler's check alone)."""

    def __init__(self, real):
        self._real = real

    def is_gpu_place(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._real, name)


class _GpuTracer:
    def __init__(self, real):
        self._real = real

    @property
    def _expected_place(self):
        return _GpuPlace(self._real._expected_place)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _enabled_grad_scaler(base):
    """paddle.amp.GradScaler, built as on a GPU: enabled (Paddle 2.6 to 3.3 read the place
    through grad_scaler's `_dygraph_tracer` in `AmpScaler.__init__`)."""
    module = importlib.import_module("paddle.amp.grad_scaler")

    class GradScaler(base):
        def __init__(self, *args, **kwargs):
            real = module._dygraph_tracer
            module._dygraph_tracer = lambda: _GpuTracer(real())
            try:
                super().__init__(*args, **kwargs)
            finally:
                module._dygraph_tracer = real

    return GradScaler


_ORIGINAL: dict = {}


def install() -> None:
    """Replace paddle.amp.decorate, auto_cast and GradScaler, and paddle_dist.trainer.amp.plan
    in this process (paddle_dist's own amp.decorate, amp.autocast and SyncedScaler then
    use these)."""
    from paddle_dist.trainer import amp as dist_amp

    if _ORIGINAL:
        return
    _ORIGINAL.update(decorate=paddle.amp.decorate, auto_cast=paddle.amp.auto_cast, plan=dist_amp.plan,
                     GradScaler=paddle.amp.GradScaler)
    paddle.amp.decorate, paddle.amp.auto_cast, dist_amp.plan = decorate, auto_cast, plan
    paddle.amp.GradScaler = _enabled_grad_scaler(_ORIGINAL["GradScaler"])


def uninstall() -> None:
    """Put back what install() replaced."""
    from paddle_dist.trainer import amp as dist_amp

    if _ORIGINAL:
        paddle.amp.decorate, paddle.amp.auto_cast = _ORIGINAL["decorate"], _ORIGINAL["auto_cast"]
        paddle.amp.GradScaler, dist_amp.plan = _ORIGINAL["GradScaler"], _ORIGINAL["plan"]
        _ORIGINAL.clear()


SITE = Path(__file__).resolve().parent / "gpu_standin_site"     # its sitecustomize.py


def environ(base=None) -> dict:
    """`base` (default os.environ) with PYTHONPATH leading to SITE and the repository: every
    Python process started with it installs the stand-in (see the module's docstring)."""
    env = dict(os.environ if base is None else base)
    paths = [str(SITE), str(SITE.parents[1]), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


class SmallBN(paddle.nn.Layer):
    """The model the O2 tests train: a convolution and a linear layer (16-bit under the
    stand-in) around a BatchNorm (kept in float32, as decorate keeps it)."""

    def __init__(self):
        super().__init__()
        self.conv = paddle.nn.Conv2D(1, 4, 3)
        self.bn = paddle.nn.BatchNorm2D(4)
        self.head = paddle.nn.Linear(4 * 6 * 6, 4)

    def forward(self, x):
        return self.head(paddle.flatten(paddle.nn.functional.relu(self.bn(self.conv(x))), 1))
