"""Unit tests for paddle_dist.checkpoint.weights: load_weights (a checkpoint, a run or a .pdparams
file, never unpickling objects) and weights into a model exactly, or a one-line refusal."""

import pickle
import warnings

import numpy as np
import paddle
import pytest
from paddle.utils import unique_name

from paddle_dist import checkpoint as ck
from paddle_dist import models
from paddle_dist.runs.layout import Run

from tests.unit.checkpoint.test_io import (Net, Payload, UNPICKLED, Wrapped, assert_bitwise, fresh_names, meta,
                                           new_model, one_line, weights)
from tests.unit.checkpoint.test_io import one_step, saved  # noqa: F401  (fixtures)


def saved_pdparams(net, file):
    paddle.save(net.state_dict(), str(file))
    return file


def test_set_state_dict_skips_a_wrapped_models_weights_with_a_warning_only(tmp_path):
    # Control, the user's report: Paddle loads nothing, warns, and the model stays untrained.
    file = saved_pdparams(Wrapped(Net()), tmp_path / "model.pdparams")
    plain = Net()
    before = weights(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        missing, unexpected = plain.set_state_dict(paddle.load(str(file)))
    assert sorted(missing) == ["fc.bias", "fc.weight"]
    assert sorted(unexpected) == ["net.fc.bias", "net.fc.weight"]
    assert any("Skip loading" in str(w.message) for w in caught)
    assert_bitwise(weights(plain), before)


def test_load_weights_refuses_a_wrapped_models_pdparams_naming_the_keys(tmp_path):
    file = saved_pdparams(Wrapped(Net()), tmp_path / "model.pdparams")
    plain = Net()
    before = weights(plain)
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(plain, file)
    message = one_line(err)
    assert message.startswith(f"{file} does not fit this model: ")
    assert "missing in the file: fc.bias, fc.weight; not in the model: net.fc.bias, net.fc.weight" in message
    assert "with 'net.' in front" in message and "use its 'net'" in message
    assert_bitwise(weights(plain), before)                     # nothing was loaded
    ck.load_weights(Wrapped(Net()), file)                       # the fix the message gives works


def test_load_weights_into_a_wrapper_points_at_its_sublayer(tmp_path):
    file = saved_pdparams(Net(), tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError, match="load into its sublayer 'net'") as err:
        ck.load_weights(Wrapped(Net()), file)
    assert "missing in the file: net.fc.bias, net.fc.weight" in one_line(err)


def test_load_weights_names_a_few_differences_and_how_many_more(tmp_path):
    file = saved_pdparams(Wrapped(Net(depth=4)), tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError) as err:
        ck.load_weights(Net(depth=4), file)
    assert ("not in the model: net.fc.bias, net.fc.weight, net.more.0.bias, net.more.0.weight "
            "and 4 more;") in one_line(err)


def test_load_weights_refuses_another_shape(tmp_path, saved):
    file = saved_pdparams(Net(width=2), tmp_path / "model.pdparams")
    wider = Net(width=4)
    before = weights(wider)
    with pytest.raises(ck.CheckpointError, match=r"shape \(file vs model\) of fc.bias \(2,\) vs \(4,\), "
                                                 r"fc.weight \(3, 2\) vs \(3, 4\)") as err:
        ck.load_weights(wider, file)
    assert "missing" not in one_line(err) and "not in the model" not in str(err.value)
    assert_bitwise(weights(wider), before)
    with unique_name.guard(fresh_names()):
        linear = paddle.nn.Linear(3, 4)
    with pytest.raises(ck.CheckpointError, match=rf"checkpoint {saved} does not fit this model: "
                                                 r"shape \(checkpoint vs model\) of bias"):
        ck.load_weights(linear, saved.parent.parent)              # a run directory: its latest


def test_load_weights_refuses_another_dtype(tmp_path):
    double = Net()
    double.to(dtype="float64")
    file = saved_pdparams(double, tmp_path / "model.pdparams")
    with pytest.raises(ck.CheckpointError, match=r"dtype \(file vs model\) of fc.bias float64 vs float32"):
        ck.load_weights(Net(), file)


def test_load_weights_takes_a_mixed_precision_runs_16_bit_weights_exactly(tmp_path):
    half = Net()
    half.to(dtype="float16")
    file = saved_pdparams(half, tmp_path / "model.pdparams")
    net = Net()
    ck.load_weights(net, file)
    assert all(np.array_equal(net.state_dict()[k].numpy(), v.astype("float32").numpy())
               for k, v in half.state_dict().items())


def test_load_weights_of_an_exact_match_are_bitwise_equal(tmp_path, one_step):
    net, opt, _ = one_step
    trained_weights = weights(net)
    file = saved_pdparams(net, tmp_path / "model.pdparams")
    checkpoint = ck.save(Run(tmp_path / "run").checkpoints, net, opt, meta(1))
    exported = ck.export_pdparams(checkpoint, tmp_path / "exported.pdparams")
    for given, loaded in [(file, file), (checkpoint, checkpoint), (tmp_path / "run", checkpoint),
                          (Run(tmp_path / "run").checkpoints, checkpoint), (exported, exported),
                          (str(file), file)]:
        fresh, _, _ = new_model(seed=1)
        assert weights(fresh)["weight"].tobytes() != trained_weights["weight"].tobytes()
        assert ck.load_weights(fresh, given) == loaded
        assert_bitwise(weights(fresh), trained_weights)


def test_load_weights_keeps_buffers_exactly(tmp_path):
    net = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.BatchNorm1D(2))
    net[1]._mean.set_value(paddle.rand([2]))                      # running statistics, as trained
    net[1]._variance.set_value(paddle.rand([2]) + 1)
    file = saved_pdparams(net, tmp_path / "model.pdparams")
    fresh = paddle.nn.Sequential(paddle.nn.Linear(3, 2), paddle.nn.BatchNorm1D(2))
    ck.load_weights(fresh, file)
    assert_bitwise(weights(fresh), weights(net))


