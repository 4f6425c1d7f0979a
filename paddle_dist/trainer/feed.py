"""How a batch reaches the model, the loss and the metrics, at both API levels.

A batch is what the DataLoader's collate made of the samples: a list of tensors (tuple
samples), a dict of tensors (dict samples) or one tensor. `Feed` splits it into the
model's inputs and the labels by paddle.Model's rule: the first `inputs` fields are the
model's inputs, the rest its labels, where `inputs` is a count or a list of
`paddle.static.InputSpec` and defaults to the model's `forward` arguments. A dict sample
is taken by name: the inputs are the keys that the InputSpecs, or else `forward`'s
parameters, name; the labels are the `labels` InputSpecs' keys, or else every other key.
Inputs named after `forward`'s parameters go to it as keywords (keywords.py): a Llama's
`forward(input_ids, position_ids=None, attention_mask=None)` gets the mask as its mask.
What the rule cannot express, a function `split_batch(batch) -> (inputs, labels)` does.
With `loss="model"` the model computes its own loss: it gets the inputs and the labels,
and returns the loss (a scalar tensor, a tuple whose first item is the loss, or a dict
with a "loss" item); the rest of a tuple goes to the metrics.

Then the loss is `loss(*outputs, *labels)` and a metric's `compute(*outputs, *labels)`,
as under paddle.Model.

Example:
    feed = Feed(net, inputs=[InputSpec([None, 32], "int64", "ids"), InputSpec([None], "int64", "length")])
    inputs, labels = feed.split([ids, length, label])      # [ids, length], [label]
    loss, parts, outputs = feed.loss_and_outputs(net, loss_fn, inputs, labels)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from ..errors import ConfigError, DataError
from .keywords import Named, Signature, keyword_names
from .weighting import counted_labels
from .lengths import LengthWatch

MODEL_LOSS = "model"        # fit(loss="model"): the model returns its own loss


class Feed:
    """The split of a batch into (inputs, labels), and the model and loss calls on them."""

    def __init__(self, model: paddle.nn.Layer, inputs=None, labels=None,
                 split_batch: Optional[Callable] = None, model_loss: bool = False):
        self.split_batch, self.model_loss = split_batch, model_loss
        self.signature = Signature.of(model)
        arguments = list(self.signature.required)
        self.spec_names = _names(inputs)
        self.input_names = self.spec_names or arguments
        self.label_names = _names(labels)
        self.input_count = _count(inputs, "inputs") or max(len(arguments), 1)
        self.label_count = _count(labels, "labels")
        self.lengths = LengthWatch.of(model)     # config.max_position_embeddings and the like

    def split(self, batch) -> Tuple[List[paddle.Tensor], List[paddle.Tensor]]:
        """(inputs, labels) of one collated batch; the first batch longer than the model's
        declared maximum length is warned of, once (lengths.LengthWatch)."""
        inputs, labels = self._split(batch)
        self.lengths.see(inputs)
        return inputs, labels

    def _split(self, batch):
        if self.split_batch is not None:
            return _split_result(self.split_batch(batch))
        if isinstance(batch, dict):
            return self._split_dict(batch)
        fields = _flatten(batch)
        inputs, rest = fields[:self.input_count], fields[self.input_count:]
        if len(inputs) < self.input_count:
            raise DataError(f"a batch has {len(fields)} field(s) ({describe(fields)}) but the model "
                            f"takes {self.input_count} input(s); give fit() inputs= (a count or "
                            "InputSpecs) or split_batch=")
        labels = rest[:self.label_count] if self.label_count else rest
        return inputs, labels

    def _split_dict(self, batch: dict):
        names = self._dict_names(batch)
        if names is None:          # hapi's rule: the values in key order, the first ones the inputs
            return self._split(_flatten([batch[k] for k in sorted(batch)]))
        if self.label_names:
            missing = [n for n in self.label_names if n not in batch]
            if missing:
                raise DataError(f"a batch has keys {sorted(batch)} but the labels name {missing}; "
                                "give fit() labels= InputSpecs named after the sample's keys")
            keys = list(self.label_names)
        else:
            keys = [key for key in batch if key not in names]
        inputs, labels = [batch[n] for n in names], [batch[k] for k in keys]
        # By name (keywords.py): the inputs, and a model's own loss's labels, keep their keys.
        if not self.signature.by_keyword(names + (keys if self.model_loss else [])):
            return inputs, _flatten(labels)
        return Named(inputs, names), (Named(labels, keys) if self.model_loss else _flatten(labels))

    def _dict_names(self, batch: dict) -> Optional[List[str]]:
        """The keys of a dict batch that are the model's inputs, in the order given: the
        InputSpecs' names, or else the keys that name forward's parameters (the labels'
        excepted), in forward's order; None when the batch is split by position."""
        if self.spec_names:
            return self.spec_names if all(n in batch for n in self.spec_names) else None
        if not all(n in batch for n in self.signature.required):
            return None
        names = [n for n in self.signature.named or self.signature.required
                 if n in batch and n not in self.label_names]
        return names or None

    def dict_hint(self, batch) -> str:
        """For a dict batch split by position because no key is named after `forward`'s
        arguments (nor given InputSpecs): its keys with their types, and the fix; for one
        whose every key goes to forward by name, which leaves the loss no labels: how to
        name them; else ""."""
        if self.split_batch is not None or not isinstance(batch, dict):
            return ""
        names = self._dict_names(batch)
        if names and not self.model_loss and not self.label_names and set(batch) <= set(names):
            label = next((n for n in names if "label" in n), names[-1])
            return (f"; forward takes every key of the samples ({', '.join(names)}) by name, so the "
                    f"loss gets no labels: name them, e.g. fit(..., labels=[{_spec_or_name(label, batch[label])}])")
        if names:
            return ""
        tensors = [k for k, v in batch.items() if hasattr(v, "shape")]
        fix = (f"inputs=[{spec_text(tensors[0], batch[tensors[0]])}]" if tensors else "inputs=") + (
            f", labels=[{spec_text(tensors[1], batch[tensors[1]])}]" if len(tensors) > 1 else "")
        keys = "; ".join(f"{k}: {describe([v]) if hasattr(v, 'shape') else type(v).__name__}"
                         for k, v in batch.items())
        return (f"; the samples are dicts with keys {keys}, none named after forward's arguments "
                f"({', '.join(self.input_names) or 'none'}), so they were split by position: "
                f"name the model's inputs and the labels, e.g. fit(..., {fix})")

    def outputs(self, model, inputs: Sequence, labels: Sequence) -> List[Any]:
        """The model's outputs as a list (the labels go in too when it computes the loss),
        16-bit ones widened to float32 (`widened`)."""
        given = [*inputs, *labels] if self.model_loss else list(inputs)
        names = keyword_names(inputs, labels if self.model_loss else ())
        returned = model(**dict(zip(names, given))) if names else model(*given)
        return widened(_as_list(returned))

    def loss_and_outputs(self, model, loss_fn, inputs, labels):
        """(the mean loss, its parts, the outputs the metrics get): `loss_fn(*outputs,
        *labels)`, or the model's own loss."""
        outputs = self.outputs(model, inputs, labels)
        loss, parts = self.loss_of(loss_fn, outputs, labels)
        return loss, parts, (self._rest(outputs) if self.model_loss else outputs)

    def evaluated(self, model, loss_fn, inputs, labels, with_loss: bool = True, ignore_index: Optional[int] = None):
        """(the mean loss or None, the outputs the metrics get, the loss's count or None:
        counted_loss) of an evaluation batch: no loss when `with_loss` is false
        (train.eval_loss), nor from a model with its own loss (loss="model") that returns
        none in evaluation (a detector's detections: a first output that is no scalar, or a
        dict without "loss"): then all its outputs go to the metrics."""
        outputs = self.outputs(model, inputs, labels)
        if self.model_loss and not returns_loss(outputs):
            return None, (list(outputs[0].values()) if isinstance(outputs[0], dict) else outputs), None
        loss, count = None, None
        if with_loss:
            loss, _, count = self.counted_loss(loss_fn, outputs, labels, ignore_index, inputs)
        return loss, (self._rest(outputs) if self.model_loss else outputs), count

    def eval_rule(self, with_loss: bool, returns: bool = True) -> str:
        """The start line's words for what evaluation computes (`returns`: whether the
        model's evaluation returned a loss, as the check before epoch 1 found)."""
        if self.model_loss and not returns:
            return ("the metrics on all the model's outputs: it returns no loss in evaluation "
                    "(loss='model'), so there is no eval loss")
        if not with_loss:
            return "the metrics alone, no loss on evaluation batches (train.eval_loss=false)"
        return "the loss and the metrics" + (" (the model's own loss)" if self.model_loss else "")

    def loss_of(self, loss_fn, outputs: Sequence, labels: Sequence) -> Tuple[Any, Dict[str, Any]]:
        """(the mean loss, its parts by name, {} without): counted_loss without the count."""
        return self.counted_loss(loss_fn, outputs, labels)[:2]

    def counted_loss(self, loss_fn, outputs: Sequence, labels: Sequence, ignore_index: Optional[int] = None,
                     inputs: Sequence = ()) -> Tuple[Any, Dict[str, Any], Any]:
        """(the mean loss, its parts by name ({} without), its count): `loss_fn(*outputs,
        *labels)`, or the model's own (loss_parts). The count, how many items the mean is
        over (weighting.py), is a returned dict's "count" (never a part); else, with
        `ignore_index` (train.loss_count=labels), the labels that are not it (the field
        named `labels` among the labels or the `inputs`, else the first label); else None."""
        returned = loss_fn(*outputs, *labels) if not self.model_loss else _own_loss(outputs[0])
        count = None
        if isinstance(returned, dict) and "count" in returned:
            returned = dict(returned)
            count = returned.pop("count")
        loss, parts = loss_parts(returned)
        if count is None and ignore_index is not None:
            count = counted_labels(inputs, labels, ignore_index)
        return loss, parts, count

    @staticmethod
    def _rest(outputs: Sequence) -> List[Any]:
        first = outputs[0]
        if isinstance(first, dict):
            return [v for k, v in first.items() if k not in ("loss", "count")]
        return list(outputs[1:])

    def hapi_inputs(self, fields: Optional[Tuple[int, int]] = None) -> int:
        """How many of a batch's fields paddle.Model gives the network (its `inputs`): the
        inputs, and the labels too when the model computes its loss. `fields`: a training
        batch's (inputs, labels), as the check before epoch 1 found them."""
        inputs, labels = fields or (self.input_count, 0)
        return inputs + labels if self.model_loss else inputs


