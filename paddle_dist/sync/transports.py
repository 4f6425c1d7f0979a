"""The CPU gradient sync's transports (`sync.transport`), one entry each: what GradSync
asks of a transport instead of testing its class. The standard library only: the
launcher checks a config's transport before any rank starts.

A transport is a reducer, an object with `all_reduce(arrays, scale) -> exchanges` (each
float32 array replaced, in place, by the sum over the ranks of `scale` times it; the
same bits on every rank) and a `transport` attribute naming its entry here. Its entry:
- `name`: `sync.transport`'s value, and how the start line says gradients travelled;
- `auto_mode`: what `sync.mode=auto` runs on it (fused where one exchange at the step is
  cheaper than handing buckets to the overlap thread: shared memory);
- `fused`: whether `sync.mode=fused` exchanges through it (False: the step's own Paddle
  buffers, which take sync.bucket_mb and sync.compress);
- `compresses`: whether it can send sync.compress's 16-bit values;
- `opener`: "module:function" of sync/ (imported when chosen), or the function itself,
  called as function(env, count, phase) on every rank at the same point (collective) to
  make the reducer.

`auto` is no transport: reducers.open_reducer picks shared memory, hierarchical or the
backend from where the ranks are. Adding a transport is a module of sync/ and a
`register` call here (tests/integration/test_extensions.py adds a toy one).

Example:
    check("shm")                        # None; ConfigError for a name with no entry
    REGISTRY["shm"].auto_mode           # 'fused'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Tuple, Union

from ..errors import ConfigError

if TYPE_CHECKING:     # runtime/ is above this module (docs/architecture.md)
    from ..runtime.env import DistEnv

AUTO = "auto"


@dataclass(frozen=True)
class Transport:
    name: str
    auto_mode: str                 # overlap | fused
    fused: bool
    compresses: bool
    opener: Union[str, Callable]   # "module:function" of sync/, or the function
    about: str = ""

    def open(self, env: DistEnv, count: int, phase=None):
        opener = self.opener
        if isinstance(opener, str):
            module, _, function = opener.partition(":")
            opener = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        return opener(env, count, phase)


REGISTRY: Dict[str, Transport] = {}


def register(transport: Transport) -> Transport:
    REGISTRY[transport.name] = transport
    return transport


def names() -> Tuple[str, ...]:
    """`sync.transport`'s values: auto, then every transport."""
    return (AUTO, *REGISTRY)


def check(name: str, compress: str = "none") -> None:
    """ConfigError, in one line, for a transport with no entry or one that cannot send
    sync.compress's values."""
    if name != AUTO and name not in REGISTRY:
        raise ConfigError(f"sync.transport must be one of {', '.join(names())} (got {name!r})")
    if name != AUTO and compress != "none" and not REGISTRY[name].compresses:
        raise ConfigError(f"sync.compress casts the backend's buffers; sync.transport={name} "
                          "exchanges float32 through shared memory, so use sync.transport=auto or backend")


SHM = register(Transport("shm", "fused", True, False, "reducers:open_shm_only",
                         "every rank on this machine, through one /dev/shm segment"))
HIERARCHICAL = register(Transport("hierarchical", "overlap", True, False, "reducers:open_hierarchical",
                                  "shared memory within each host, the backend between hosts' leaders"))
BACKEND = register(Transport("backend", "overlap", False, True, "reducers:open_backend",
                             "the process group's all-reduce (gloo) of one flat buffer"))
