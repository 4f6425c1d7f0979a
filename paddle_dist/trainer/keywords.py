"""Inputs by name: a dict sample's fields reach `forward` as keywords, at both API levels.

A Llama's `forward(input_ids, position_ids=None, attention_mask=None, ...)` takes the mask
third: handed {input_ids, attention_mask} by position, it would read the mask as
`position_ids` and train on without an error. So when a dict batch is split by name
(feed.py), the inputs keep their names (`Named`) and the model is called with keywords:
the loop's Feed.outputs calls `model(**{name: value})`, and paddle.Model, which calls its
network by position, is handed `ByName(net, names)`, which turns its positions back into
the names. A name `forward` does not take is refused in one line that lists its
parameters, unless `forward` takes **kwargs; names none of which `forward` takes only pick
the sample's keys, and go in by position, as paddle.Model's InputSpec names do.

Example:
    signature = Signature.of(net)            # Signature(required=('input_ids',), named=(...), ...)
    signature.by_keyword(["input_ids", "attention_mask"])    # True
    inputs = Named([ids, mask], ["input_ids", "attention_mask"])
    keyword_names(inputs, [])                # ('input_ids', 'attention_mask')
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence, Tuple

import paddle

from ..errors import DataError


class Named(list):
    """Values taken from a dict batch by name: a list, as every split gives them, that also
    knows the names `forward` takes them by (`names`, one per value)."""

    def __init__(self, values, names: Sequence[str]):
        super().__init__(values)
        self.names = tuple(names)


def keyword_names(inputs: Sequence, labels: Sequence = ()) -> Tuple[str, ...]:
    """The names the model gets `inputs` (then `labels`, for a model with its own loss) by,
    or () when it gets them by position.

    Example:
        keyword_names(Named([ids], ["input_ids"]), Named([y], ["labels"]))   # ('input_ids', 'labels')
    """
    names = getattr(inputs, "names", None)
    if names is None:
        return ()
    return names + (getattr(labels, "names", ()) if len(labels) else ())


@dataclass(frozen=True)
class Signature:
    """What `forward` takes: `required`, the arguments without a default (what a call must
    give); `named`, the parameters a caller can name, in order (none when it has
    positional-only ones: then it is called by position, as before); `open`, whether it
    takes **kwargs; `owner`, the model's class name for messages."""

    required: Tuple[str, ...] = ()
    named: Tuple[str, ...] = ()
    open: bool = False
    owner: str = "the model"

    @classmethod
    def of(cls, model) -> "Signature":
        try:
            parameters = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError):
            return cls()
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        required = tuple(p.name for p in parameters if p.default is p.empty and p.kind in positional)
        nameable = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        only = any(p.kind == inspect.Parameter.POSITIONAL_ONLY for p in parameters)
        named = () if only else tuple(p.name for p in parameters if p.kind in nameable)
        return cls(required, named, any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters),
                   type(model).__name__)

    def by_keyword(self, names: Sequence[str]) -> bool:
        """Whether a batch's fields called `names` go to forward by name: all of them are its
        parameters (or some are and it takes **kwargs). None of them: by position, the names
        only picked the keys. Some: DataError, naming the ones it does not take."""
        if not self.named or not names:
            return False
        foreign = [n for n in names if n not in self.named]
        if not foreign or (self.open and len(foreign) < len(names)):
            return True
        if len(foreign) == len(names):
            return False
        raise DataError(f"the batch's field(s) {', '.join(foreign)} go to {self.owner}.forward by name, "
                        f"but it takes no such parameter (its parameters: {', '.join(self.named)}); "
                        "rename the samples' keys (or the InputSpecs) after them, or give split_batch=")


class ByName(paddle.nn.Layer):
    """`net` called with keywords: paddle.Model calls its network with the batch's fields by
    position (hapi's train_batch: `network(*inputs)`), and this hands them to `net` under
    `names`. `net` is its one sublayer, so paddle.Model and its DataParallel train the very
    same parameters; its state_dict is `net`'s, with the same keys (no `net.` prefix), so
    whatever saves or loads through paddle.Model sees the user's model. `net`'s own forward
    hooks (the plan's autocast) run, since `net` is called, not its forward.

    Example:
        model = paddle.Model(ByName(net, ("input_ids", "attention_mask")), inputs=specs)
    """

    def __init__(self, net: paddle.nn.Layer, names: Sequence[str]):
        super().__init__()
        self.net, self.names = net, tuple(names)

    def forward(self, *fields):
        return self.net(**dict(zip(self.names, fields)))

    def state_dict(self, *args, **kwargs):
        return self.net.state_dict(*args, **kwargs)

    def set_state_dict(self, *args, **kwargs):
        return self.net.set_state_dict(*args, **kwargs)
