"""Each difference between Paddle versions that compat.py handles, checked on the version
that runs the tests: what this version does, and that paddle_dist's answer is the same on
all of them. `make test PADDLE=paddlepaddle==2.6.2` (and .ci/run's compat stage) run these
on other versions."""

import numpy as np
import paddle
import pytest

from paddle_dist import compat

VERSION = compat.parse_version(paddle.__version__)
DEVELOP = VERSION[:1] == (0,)          # a develop build: newest behaviour
AT_LEAST_3 = DEVELOP or VERSION >= (3, 0)


def test_the_version_is_read_without_importing_paddle_and_checked():
    assert compat.installed_version() == paddle.__version__
    assert compat.is_supported("2.6.2") and compat.is_supported("3.2.2") and compat.is_supported("3.3.1")
    for outside in ("2.5.2", "3.4.0", "1.8.5"):
        assert compat.version_problem(outside).startswith(f"Paddle {outside} is outside the range")
        assert compat.SUPPORTED in compat.version_problem(outside)
    assert "a develop build" in compat.version_problem("0.0.0")
    assert "not installed" in compat.version_problem(None)
    assert compat.version_problem("3.0.0rc1") is None


def test_the_unsupported_line_is_said_once(monkeypatch):
    monkeypatch.setattr(compat, "installed_version", lambda: "2.5.2")
    monkeypatch.setattr(compat, "_said", [])
    said = []
    compat.warn_unsupported(said.append)
    compat.warn_unsupported(said.append)
    assert said == [f"paddle_dist: warning: {compat.version_problem('2.5.2')}"]


def test_paddle_2_6_with_numpy_2_is_said_and_nothing_else_is():
    assert compat.numpy_problem("2.6.2", "2.4.6").startswith("Paddle 2.6.2 needs numpy 1 (found 2.4.6")
    assert compat.numpy_problem("2.6.2", "1.26.4") is None
    assert compat.numpy_problem("3.3.1", "2.4.6") is None and compat.numpy_problem(None, "2.0.0") is None
    if VERSION[:2] == (2, 6):           # the make targets install numpy 1 with 2.6
        assert np.__version__.startswith("1.")


def test_dlpack_views_are_writable_only_from_3_3():
    assert compat.dlpack_writable() == (DEVELOP or VERSION >= (3, 3))
    if hasattr(paddle.Tensor, "__dlpack__"):
        assert np.from_dlpack(paddle.zeros([2])).flags.writeable == compat.dlpack_writable()
    else:
        assert VERSION[:2] == (2, 6)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_numpy_view_is_a_writable_view_of_the_tensors_own_memory(dtype):
    tensor = paddle.arange(6, dtype=dtype)
    view = compat.numpy_view(tensor)
    assert view.flags.writeable and view.dtype == np.dtype(dtype) and view.shape == (6,)
    view *= 3
    np.testing.assert_array_equal(tensor.numpy(), np.arange(6) * 3)
    tensor.add_(paddle.ones([6], dtype=dtype))            # and the other way round
    np.testing.assert_array_equal(view, np.arange(6) * 3 + 1)


def test_numpy_view_of_a_gradient_outlives_the_name_it_came_from():
    layer = paddle.nn.Linear(3, 2)
    layer(paddle.ones([4, 3])).sum().backward()
    view = compat.numpy_view(layer.weight.grad.detach())   # the detached tensor is not kept
    view[:] = 0.5
    np.testing.assert_array_equal(layer.weight.grad.numpy(), np.full([3, 2], 0.5, np.float32))


def test_bfloat16_is_seen_as_its_uint16_bits_and_the_cast_rounds_from_3_0():
    bits = compat.numpy_view(paddle.to_tensor([1.0, -2.0]).astype("bfloat16"))
    assert bits.dtype == np.uint16 and bits.tolist() == [0x3F80, 0xC000]
    assert compat.cpu_bf16_cast_rounds() == AT_LEAST_3       # 2.6 truncates


def test_generator_state_carries_the_cpu_engine_from_3_0():
    assert compat.engine_saved() == AT_LEAST_3


def test_generator_states_round_trip_mid_stream_on_every_version():
    paddle.seed(11)
    compat.note_seed(11)
    paddle.rand([7])                                   # the engine is mid-stream
    saved = compat.generator_states(step=5)
    expected = paddle.rand([4]).numpy()
    paddle.rand([3])
    compat.set_generator_states(saved)
    np.testing.assert_array_equal(paddle.rand([4]).numpy(), expected)


def test_a_state_saved_by_2_6_starts_the_cpu_engine_from_its_seed_on_every_version():
    paddle.seed(7)
    expected = paddle.rand([4]).numpy()
    paddle.rand([5])
    compat.set_generator_states([([-1, 7, 0], [])])      # 2.6's form: no engine
    np.testing.assert_array_equal(paddle.rand([4]).numpy(), expected)


def test_saving_twice_at_one_step_saves_one_state_and_other_steps_differ():
    paddle.seed(11)
    compat.note_seed(11)
    first = compat.generator_states(step=5)
    assert compat.generator_states(step=5) == first       # 3.x: nothing drawn between; 2.6: the same seed
    if not compat.engine_saved():
        # 2.6: the state after a checkpoint depends on the job's seed and the step only.
        paddle.rand([9])
        assert compat.generator_states(step=5) == first
        assert compat.generator_states(step=6) != first


def test_an_optimizers_loaded_state_is_in_its_state_before_the_first_step():
    net = paddle.nn.Linear(2, 2)
    opt = paddle.optimizer.Adam(0.1, parameters=net.parameters())
    net(paddle.ones([1, 2])).sum().backward()
    opt.step()
    state = {k: v for k, v in opt.state_dict().items()}
    fresh = paddle.optimizer.Adam(0.1, parameters=paddle.nn.Linear(2, 2).parameters())
    fresh.set_state_dict(state)
    assert sorted(compat.optimizer_state(fresh)) == sorted(state)
    if AT_LEAST_3:
        assert sorted(fresh.state_dict()) == sorted(state)
    else:
        assert not [k for k in fresh.state_dict() if k != "LR_Scheduler"]   # 2.6 leaves it out


def test_the_exported_program_is_json_from_3_0_and_pdmodel_on_2_6(tmp_path):
    net = paddle.nn.Linear(3, 2)
    spec = [paddle.static.InputSpec([None, 3], "float32", "x")]
    paddle.jit.save(net, str(tmp_path / "model"), input_spec=spec)
    assert compat.program_file(tmp_path, "model").name == ("model.json" if AT_LEAST_3 else "model.pdmodel")
    with pytest.raises(FileNotFoundError, match="no other.json or other.pdmodel"):
        compat.program_file(tmp_path, "other")
