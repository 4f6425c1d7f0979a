"""Unit tests for paddle_dist.sync.reducers: the CPU transports' pieces in one process (their
opening by name: test_transports.py; their exchanges across ranks: the integration tests)."""

import numpy as np
import paddle

from paddle_dist import compat
from paddle_dist.sync import reducers


def test_bf16_bits_round_to_nearest_even_like_paddle_3():
    values = np.random.RandomState(0).standard_normal(10000).astype(np.float32) * 1e3
    values[:4] = [1.0, 1.00390625, 1.01171875, 0.0]      # exact, two ties, zero
    ours = reducers.to_bf16_bits(values)
    np.testing.assert_array_equal(ours[:4], [0x3F80, 0x3F80, 0x3F82, 0])   # ties to even
    if compat.cpu_bf16_cast_rounds():    # Paddle 3.x; 2.6 truncates (test_compat.py)
        theirs = compat.numpy_view(paddle.to_tensor(values).astype("bfloat16"))
        np.testing.assert_array_equal(ours, theirs)
