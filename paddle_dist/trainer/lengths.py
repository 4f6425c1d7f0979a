"""One warning when a batch is longer than the model's declared maximum length
(`config.max_position_embeddings` and the like), once per run: positions past it have no
trained embedding (a learned table reads out of range, a rotary one extrapolates), and
training goes on without an error.

Example:
    watch = LengthWatch.of(model)       # reads config.max_position_embeddings, ...
    watch.see(inputs)                   # warns once for a longer batch
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional, Sequence

import paddle

# The attributes a model, or its `config`, declares its longest sequence by, most specific
# first: a PaddleFormers or Hugging Face config's `max_length` is the generation length.
MAX_LENGTH_NAMES = ("max_position_embeddings", "max_seq_len", "max_sequence_length", "max_length")


@dataclass
class LengthWatch:
    """The model's declared maximum length (`limit`, named `said`) and whether a longer
    batch was seen yet: the first one is logged once, as a warning, by the rank reading it."""

    limit: Optional[int] = None
    said: str = ""
    owner: str = "the model"
    warned: bool = False

    @classmethod
    def of(cls, model) -> "LengthWatch":
        config = getattr(model, "config", None)
        for name in MAX_LENGTH_NAMES:
            for where, holder in (("", model), ("config.", config)):
                value = _declared(holder, name)
                if value is not None:
                    return cls(value, f"{where}{name}", type(model).__name__)
        return cls()

    def see(self, inputs: Sequence) -> None:
        """Warn, once, when the batch's token ids (its first integer input [batch, length])
        are longer than the limit."""
        if self.limit is None or self.warned:
            return
        ids = next((x for x in inputs if isinstance(x, paddle.Tensor) and len(x.shape) == 2
                    and x.dtype in (paddle.int64, paddle.int32)), None)
        if ids is not None and ids.shape[1] > self.limit:
            self.warned = True
            logging.getLogger("paddle_dist").warning(
                f"paddle_dist: a batch of sequences of length {ids.shape[1]} is longer than "
                f"{self.owner}'s declared maximum length ({self.said} = {self.limit}): positions past it "
                "have no trained embedding, or wrap; cut the sequences to it (said once per run)")


def _declared(holder, name: str) -> Optional[int]:
    if holder is None:
        return None
    value = holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
