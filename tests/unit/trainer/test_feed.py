"""How a batch reaches the model and the loss (trainer/feed.py): the split by forward's names, InputSpecs, dicts, a model's own loss."""

import paddle
import pytest
from paddle.static import InputSpec

from paddle_dist.errors import DataError
from paddle_dist.trainer.feed import Feed


class TwoInputs(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(3, 2)

    def forward(self, ids, length, scale=1.0):
        return self.fc(ids) * length.unsqueeze(-1) * scale


def t(*shape, dtype="float32"):
    return paddle.ones(list(shape), dtype=dtype)


def test_a_tuple_batch_gives_forwards_arguments_without_default_then_the_labels():
    feed = Feed(TwoInputs())
    inputs, labels = feed.split([t(4, 3), t(4), t(4, 1, dtype="int64")])
    assert [list(x.shape) for x in inputs] == [[4, 3], [4]] and [list(y.shape) for y in labels] == [[4, 1]]


def test_counts_and_input_specs_set_the_split():
    assert len(Feed(paddle.nn.Linear(3, 2), inputs=2).split([t(2, 3), t(2, 3), t(2, 1)])[0]) == 2
    specs = [InputSpec([None, 3], "float32", "a")]
    inputs, labels = Feed(TwoInputs(), inputs=specs, labels=1).split([t(2, 3), t(2, 1), t(2, 5)])
    assert len(inputs) == 1 and [list(y.shape) for y in labels] == [[2, 1]]


def test_a_dict_batch_is_taken_by_forwards_names_and_the_other_keys_are_labels():
    feed = Feed(TwoInputs())
    batch = {"mask": t(2, 1), "length": t(2), "ids": t(2, 3)}
    inputs, labels = feed.split(batch)
    assert inputs[0] is batch["ids"] and inputs[1] is batch["length"] and labels == [batch["mask"]]


def test_a_dict_batch_by_input_spec_names_and_label_names():
    feed = Feed(paddle.nn.Linear(3, 2), inputs=[InputSpec([None, 3], name="image")],
                labels=[InputSpec([None], name="mask")])
    batch = {"image": t(2, 3), "mask": t(2), "weights": t(2)}
    assert feed.split(batch) == ([batch["image"]], [batch["mask"]])
    with pytest.raises(DataError, match="labels name"):
        Feed(paddle.nn.Linear(3, 2), inputs=[InputSpec([None, 3], name="image")],
             labels=[InputSpec([None], name="label")]).split({"image": t(2, 3)})


def test_a_dict_whose_keys_name_no_argument_is_split_in_sorted_key_order_as_hapi_flattens_it():
    inputs, labels = Feed(paddle.nn.Linear(3, 2)).split({"b": t(2, 1), "a": t(2, 3)})
    assert list(inputs[0].shape) == [2, 3] and list(labels[0].shape) == [2, 1]


def test_split_batch_and_a_too_short_batch():
    x = t(2, 3)
    assert Feed(paddle.nn.Linear(3, 2), split_batch=lambda b: (b["x"], None)).split({"x": x}) == ([x], [])
    with pytest.raises(DataError, match="takes 2 input"):
        Feed(TwoInputs()).split([t(2, 3)])
    with pytest.raises(DataError, match="split_batch must return"):
        Feed(TwoInputs(), split_batch=lambda b: b).split([t(2, 3)] * 3)


def test_a_model_with_its_own_loss_gets_the_labels_and_its_extra_outputs_go_to_the_metrics():
    class Own(paddle.nn.Layer):
        def forward(self, x, y):
            return {"loss": (x - y).pow(2).mean(), "pred": x}

    feed = Feed(Own(), inputs=1, model_loss=True)
    inputs, labels = feed.split([t(2, 3), t(2, 3) * 3])
    loss, _, outputs = feed.loss_and_outputs(Own(), None, inputs, labels)
    assert float(loss) == 4.0 and len(outputs) == 1
    # a training batch's (inputs, labels), as the check before epoch 1 found them
    assert feed.hapi_inputs((1, 1)) == 2      # paddle.Model hands the network the labels too
    with pytest.raises(DataError, match="no 'loss'"):
        feed.loss_of(None, [{"pred": t(1)}], [])
