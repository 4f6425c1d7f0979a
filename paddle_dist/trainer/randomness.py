"""Randomness inside the forward pass (dropout) that does not depend on the world size.

Before each training micro-batch's forward, Paddle's generators are seeded from (the run's
train.seed, the optimizer step, the micro-batch's position in that step of the data
plan, sampling.py). The position is the plan's, not the rank's: on W ranks of k
micro-batches, rank r's j-th micro-batch of a step is position r * k + j, which is the
same micro-batch (the same samples) as position r * k + j on W' ranks. So a micro-batch
gets the same dropout masks whichever rank trains it, on any number of ranks and after a
resume, at both API levels. Before, every rank drew from one stream seeded alike: two
ranks drew the same masks for different samples, and one rank of two micro-batches drew
the second's masks where the first's ended.

What this cannot cover: a model that draws from a generator of its own (Paddle's
`get_rng_state_tracker()` of model parallelism, or a `paddle.Generator` it made), and
Python's or numpy's generators called inside forward. `describe` names what it sees.

Example:
    draws = MicroBatchDraws(seed=2024, rank=1)
    draws.seed(step=12, index=0, share=2)     # position 2 of step 12: rank 1's first of 2
"""

from __future__ import annotations

import hashlib
from typing import List

import paddle

# The layers that draw from Paddle's global generator in training (F.dropout and the like,
# called by a forward of the user's own, draw from it too and are covered alike).
DROPOUTS = tuple(getattr(paddle.nn, name) for name in
                 ("Dropout", "Dropout2D", "Dropout3D", "AlphaDropout", "FeatureAlphaDropout")
                 if hasattr(paddle.nn, name))


def micro_batch_key(seed: int, step: int, position: int) -> int:
    """The generator seed of micro-batch `position` of optimizer step `step` (0-based, the
    run's count): a 63-bit digest, so neighbouring steps share no stream.

    Example:
        micro_batch_key(2024, 12, 2)      # the same number on every rank and attempt
    """
    digest = hashlib.blake2b(f"{int(seed)}:{int(step)}:{int(position)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2 ** 63 - 1)


class MicroBatchDraws:
    """Seeds Paddle's generators before each training micro-batch (module docstring)."""

    def __init__(self, seed: int, rank: int):
        self.base, self.rank = int(seed), int(rank)

    def seed(self, step: int, index: int, share: int) -> None:
        """Before the forward of this rank's micro-batch `index` of `share` in optimizer
        step `step` (the run's global step count before the step)."""
        paddle.seed(micro_batch_key(self.base, step, self.rank * share + index))


def random_layers(model: paddle.nn.Layer) -> List[str]:
    """The names of `model`'s dropout layers (what the continuation line names)."""
    return [name or type(layer).__name__ for name, layer in model.named_sublayers(include_self=True)
            if isinstance(layer, DROPOUTS) and getattr(layer, "p", 0)]


def own_generators() -> List[str]:
    """The named generators of Paddle's model-parallel RNG tracker, if any were added:
    their draws are not seeded per micro-batch."""
    try:
        from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker
        return sorted(getattr(get_rng_state_tracker(), "states_", {}) or {})
    except (ImportError, AttributeError):
        return []


def describe(model: paddle.nn.Layer) -> str:
    """What a continuation on another number of ranks says of the model's randomness
    ("" when it has no dropout nor generator of its own).

    Example:
        describe(net)  # "dropout in 'head.drop' draws per micro-batch ... at any number of ranks"
    """
    layers, own = random_layers(model), own_generators()
    words = []
    if layers:
        named = ", ".join(map(repr, layers[:3])) + (f" and {len(layers) - 3} more" if len(layers) > 3 else "")
        words.append(f"dropout in {named} draws per micro-batch from (train.seed, step, micro-batch): "
                     "the same masks as on the run's first ranks")
    if own:
        words.append(f"the model's own generators ({', '.join(own)}) are not seeded per micro-batch: "
                     "their draws differ from the first ranks', so the run is not exact")
    return "; ".join(words)
