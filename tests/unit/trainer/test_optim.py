"""The default optimizer's clip that keeps the norm it clipped (trainer/optim.py)."""

import numpy as np
import paddle

from paddle_dist.trainer.optim import MeasuredClip


def test_the_measured_clip_keeps_the_norm_it_clipped():
    net = paddle.nn.Linear(2, 1, bias_attr=False)
    clip = MeasuredClip(0.1)
    opt = paddle.optimizer.SGD(0.0, parameters=net.parameters(), grad_clip=clip)
    net.weight.set_value(paddle.to_tensor([[3.0], [4.0]]))
    (net(paddle.to_tensor([[1.0, 0.0]])) * 0 + net.weight.sum()).backward()
    opt.step()
    assert abs(float(clip.last) - np.sqrt(2.0)) < 1e-5
