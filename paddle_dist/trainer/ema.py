"""An exponential moving average of the weights (train.ema_decay), and gradient clipping
that reports the norm it clipped (train.clip_grad_norm).

After every optimizer step each trained parameter's average moves toward it:
`average = decay * average + (1 - decay) * weight`, in float32, on every rank (the ranks'
weights are identical, so their averages are too). Evaluation, the best checkpoint's
choice and export use the averages; training goes on from the weights themselves. The
averages are in every checkpoint (`ema.npz`), so a resumed run continues them bitwise.

Example:
    ema = Ema(net, 0.999)
    ema.update()                  # after optimizer.step()
    with ema.applied():           # the averages in the model, for evaluation
        evaluate(...)
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional

import numpy as np
import paddle


class Ema:
    """The averages of `model`'s trained parameters, by name."""

    def __init__(self, model: paddle.nn.Layer, decay: float):
        self.model, self.decay = model, float(decay)
        self.params = {name: p for name, p in model.named_parameters() if not p.stop_gradient}
        with paddle.no_grad():
            self.shadow = {name: p.astype("float32").clone() for name, p in self.params.items()}

    @paddle.no_grad()
    def update(self) -> None:
        for name, p in self.params.items():
            average = self.shadow[name]
            average.set_value(average * self.decay + p.astype("float32") * (1.0 - self.decay))

    @contextlib.contextmanager
    def applied(self):
        """The model holds the averages inside, its own weights again after."""
        with paddle.no_grad():
            kept = {name: p.clone() for name, p in self.params.items()}
            for name, p in self.params.items():
                p.set_value(self.shadow[name].astype(p.dtype))
        try:
            yield
        finally:
            with paddle.no_grad():
                for name, p in self.params.items():
                    p.set_value(kept[name])

    def state(self) -> Dict[str, np.ndarray]:
        """The averages as arrays, keyed like the model's state_dict (for ema.npz and export)."""
        names = {id(p): key for key, p in self.model.state_dict().items()}
        return {names[id(p)]: self.shadow[name].numpy() for name, p in self.params.items()}

    def load(self, arrays: Dict[str, np.ndarray]) -> None:
        names = {id(p): key for key, p in self.model.state_dict().items()}
        with paddle.no_grad():
            for name, p in self.params.items():
                self.shadow[name].set_value(paddle.to_tensor(arrays[names[id(p)]]))

    def weights(self) -> Dict[str, np.ndarray]:
        """The model's state_dict with the averages (float32, as kept) in place of the
        trained parameters: what ema.npz holds, resumed and exported from."""
        found = {key: value.numpy() for key, value in self.model.state_dict().items()}
        found.update(self.state())
        return found


class MeasuredClip(paddle.nn.ClipGradByGlobalNorm):
    """paddle.nn.ClipGradByGlobalNorm that keeps the global norm it saw (a device tensor,
    read only when the progress line is printed)."""

    def __init__(self, clip_norm: float):
        super().__init__(clip_norm)
        self.last: Optional[paddle.Tensor] = None

    def _dygraph_clip(self, params_grads):
        squares = [paddle.sum(paddle.square(g.astype("float32"))) for p, g in params_grads
                   if g is not None and getattr(p, "need_clip", True)]
        if squares:
            self.last = paddle.sqrt(paddle.add_n(squares)).detach()
        return super()._dygraph_clip(params_grads)
