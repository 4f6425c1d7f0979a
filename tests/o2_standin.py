"""On a CPU, the state that `paddle.amp.decorate(level="O2", master_weight=True,
save_dtype="float32")` leaves on a GPU, so that paddle_dist's O2 paths run in CPU tests.

On a CPU Paddle's `decorate` returns the model and optimizer untouched and `amp.plan`
refuses O2, so without this no test ever saw an O2 model. `decorate` below runs the body
of Paddle's own `amp_decorate` past its device check, with Paddle's own pieces:

- `amp_initialize`: every layer's floating parameters and buffers cast in place to the
  16-bit dtype, except the layers Paddle keeps in float32 (`need_keep_fp32`: BatchNorm*,
  SyncBatchNorm);
- `_set_multi_precision(optimizer, True)`: float32 master weights, made at the first step
  and kept in the optimizer's state_dict as `master_weights`;
- `StateDictHook(save_dtype)` on every sublayer: `state_dict()` hands out float32 copies,
  `state_dict(use_hook=False)` the real tensors.

What it does not reproduce, and why:
- 16-bit arithmetic. Paddle 3.3.1's CPU kernels have no bfloat16 or float16 version of
  conv2d, matmul, add, relu, mean, pool2d, batch_norm (measured 2026-11-28; cast, concat,
  split, divide by a scalar and gloo's all_reduce have one), so no forward could
  run. Instead each layer that owns parameters computes in float32 from its 16-bit
  weights (an exact widening), with its floating inputs and outputs rounded to bfloat16
  values, as the 16-bit ops under autocast would hand them on; the tensors between layers
  stay float32 by dtype, and functional ops between layers and the loss run in float32.
  The numbers therefore are not a GPU's; the state (dtypes, hooks, master weights, what
  state_dict returns) is. `auto_cast` is replaced by a context that switches this on; a
  decorated model whose forward runs outside it raises, as conv2d's dtype check does on
  a GPU.
- Optimizers: only SGD has a bfloat16 CPU kernel (Adam, AdamW, Momentum have none), so
  O2 tests use SGD.
- float16: no CPU kernel at all (not even sgd); refused. Loss scaling (GradScaler) is
  float16's, so it is not exercised either. O1 (autocast without decorate) is refused
  too: there is no state of its own to reproduce. `master_grad` and `excluded_layers`
  are not supported.

Use (in a test process, before paddle_dist builds anything; the config then says
train.amp=O2 and train.amp_dtype=bfloat16, e.g. by the launcher's -o):
    from tests import o2_standin
    o2_standin.install()       # paddle.amp.decorate / auto_cast, paddle_dist's amp.plan
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any

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
        return value.astype(DTYPE).astype("float32") if value.dtype == paddle.float32 else value
    if isinstance(value, (tuple, list)):
        return type(value)(_rounded(v) for v in value)
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
    """`paddle_dist.trainer.amp.plan` as on a GPU that has bfloat16; anything but O2 in
    bfloat16 (or off) is refused."""
    from paddle_dist.errors import DeviceError

    found = _ORIGINAL["plan"](train, "gpu:0" if device == "cpu" else device, lambda: True, lambda: True)
    if found.enabled and (found.level, found.dtype) != ("O2", DTYPE):
        raise DeviceError(f"the O2 stand-in runs train.amp=O2 with train.amp_dtype={DTYPE} only")
    return found


_ORIGINAL: dict = {}


def install() -> None:
    """Replace paddle.amp.decorate, paddle.amp.auto_cast and paddle_dist.trainer.amp.plan
    in this process (paddle_dist's own amp.decorate and amp.autocast then call these)."""
    from paddle_dist.trainer import amp as dist_amp

    if _ORIGINAL:
        return
    _ORIGINAL.update(decorate=paddle.amp.decorate, auto_cast=paddle.amp.auto_cast, plan=dist_amp.plan)
    paddle.amp.decorate, paddle.amp.auto_cast, dist_amp.plan = decorate, auto_cast, plan


def uninstall() -> None:
    """Put back what install() replaced."""
    from paddle_dist.trainer import amp as dist_amp

    if _ORIGINAL:
        paddle.amp.decorate, paddle.amp.auto_cast = _ORIGINAL["decorate"], _ORIGINAL["auto_cast"]
        dist_amp.plan = _ORIGINAL["plan"]
        _ORIGINAL.clear()


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
