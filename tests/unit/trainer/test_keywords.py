"""Inputs by name (trainer/keywords.py): a dict sample's fields reach forward as keywords,
in the loop's Feed and through paddle.Model's positional call."""

import paddle
import pytest
from paddle.static import InputSpec

from paddle_dist.errors import DataError
from paddle_dist.trainer.feed import Feed
from paddle_dist.trainer.keywords import ByName, Named, Signature, keyword_names


class LlamaOrder(paddle.nn.Layer):
    """A Llama's argument order: the mask third, after position_ids."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 3)

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        assert position_ids is None, "the mask reached position_ids"
        assert attention_mask is not None and float(attention_mask.sum()) == 5.0
        return self.fc(input_ids)


def llama_batch():
    mask = paddle.to_tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    return {"input_ids": paddle.ones([2, 4]), "attention_mask": mask, "labels": paddle.zeros([2, 1], "int64")}


def test_dict_samples_named_like_a_llamas_forward_reach_their_parameters():
    batch = llama_batch()
    for feed in (Feed(LlamaOrder()),
                 Feed(LlamaOrder(), inputs=[InputSpec([None, 4], "float32", "input_ids"),
                                            InputSpec([None, 4], "float32", "attention_mask")])):
        inputs, labels = feed.split(batch)
        assert inputs.names == ("input_ids", "attention_mask") and labels == [batch["labels"]]
        assert list(feed.outputs(LlamaOrder(), inputs, labels)[0].shape) == [2, 3]


def test_a_name_forward_does_not_take_is_refused_in_one_line_with_its_parameters():
    batch = llama_batch()
    batch["attn_mask"] = batch.pop("attention_mask")
    feed = Feed(LlamaOrder(), inputs=[InputSpec([None, 4], "float32", "input_ids"),
                                      InputSpec([None, 4], "float32", "attn_mask")])
    with pytest.raises(DataError) as found:
        feed.split(batch)
    line = str(found.value)
    assert "\n" not in line and "attn_mask" in line
    assert "input_ids, position_ids, attention_mask" in line


def test_names_forward_does_not_take_at_all_pick_the_keys_and_go_by_position():
    class OneInput(paddle.nn.Layer):
        def forward(self, x):
            return x

    batch = {"img": paddle.ones([2, 3]), "label": paddle.zeros([2, 1])}
    inputs, labels = Feed(OneInput(), inputs=[InputSpec([None, 3], "float32", "img")]).split(batch)
    assert keyword_names(inputs) == () and inputs == [batch["img"]] and labels == [batch["label"]]


def test_a_forward_with_kwargs_takes_any_name_beside_its_own():
    class Open(paddle.nn.Layer):
        def forward(self, x, **extra):
            return x * extra["scale"]

    assert Signature.of(Open()).by_keyword(["x", "scale"])
    batch = {"x": paddle.ones([2]), "scale": paddle.full([2], 3.0), "y": paddle.ones([2])}
    feed = Feed(Open(), inputs=["x", "scale"])
    inputs, labels = feed.split(batch)
    assert float(feed.outputs(Open(), inputs, labels)[0].sum()) == 6.0


def test_a_model_with_its_own_loss_gets_the_labels_by_name_too():
    class OwnLoss(paddle.nn.Layer):
        def forward(self, input_ids, attention_mask=None, labels=None):
            return (input_ids * attention_mask - labels).abs().mean()

    batch = {"labels": paddle.ones([2, 2]), "attention_mask": paddle.ones([2, 2]), "input_ids": paddle.ones([2, 2])}
    feed = Feed(OwnLoss(), labels=["labels"], model_loss=True)
    inputs, labels = feed.split(batch)
    assert keyword_names(inputs, labels) == ("input_ids", "attention_mask", "labels")
    assert float(feed.loss_and_outputs(OwnLoss(), None, inputs, labels)[0]) == 0.0


def test_every_key_taken_by_forward_leaves_the_loss_no_labels_and_the_hint_says_so():
    class TakesAll(paddle.nn.Layer):
        def forward(self, input_ids, labels=None):
            return input_ids

    batch = {"input_ids": paddle.ones([2, 2]), "labels": paddle.zeros([2, 1], "int64")}
    hint = Feed(TakesAll()).dict_hint(batch)
    assert "loss gets no labels" in hint and "'labels'" in hint
    assert Feed(TakesAll(), labels=["labels"]).split(batch)[1] == [batch["labels"]]


def test_paddle_models_positional_call_goes_by_name_and_the_state_dict_keeps_its_keys():
    net = LlamaOrder()
    wrapped = ByName(net, ("input_ids", "attention_mask"))
    assert list(wrapped.state_dict()) == list(net.state_dict())
    assert [id(p) for p in wrapped.parameters()] == [id(p) for p in net.parameters()]
    batch = llama_batch()
    assert list(wrapped(batch["input_ids"], batch["attention_mask"]).shape) == [2, 3]
    wrapped.eval()
    assert not net.training


def test_named_is_a_list_with_names():
    named = Named([1, 2], ["a", "b"])
    assert named == [1, 2] and named.names == ("a", "b") and keyword_names(named, [3]) == ("a", "b")