def spec_text(name: str, value) -> str:
    """The code of an InputSpec naming a batch's field `name` after its value's shape (the
    batch dimension left open) and dtype: what a hint can suggest to paste, since Paddle's
    InputSpec takes no name without a shape.

    Example:
        spec_text("img", paddle.ones([8, 3, 32, 32]))   # "paddle.static.InputSpec([None, 3, 32, 32], 'float32', 'img')"
    """
    shape = [None, *(int(d) for d in list(value.shape)[1:])]
    dtype = str(value.dtype).replace("paddle.", "")
    return f"paddle.static.InputSpec({shape}, {dtype!r}, {name!r})"


def _spec_or_name(name: str, value) -> str:
    return spec_text(name, value) if hasattr(value, "shape") else repr(name)


def to_float(value: Any) -> float:
    """A loss or metric value as a Python float: a tensor's value, a bfloat16 one's too
    (its .numpy() gives the bits, as uint16)."""
    if isinstance(value, paddle.Tensor):
        value = value.astype("float32").numpy()
    return float(np.asarray(value).reshape(-1)[0])


def batch_size_of(inputs: Sequence) -> int:
    """Samples in a batch: the first input's first dimension."""
    first = inputs[0] if inputs else None
    return int(first.shape[0]) if first is not None and len(first.shape) else 1


