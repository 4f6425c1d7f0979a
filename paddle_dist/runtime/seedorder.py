"""Whether a model's weights were made before the job seeded Paddle: then they are drawn
from an unseeded generator, and two runs of one command start from other weights.

Paddle names a parameter from a counter per key in `paddle.utils.unique_name`: a Linear
is layer `linear_3` (key `linear`), its weight `linear_3.w_0` (key `linear_3.w`, number
0). The counters are kept when paddle_dist first seeds this process; a parameter whose
number is below its key's count then was made before that seed. A process whose Paddle
the user had seeded first (paddle.seed) is reproducible whatever the order: nothing is
kept, nothing is said.

Example:
    note_seed()                      # in seed_everything, before paddle.seed
    line = made_before_seed(net, 42) # '' or 'the weights of MyNet (...) were made before ...'
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import paddle

SHOWN = 3                # parameter names in the line; the rest are counted
# An unseeded Paddle generator starts from GetRandomSeed() (paddle/phi/core/generator.cc):
# two std::random_device draws, ((a << 32) + b) masked to 53 bits. A seed the user gave
# paddle.seed() is normally below 2**32 (numpy's and Python's habits); an unseeded value
# falls below it once in 2**21 processes, a seed above it is taken as no seed (a warning
# too many, never one missed).
USER_SEEDS = 2 ** 32

_seeded = False                          # paddle_dist has seeded this process
_counters: Optional[Dict[str, int]] = None   # the unique-name counters then, if Paddle was unseeded
_warned = False


def note_seed() -> None:
    """Keep the unique-name counters at this process's first seed by paddle_dist, unless
    Paddle was already seeded by the user (then any order is reproducible)."""
    global _seeded, _counters
    if _seeded:
        return
    _seeded = True
    if not user_seeded():
        _counters = dict(_generator().ids)


def user_seeded() -> bool:
    """Whether Paddle's default generator was seeded before paddle_dist seeded it."""
    return int(paddle.base.core.default_cpu_generator().initial_seed()) < USER_SEEDS


def parameters_before_seed(net: paddle.nn.Layer) -> List[str]:
    """The names of `net`'s parameters made before paddle_dist's first seed in this
    process (none when the user seeded Paddle first, or nothing was seeded yet)."""
    if _counters is None:
        return []
    found = []
    for parameter in net.parameters():
        key, _, number = parameter.name.rpartition("_")
        if number.isdigit() and int(number) < _counters.get(key, 0):
            found.append(parameter.name)
    return found


def made_before_seed(net: paddle.nn.Layer, seed: int) -> str:
    """The warning line for a model built before paddle_dist seeded Paddle, or ""."""
    names = parameters_before_seed(net)
    if not names:
        return ""
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return (f"the weights of {type(net).__name__} ({', '.join(names[:SHOWN])}{more}) were made before "
            f"paddle_dist seeded Paddle (train.seed={seed}), so every run starts from other weights "
            "unless they are loaded from a file; call paddle_dist.setup(cfg), or paddle.seed(...), "
            "before building the model")


def warn_once(net: paddle.nn.Layer, seed: int, emit: Callable[[str], None]) -> None:
    """Emit made_before_seed's line, if any, once per process (a script may fit twice)."""
    global _warned
    line = "" if _warned else made_before_seed(net, seed)
    if line:
        _warned = True
        emit(f"paddle_dist: warning: {line}")


def _generator():
    # unique_name.switch() and guard() replace the module's generator: read it each time.
    from paddle.base import unique_name

    return unique_name.generator
