"""Unit tests for paddle_dist.sync.checks: the sync mode's checks, and what is refused before
anything starts, each in one line with its fix."""

import pytest

from paddle_dist.sync import checks


def test_stop_check_interval_bounds():
    assert checks.stop_check_interval(0.025) == 40
    assert checks.stop_check_interval(3.0) == 1
    assert checks.stop_check_interval(0.0) == checks.STOP_CHECK_MAX
    assert checks.stop_check_interval(1e-9) == checks.STOP_CHECK_MAX


def test_a_layout_difference_names_the_parameter_and_the_ranks():
    same = [("a.weight", [2, 3], "float32"), ("a.bias", [3], "float32")]
    assert checks.layout_mismatch([same, list(same), list(same)]) == ""
    wider = [same[0], ("a.bias", [4], "float32")]
    assert checks.layout_mismatch([same, same, wider]) == \
        "parameter 'a.bias' is [3] float32 on rank 0 but [4] float32 on rank 2"
    assert checks.layout_mismatch([same, same[:1]]) == \
        "parameter 'a.bias' is [3] float32 on rank 0 but absent on rank 1"
    renamed = [same[0], ("b.bias", [3], "float32")]
    assert "is 'a.bias' [3] float32 on rank 0 but 'b.bias' [3] float32 on rank 1" in \
        checks.layout_mismatch([same, renamed])


def test_what_cannot_be_averaged_is_refused_before_anything_starts():
    import paddle

    from paddle_dist.errors import ConfigError

    net = paddle.nn.Sequential(paddle.nn.Embedding(10, 4, sparse=True), paddle.nn.Linear(4, 2))
    for mode in ("auto", "fused", "overlap", "dataparallel"):    # sparse tables: sync/sparse.py
        checks.check_optimizer(paddle.optimizer.SGD(0.1, parameters=net.parameters()), net, mode)
    with pytest.raises(ConfigError, match="LBFGS"):
        checks.check_optimizer(paddle.optimizer.LBFGS(parameters=net[1].parameters()), net[1])
