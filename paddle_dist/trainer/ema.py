"""An exponential moving average of the model's whole state (train.ema_decay), as the
detection and classification suites keep it.

After every optimizer step each floating entry of the model's state (the parameters and
the buffers: BatchNorm's running statistics, which sync/batchstats.py keeps equal on
every rank) moves toward the model's own value:

    average = d * average + (1 - d) * value,   d = min(decay, (1 + n) / (10 + n))

in float32, where n counts the updates before this one (train.ema_warmup, the default,
as PaddleDetection's ModelEMA; train.ema_warmup=false: d = decay from the first step).
The warm-up lets the averages follow the quickly moving early weights instead of
keeping a share of the random start (0.99**128 = 27.6 % of it after 128 steps).
Evaluation, the best checkpoint's choice and export use the averages; training goes on
from the model's own values. The averages and n are in every checkpoint (`ema.npz`, the
meta's `ema_updates`), so a resumed run continues them bitwise.

The entries are the layer's own tensors (compat.state_tensors), never the float32
copies that an O2 model's state_dict() hands out.

Example:
    ema = Ema(net, 0.999)
    ema.update()                  # after optimizer.step() (and the BatchNorm update)
    with ema.applied():           # the averages in the model, for evaluation
        evaluate(...)
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import numpy as np
import paddle

from ..compat import state_tensors

FLOATING = (paddle.float32, paddle.float64, paddle.float16, paddle.bfloat16)


def warmed_decay(decay: float, updates: int, warmup: bool = True) -> float:
    """The decay of update number `updates` + 1 (0: the first).

    Example:
        warmed_decay(0.999, 0)       # 0.1: the first update keeps 10 % of the start
        warmed_decay(0.999, 10**5)   # 0.999
    """
    return min(decay, (1.0 + updates) / (10.0 + updates)) if warmup else decay


class Ema:
    """The averages of `model`'s floating state entries, by state_dict key."""

    def __init__(self, model: paddle.nn.Layer, decay: float, warmup: bool = True):
        self.model, self.decay, self.warmup = model, float(decay), bool(warmup)
        self.tensors = {key: t for key, t in state_tensors(model).items() if t.dtype in FLOATING}
        self.updates = 0
        with paddle.no_grad():
            self.shadow = {key: t.astype("float32").clone() for key, t in self.tensors.items()}

    @paddle.no_grad()
    def update(self) -> None:
        d = warmed_decay(self.decay, self.updates, self.warmup)
        self.updates += 1
        for key, t in self.tensors.items():
            average = self.shadow[key]
            average.set_value(average * d + t.astype("float32") * (1.0 - d))

    @contextlib.contextmanager
    def applied(self):
        """The model holds the averages inside, its own values again after."""
        with paddle.no_grad():
            kept = {key: t.clone() for key, t in self.tensors.items()}
            for key, t in self.tensors.items():
                t.set_value(self.shadow[key].astype(t.dtype))
        try:
            yield
        finally:
            with paddle.no_grad():
                for key, t in self.tensors.items():
                    t.set_value(kept[key])

    def state(self) -> Dict[str, np.ndarray]:
        """The averages as arrays, keyed like the model's state_dict (for ema.npz and export)."""
        return {key: average.numpy() for key, average in self.shadow.items()}

    def load(self, arrays: Dict[str, np.ndarray], updates: Optional[int] = None) -> None:
        """The averages from a checkpoint. An entry it lacks (a checkpoint of the parameters'
        averages only) starts from the model's value; `updates` None: a checkpoint that did
        not count them, taken as past the warm-up."""
        with paddle.no_grad():
            for key, average in self.shadow.items():
                value = arrays.get(key)
                average.set_value(paddle.to_tensor(value).astype("float32") if value is not None
                                  else self.tensors[key].astype("float32"))
        self.updates = 10 ** 9 if updates is None else int(updates)

    def weights(self) -> Dict[str, np.ndarray]:
        """The model's state with the averages (float32, as kept) in place of its floating
        entries: what ema.npz holds, resumed and exported from."""
        found = {key: value.numpy() for key, value in state_tensors(self.model).items()}
        found.update(self.state())
        return found
