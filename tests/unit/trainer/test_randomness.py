"""Dropout that does not depend on the world size (trainer/randomness.py): a micro-batch's
masks are a function of (seed, step, its place in the plan), so rank 1 of 2 draws what the
second micro-batch of 1 rank draws, and nothing else draws alike."""

import numpy as np
import paddle

from paddle_dist.trainer.randomness import MicroBatchDraws, describe, micro_batch_key


def _mask(draws: MicroBatchDraws, step: int, index: int, share: int) -> np.ndarray:
    draws.seed(step, index, share)
    return paddle.nn.functional.dropout(paddle.ones([64]), p=0.5, training=True).numpy()


def test_a_micro_batch_gets_the_same_masks_on_any_number_of_ranks():
    one_rank = [_mask(MicroBatchDraws(7, rank=0), 12, i, share=2) for i in (0, 1)]
    two_ranks = [_mask(MicroBatchDraws(7, rank=r), 12, 0, share=1) for r in (0, 1)]
    assert all(np.array_equal(a, b) for a, b in zip(one_rank, two_ranks))
    assert not np.array_equal(one_rank[0], one_rank[1])          # two samples, two masks


def test_steps_seeds_and_positions_draw_apart():
    keys = {micro_batch_key(seed, step, position)
            for seed in (1, 2) for step in range(50) for position in range(8)}
    assert len(keys) == 2 * 50 * 8 and max(keys) < 2 ** 63
    assert micro_batch_key(1, 3, 2) == micro_batch_key(1, 3, 2)


def test_the_continuation_line_names_the_dropout_layers():
    net = paddle.nn.Sequential(paddle.nn.Linear(4, 4), paddle.nn.Dropout(0.1), paddle.nn.Dropout(0.0))
    assert describe(net).startswith("dropout in '1' draws per micro-batch")
    assert describe(paddle.nn.Linear(4, 4)) == ""
