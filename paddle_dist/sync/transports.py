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
- `compresses`: whether it can send sync.compress's 16-bit values (bf16: gloo, the CPU's
  backend, sums float16 into inf, so `check` refuses fp16 there);
- `opener`: "module:function" of sync/ (imported when chosen), or the function itself,
  called as function(env, count, phase) on every rank at the same point (collective) to
  make the reducer; one that compresses is also given `compress=` (bf16).

`auto` is no transport: reducers.open_reducer picks shared memory, hierarchical or the
backend from where the ranks are, or, with sync.compress, the first entry that compresses
(`carrier`). Adding a transport is a module of sync/ and a `register` call here
(tests/integration/test_extensions.py adds a toy one). Everything that names a transport
asks here: the launcher's checks, GradSync, open_reducer and allreduce_perf's --transport.

Example:
    check("shm")                        # None; ConfigError for a name with no entry
    check("auto", "fp16", "gloo")       # ConfigError: gloo sums float16 into inf
    REGISTRY["shm"].auto_mode           # 'fused'
    carrier("auto", "bf16").name        # 'backend'
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, Optional, Tuple, Union

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

    def open(self, env: DistEnv, count: int, phase=None, compress: str = "none"):
        """This transport's reducer for `count` floats per exchange (collective)."""
        opener = self.opener
        if isinstance(opener, str):
            module, _, function = opener.partition(":")
            opener = getattr(importlib.import_module(f"{__package__}.{module}"), function)
        # Only a compressing transport is asked to compress, so an opener of three
        # arguments stays a whole transport.
        return opener(env, count, phase, compress=compress) if compress != "none" else opener(env, count, phase)


REGISTRY: Dict[str, Transport] = {}


def register(transport: Transport) -> Transport:
    REGISTRY[transport.name] = transport
    return transport


def names() -> Tuple[str, ...]:
    """`sync.transport`'s values: auto, then every transport."""
    return (AUTO, *REGISTRY)


def check(name: str, compress: str = "none", backend: str = "") -> None:
    """ConfigError, in one line, for a transport with no entry, one that cannot send
    sync.compress's values, or sync.compress=fp16 over gloo (`backend`, once known)."""
    if name != AUTO and name not in REGISTRY:
        raise ConfigError(f"sync.transport must be one of {', '.join(names())} (got {name!r})")
    if compress == "fp16" and backend == "gloo":
        raise ConfigError("sync.compress=fp16 does not work with gloo (Paddle's gloo all-reduce "
                          "of float16 returns inf); use sync.compress=bf16")
    if name != AUTO and compress != "none" and not REGISTRY[name].compresses:
        raise ConfigError(f"sync.compress casts the backend's buffers; sync.transport={name} "
                          "exchanges float32 through shared memory, so use sync.transport=auto or backend")


def carrier(name: str, compress: str = "none") -> Optional[Transport]:
    """The entry that carries the gradients for sync.transport `name`: its own, or for
    auto with sync.compress the first entry that compresses; None for auto without (then
    reducers.open_reducer chooses by where the ranks are).

    Example:
        carrier("shm").name            # 'shm'
        carrier("auto")                # None
    """
    check(name, compress)
    if name != AUTO:
        return REGISTRY[name]
    if compress == "none":
        return None
    return [t for t in REGISTRY.values() if t.compresses][0]


SHM = register(Transport("shm", "fused", True, False, "reducers:open_shm_only",
                         "every rank on this machine, through one /dev/shm segment"))
HIERARCHICAL = register(Transport("hierarchical", "overlap", True, False, "reducers:open_hierarchical",
                                  "shared memory within each host, the backend between hosts' leaders"))
BACKEND = register(Transport("backend", "overlap", False, True, "reducers:open_backend",
                             "the process group's all-reduce (gloo) of one flat buffer"))
