"""Deterministic GPU kernels (`train.deterministic`, on by default): the promise that a
stopped and continued run is bitwise the uninterrupted one needs two runs of the same
steps to give the same bits, which cuDNN's default algorithms (atomics in some
convolutions' backward, algorithms picked by timing) and Paddle's embedding gradient do
not. On a GPU rank, `apply` sets Paddle's own switches when the rank sets up
(`process.setup`, before training's first step):

- `FLAGS_cudnn_deterministic`: cuDNN's deterministic algorithms, no autotuning;
- `FLAGS_embedding_deterministic`: the embedding gradient without atomics (Paddle 2.5+).

Cost: convolution-heavy models train slower where cuDNN's fastest algorithm is not a
deterministic one (NVIDIA's cuDNN documentation lists them); not measured here, since no
GPU build of Paddle runs on the machines this project can reach. `train.deterministic=false`
gives the speed back, and the docs then promise a continued run only within float
rounding. A flag the user set in the environment is left as it is; CPU builds have
neither flag and CPU kernels need none.

Example:
    apply(True, "gpu:0")    # {'FLAGS_cudnn_deterministic': True, 'FLAGS_embedding_deterministic': 1}
"""

from __future__ import annotations

import os
from typing import Callable, Dict, Mapping, Optional

FLAGS = {"FLAGS_cudnn_deterministic": True, "FLAGS_embedding_deterministic": 1}


def apply(deterministic: bool, device: str, set_flags: Optional[Callable[[dict], None]] = None,
          environ: Mapping[str, str] = os.environ) -> Dict[str, object]:
    """Set FLAGS on a GPU rank when `deterministic`; returns what was set. A flag that this
    build lacks (set_flags raises) or that `environ` already sets is skipped."""
    if not deterministic or not device.startswith("gpu"):
        return {}
    if set_flags is None:
        import paddle
        set_flags = paddle.set_flags
    chosen = {}
    for flag, value in FLAGS.items():
        if flag in environ:
            continue
        try:
            set_flags({flag: value})
        except (ValueError, RuntimeError):      # not a flag of this build
            continue
        chosen[flag] = value
    return chosen