def test_load_weights_reads_a_pdparams_without_unpickling_objects(tmp_path):
    file = tmp_path / "model.pdparams"
    with open(file, "wb") as f:
        pickle.dump({"fc.weight": Payload(), "fc.bias": np.zeros(2, np.float32)}, f, protocol=4)
    UNPICKLED.clear()
    paddle.load(str(file))                                      # control: Paddle's loader runs it
    assert UNPICKLED == ["payload ran"]
    UNPICKLED.clear()
    with pytest.raises(ck.CheckpointError, match="refusing to load .*_record_unpickling") as err:
        ck.load_weights(Net(), file)
    assert "could run code" in one_line(err)
    assert UNPICKLED == []


@pytest.mark.parametrize("content, match", [
    (b"", "is not a file paddle.save wrote"),
    (b"PK\x03\x04 a zip", "is not a file paddle.save wrote"),
    (b"\x80\x04 half a pickle", "cannot read .*paddle.save"),
    (pickle.dumps([np.zeros(2)], protocol=4), "holds a list, not a state dict"),
    (pickle.dumps({"fc.weight": np.zeros((3, 2), np.float32), "epoch": 3}, protocol=4),
     r"holds entries that are not weights \(epoch\)"),
])
def test_load_weights_refuses_a_file_that_is_not_a_state_dict(tmp_path, content, match):
    file = tmp_path / "model.pdparams"
    file.write_bytes(content)
    with pytest.raises(ck.CheckpointError, match=match) as err:
        ck.load_weights(Net(), file)
    assert str(file) in one_line(err)


def test_load_weights_of_a_missing_path_says_what_it_takes(tmp_path):
    with pytest.raises(ck.CheckpointError, match="not found; give a .pdparams file, a checkpoint") as err:
        ck.load_weights(Net(), tmp_path / "nowhere")
    one_line(err)
    with pytest.raises(ck.CheckpointError, match="no checkpoint in"):
        ck.load_weights(Net(), tmp_path)


def test_an_o2_models_16_bit_weights_resume_from_the_float32_they_were_saved_as(tmp_path):
    """O2 keeps bfloat16 weights and saves them as float32 (amp.decorate's save_dtype):
    resuming puts the very same 16-bit values back."""
    from paddle_dist.checkpoint.weights import put_weights

    trained = models.build("mlp")
    trained.to(dtype="bfloat16")
    as_saved = {k: v.astype("float32").numpy() for k, v in trained.state_dict().items()}
    resumed = models.build("mlp")
    resumed.to(dtype="bfloat16")
    put_weights(as_saved, resumed, "checkpoint x", "checkpoint")
    for k, v in resumed.state_dict().items():
        assert v.dtype == paddle.bfloat16
        assert np.array_equal(v.astype("float32").numpy(), as_saved[k])
    # a dtype that is not a float width of the model's is still refused
    with pytest.raises(ck.CheckpointError, match="dtype"):
        put_weights({k: v.astype(np.int32) for k, v in as_saved.items()}, resumed, "checkpoint x", "checkpoint")
