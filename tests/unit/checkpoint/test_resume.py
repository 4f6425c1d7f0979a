"""Unit tests for paddle_dist.checkpoint.resume: which checkpoint `checkpoint.resume` means, whether
it fits the job, and restore: the very state back, or a one-line refusal."""

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from paddle_dist import checkpoint as ck
from paddle_dist import compat
from paddle_dist.runs.layout import Run

from tests.unit.checkpoint.test_io import (Net, Wrapped, arrays, assert_bitwise, fresh_names, meta, new_model,
                                           one_line, sgd, train_step, weights)
from tests.unit.checkpoint.test_io import one_step, saved  # noqa: F401  (fixtures)


def assert_same_state(a, b):
    a, b = arrays(a), arrays(b)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)


# ---------------------------------------------------------------- load + restore
def test_load_and_restore_give_identical_model_and_optimizer(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, net, opt, meta(1))

    fresh_net, fresh_opt, fresh_names = new_model(seed=1)   # different initial weights
    assert not np.array_equal(fresh_net.weight.numpy(), net.weight.numpy())
    ck.restore(ck.load(tmp_path), fresh_net, fresh_opt)

    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())

    # The restored Adam moments matter: the next step must land on the same weights.
    train_step(net, opt, names)
    train_step(fresh_net, fresh_opt, fresh_names)
    assert_same_state(fresh_net.state_dict(), net.state_dict())
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())


def test_a_random_step_after_restore_matches_going_on_without_a_checkpoint(tmp_path, one_step):
    net, opt, names = one_step
    ck.save(tmp_path, net, opt, meta(1))
    train_step(net, opt, names, dropout=0.5)          # the run that never stopped

    fresh_net, fresh_opt, fresh_names = new_model(seed=1)
    paddle.seed(12345)                                # a new process: other RNG state
    ck.restore(ck.load(tmp_path), fresh_net, fresh_opt)
    train_step(fresh_net, fresh_opt, fresh_names, dropout=0.5)
    assert_same_state(fresh_net.state_dict(), net.state_dict())


def test_a_fresh_optimizer_would_step_differently(one_step):
    # Control for the tests above: without the optimizer state the next step differs.
    net, opt, names = one_step
    other_net, other_opt, other_names = new_model()
    other_net.set_state_dict(net.state_dict())
    train_step(net, opt, names)
    train_step(other_net, other_opt, other_names)
    assert not np.array_equal(net.weight.numpy(), other_net.weight.numpy())


def test_restore_model_only(saved, one_step):
    net, _, _ = one_step
    fresh_net, _, _ = new_model(seed=1)
    ck.restore(ck.load(saved), fresh_net)
    assert_same_state(fresh_net.state_dict(), net.state_dict())


def test_restore_refuses_a_model_of_another_shape(saved):
    with unique_name.guard(fresh_names()):
        other = paddle.nn.Linear(3, 5)
    with pytest.raises(ck.CheckpointError, match="weight"):
        ck.restore(ck.load(saved), other)


def test_learning_rate_scheduler_state_round_trips(tmp_path):
    names = fresh_names()
    with unique_name.guard(names):
        net = paddle.nn.Linear(3, 2)
        opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                    parameters=net.parameters())
    train_step(net, opt, names)
    opt._learning_rate.step()
    ck.save(tmp_path, net, opt, meta(1))

    with unique_name.guard(fresh_names()):
        fresh = paddle.nn.Linear(3, 2)
        fresh_opt = paddle.optimizer.Adam(paddle.optimizer.lr.StepDecay(0.1, step_size=1),
                                          parameters=fresh.parameters())
    ck.restore(ck.load(tmp_path), fresh, fresh_opt)
    assert fresh_opt.get_lr() == pytest.approx(opt.get_lr())
    assert fresh_opt.get_lr() == pytest.approx(0.01)
    assert_same_state(compat.optimizer_state(fresh_opt), opt.state_dict())


