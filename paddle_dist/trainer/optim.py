"""The optimizer and loss a job gets when the script gives none (train.optimizer, train.lr,
train.clip_grad_norm), and gradient clipping that reports the norm it clipped.

Example:
    optimizer = make_optimizer(optimizer_factory("adam", 1e-3, 0.0, clip_norm=1.0), net.parameters())
    optimizer._grad_clip.last        # the global norm of the last step (a device tensor)
"""

from __future__ import annotations

from typing import Callable, Optional

import paddle


def default_loss(task: str):
    return paddle.nn.CrossEntropyLoss() if task == "classification" else paddle.nn.MSELoss()


def make_optimizer(spec, parameters):
    if isinstance(spec, paddle.optimizer.Optimizer):
        return spec
    return spec(parameters)


def optimizer_factory(name: str, lr: float, weight_decay: float, clip_norm: float = 0.0) -> Callable:
    """Factory for the configured optimizer (so it is created on the right parameters);
    `clip_norm` > 0: gradients clipped to that global norm (MeasuredClip)."""
    def build(parameters):
        decay = weight_decay or None
        clip = MeasuredClip(clip_norm) if clip_norm else None
        if name == "adam":
            return paddle.optimizer.Adam(learning_rate=lr, parameters=parameters, weight_decay=decay,
                                         grad_clip=clip)
        if name == "momentum":
            return paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9, parameters=parameters,
                                             weight_decay=decay, grad_clip=clip)
        return paddle.optimizer.SGD(learning_rate=lr, parameters=parameters, weight_decay=decay,
                                    grad_clip=clip)
    return build


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