def describe(fields) -> str:
    """`float32 [8, 3, 32, 32], int64 [8, 1]`: what a batch holds, for error messages."""
    if isinstance(fields, dict):
        return ", ".join(f"{k} {describe([v])}" for k, v in fields.items())
    words = []
    for value in _flatten(fields):
        dtype = str(getattr(value, "dtype", type(value).__name__)).replace("paddle.", "")
        words.append(f"{dtype} {list(getattr(value, 'shape', []))}")
    return ", ".join(words)


def widened(value):
    """`value` (a tensor, or lists, tuples and dicts of them) with its float16 and bfloat16
    tensors cast to float32, exactly. An O2 model's last layer hands out 16-bit outputs on
    a GPU: the loss and the metrics take them in float32 (outside autocast, a bfloat16
    cross-entropy has no kernel on Paddle 2.6's GPUs, and on 3.x its loss would be a
    bfloat16 whose numpy() is raw bits)."""
    if isinstance(value, paddle.Tensor):
        return value.astype("float32") if value.dtype in (paddle.float16, paddle.bfloat16) else value
    if isinstance(value, (list, tuple)):
        return type(value)(widened(v) for v in value)
    if isinstance(value, dict):
        return {k: widened(v) for k, v in value.items()}
    return value


def returns_loss(outputs: Sequence) -> bool:
    """Whether a model with its own loss returned one: a dict with "loss", or a first
    output that is a one-element tensor."""
    first = outputs[0] if outputs else None
    if isinstance(first, dict):
        return "loss" in first
    return isinstance(first, paddle.Tensor) and int(np.prod(first.shape)) == 1


