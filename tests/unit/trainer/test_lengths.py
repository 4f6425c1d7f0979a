"""One warning, once per run, for a batch longer than the model's declared maximum length
(trainer/lengths.py)."""

import logging
from types import SimpleNamespace

import paddle

from paddle_dist.trainer.lengths import LengthWatch


def test_a_batch_longer_than_the_models_declared_length_is_warned_once(caplog):
    class Lm(paddle.nn.Layer):
        config = SimpleNamespace(max_position_embeddings=8, max_length=20)   # generation's max_length: not it

    watch = LengthWatch.of(Lm())
    assert (watch.limit, watch.said) == (8, "config.max_position_embeddings")
    with caplog.at_level(logging.WARNING, logger="paddle_dist"):
        watch.see([paddle.zeros([2, 8], "int64")])
        for _ in range(3):
            watch.see([paddle.zeros([2, 9], "int64")])
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "length 9" in said[0] and "config.max_position_embeddings = 8" in said[0]
    assert LengthWatch.of(paddle.nn.Linear(2, 2)).limit is None


def test_a_config_given_as_a_dict_and_the_models_own_attribute_are_read():
    class Own(paddle.nn.Layer):
        max_seq_len = 16

    class ByDict(paddle.nn.Layer):
        config = {"max_position_embeddings": 32}

    assert (LengthWatch.of(Own()).limit, LengthWatch.of(Own()).said) == (16, "max_seq_len")
    assert (LengthWatch.of(ByDict()).limit, LengthWatch.of(ByDict()).said) == (32, "config.max_position_embeddings")
    watch = LengthWatch.of(Own())
    watch.see([paddle.zeros([2, 40], "float32")])      # no token ids: nothing to measure
    assert not watch.warned