# ---------------------------------------------------------------- resolve_resume
def test_resolve_resume_none_and_auto(tmp_path, one_step):
    net, opt, _ = one_step
    assert ck.resolve_resume("none", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) is None            # nothing saved yet
    path = ck.save(tmp_path / "checkpoints", net, opt, meta(4))
    assert ck.resolve_resume("none", tmp_path) is None
    assert ck.resolve_resume("auto", tmp_path) == path


def test_resolve_resume_paths(tmp_path, one_step):
    net, opt, _ = one_step
    first = ck.save(Run(tmp_path / "run").checkpoints, net, opt, meta(1))
    second = ck.save(Run(tmp_path / "run").checkpoints, net, opt, meta(2))
    other_run = tmp_path / "elsewhere"
    assert ck.resolve_resume(str(first), other_run) == first
    assert ck.resolve_resume(str(Run(tmp_path / "run").checkpoints), other_run) == second
    assert ck.resolve_resume(str(tmp_path / "run"), other_run) == second


@pytest.mark.parametrize("bad", ["missing", "empty", "file"])
def test_resolve_resume_bad_path(tmp_path, bad):
    target = tmp_path / bad
    if bad == "empty":
        target.mkdir()
    elif bad == "file":
        target.write_text("x")
    with pytest.raises(ck.CheckpointError, match="checkpoint.resume=") as err:
        ck.resolve_resume(str(target), tmp_path)
    assert str(target) in one_line(err)


# ---------------------------------------------------------------- check_compatible
def test_check_compatible_accepts_the_same_job(saved, one_step):
    net, _, _ = one_step
    ck.check_compatible(ck.load(saved), 1, "linear", net)


def test_check_compatible_world_size(saved):
    with pytest.raises(ck.CheckpointError, match="written by 1 ranks but this job has 3") as err:
        ck.check_compatible(ck.load(saved), 3, "linear")
    assert "dist.nprocs=1" in one_line(err) and str(saved) in str(err.value)


def test_check_compatible_model_name(saved):
    with pytest.raises(ck.CheckpointError, match="holds model 'linear' but the config builds 'lenet'"):
        ck.check_compatible(ck.load(saved), 1, "lenet")


def test_check_compatible_parameter_shapes_and_names(saved):
    with unique_name.guard(fresh_names()):
        wider = paddle.nn.Linear(3, 4)
        deeper = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.Linear(2, 2))
    with pytest.raises(ck.CheckpointError, match=r"weight \(3, 2\) vs \(3, 4\)"):
        ck.check_compatible(ck.load(saved), 1, "linear", wider)
    with pytest.raises(ck.CheckpointError, match="missing in the checkpoint: 0.bias") as err:
        ck.check_compatible(ck.load(saved), 1, "linear", deeper)
    assert "checkpoint.resume=none" in one_line(err)


def test_restore_refuses_a_wrapped_models_checkpoint_naming_the_wrapper(tmp_path):
    outer = Wrapped(Net())
    path = ck.save(tmp_path, outer, sgd(outer), meta(1))
    plain = Net()
    before = weights(plain)
    with pytest.raises(ck.CheckpointError, match="not in the model: net.fc.bias, net.fc.weight") as err:
        ck.restore(ck.load(path), plain, rng=False)
    assert "with 'net.' in front" in one_line(err) and str(path) in str(err.value)
    assert_bitwise(weights(plain), before)


def test_restore_refuses_another_dtype_in_one_line(tmp_path):
    """(16-bit and float32 weights load into each other: a mixed-precision run's, exactly;
    test_an_o2_models_16_bit_weights_resume_from_the_float32_they_were_saved_as.)"""
    double = Net()
    double.to(dtype="float64")
    path = ck.save(tmp_path, double, sgd(double), meta(1))
    with pytest.raises(ck.CheckpointError, match=r"dtype \(checkpoint vs model\) of fc.bias float64 "
                                                 r"vs float32, fc.weight float64 vs float32") as err:
        ck.restore(ck.load(path), Net(), rng=False)     # Paddle's own: an AssertionError, midway
    one_line(err)