def loss_parts(loss) -> Tuple[Any, Dict[str, Any]]:
    """(the mean loss, its parts as detached float64 means by name) of what a loss function
    returned: a tensor (no parts); a list or tuple of terms, summed as paddle.Model sums
    them (parts loss_0, loss_1, ...); a dict with "loss" and its parts (PaddleDetection's
    {"loss", "loss_cls", "loss_box"}), or of parts alone, summed.

    Example:
        loss_parts({"loss_cls": a, "loss_box": b})    # (a + b, {"loss_cls": a, "loss_box": b})
    """
    if isinstance(loss, dict):
        if not loss:
            raise DataError("the loss returned an empty dict; return the loss, or a dict of its parts")
        named = {k: _scalar(v) for k, v in loss.items()}
        total = named.pop("loss") if "loss" in named else paddle.add_n(list(named.values()))
        return total, {k: v.detach().astype("float64") for k, v in named.items()}
    if isinstance(loss, (list, tuple)) and len(loss) > 1:
        return _scalar(loss), {f"loss_{i}": paddle.sum(term).detach().astype("float64")    # as _scalar sums them
                               for i, term in enumerate(loss)}
    return _scalar(loss), {}


def _own_loss(first):
    """What a model with its own loss returned of it: a scalar, or a dict's loss, parts
    and count."""
    if not isinstance(first, dict):
        return _scalar(first)
    if "loss" not in first:
        raise DataError(f"loss='model': the model returned a dict with keys {sorted(first)} "
                        "but no 'loss'; return the loss, a tuple (loss, ...) or a dict with 'loss'")
    return {k: v for k, v in first.items() if k in ("loss", "count") or k.startswith("loss_")}


def _scalar(loss):
    if isinstance(loss, (list, tuple)):           # a loss with several terms: their sum, as hapi
        loss = paddle.add_n([paddle.sum(term) for term in loss]) if len(loss) > 1 else loss[0]
    return loss.mean() if int(np.prod(loss.shape)) != 1 else loss.reshape([])


def _as_list(value) -> List[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flatten(value) -> List[Any]:
    if isinstance(value, (list, tuple)):
        return [item for part in value for item in _flatten(part)]
    if isinstance(value, dict):
        return [item for key in sorted(value) for item in _flatten(value[key])]
    return [value]


def _split_result(result):
    if not (isinstance(result, (list, tuple)) and len(result) == 2):
        raise DataError(f"split_batch must return (inputs, labels), got {type(result).__name__}")
    inputs, labels = result
    return _as_list(inputs), ([] if labels is None else _as_list(labels))


def _names(spec) -> List[str]:
    if isinstance(spec, (list, tuple)):
        names = [getattr(s, "name", None) if not isinstance(s, str) else s for s in spec]
        return names if all(names) else []
    return []


def _count(spec, what: str) -> int:
    if spec is None:
        return 0
    if isinstance(spec, bool) or not isinstance(spec, (int, list, tuple)):
        raise ConfigError(f"fit({what}=...) takes a count or a list of paddle.static.InputSpec, "
                          f"not {type(spec).__name__}")
    count = spec if isinstance(spec, int) else len(spec)
    if count < (1 if what == "inputs" else 0):
        raise ConfigError(f"fit({what}={spec!r}): the model needs at least one input")
    return count

