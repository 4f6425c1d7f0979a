"""What a checkpoint holds and how it is checked: layout constants, the State a checkpoint
is read into and the Snapshot it is written from, meta and random-generator state, and the
conversions between Paddle's state dicts and plain arrays.

Layout: `<run>/checkpoints/ckpt_000000120/{model.npz, optimizer.npz, rng.npz, meta.json}`
(and `ema.npz`, the model with its weights' moving averages, under train.ema_decay),
named by global step (so name order is training order), and a `latest` file naming the
newest. Arrays go to npz files, scalars to meta.json; nothing is ever pickled.

Example:
    arrays, scalars = _flatten(optimizer.state_dict())      # npz arrays + JSON scalars
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import paddle

from .. import compat
from ..errors import UserError
from ..runs.layout import checkpoint_name

FORMAT = 2
AVERAGED = "ema.npz"      # the model with train.ema_decay's moving averages as its weights
SEP = "/"
LEFTOVER = re.compile(r"\.ckpt_(\d+)\.(tmp|old|del)-.+")   # what a crashed save may leave
REQUIRED_META = ("global_step", "epoch", "step_in_epoch", "world_size", "model")
RESERVED_META = ("format", "optimizer_scalars", "rng")   # meta.json keys of our own
# Every zip entry gets this time stamp, so the same state always gives the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
FIX = "resume from another checkpoint (give its directory) or start fresh with checkpoint.resume=none"


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, corrupt, unsafe, or does not fit this job.

    Example:
        raise CheckpointError("checkpoint runs/x/checkpoints/ckpt_000000010 not found; ...")
    """


@dataclass(frozen=True)
class Meta:
    """A checkpoint's meta.json as a record: where the run stood and the state of the pieces
    that survive a resume (each piece's own `state()`). The only reader of its keys: every
    other module takes the fields. Checkpoints from before a field existed load with its
    default (`of`): a run without `plan_world` was planned for its `world_size`.

    Example:
        meta = Meta(global_step=120, epoch=1, step_in_epoch=20, world_size=2, model="mlp")
        Meta.of(meta.to_dict()).planned_world      # 2
    """

    global_step: int
    epoch: int                         # 0-based: the epoch in progress
    step_in_epoch: int
    world_size: int
    model: str
    api: str = ""
    config_hash: Optional[str] = None
    history: Tuple[Dict[str, Any], ...] = ()
    plan_world: int = 0                # the run's data plan (trainer/sampling.py); 0: world_size
    plan_accumulate: int = 0           # 0: the config's train.accumulate_steps (older checkpoints)
    epoch_loss: Tuple[Any, ...] = ()   # (sum, count, {part: sum}) of the epoch so far, mid-epoch
    ema_updates: Optional[int] = None
    loss_scaler: Optional[Dict[str, Any]] = None
    stream: Optional[Dict[str, Any]] = None    # a stream's lanes and their positions (trainer/streams.py)
    extra: Dict[str, Any] = field(default_factory=dict)    # keys of a writer of its own

    @classmethod
    def of(cls, raw: Dict[str, Any]) -> "Meta":
        """The record of a meta.json's dict (REQUIRED_META checked by the caller)."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        values["history"] = tuple(values.get("history") or ())
        values["epoch_loss"] = tuple(values.get("epoch_loss") or ())
        return cls(**values, extra={k: v for k, v in raw.items() if k not in known and k not in RESERVED_META})

    def to_dict(self) -> Dict[str, Any]:
        """meta.json's keys: the fields that are set, then `extra`."""
        out = {"global_step": self.global_step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
               "world_size": self.world_size, "model": self.model, "api": self.api,
               "config_hash": self.config_hash, "history": list(self.history),
               "plan_world": self.plan_world or self.world_size, "plan_accumulate": self.plan_accumulate,
               "epoch_loss": list(self.epoch_loss), "ema_updates": self.ema_updates,
               "loss_scaler": self.loss_scaler, "stream": self.stream}
        kept = {k: v for k, v in out.items() if v is not None and not (k == "epoch_loss" and not v)}
        return {**kept, **self.extra}

    @property
    def planned_world(self) -> int:
        """The world size the run's steps were planned for."""
        return int(self.plan_world or self.world_size)


@dataclass
class State:
    """A loaded checkpoint: numpy arrays and JSON data only, never unpickled objects."""
    model: Dict[str, np.ndarray]
    optimizer: Dict[str, Any]
    meta: Dict[str, Any]
    rng_arrays: Dict[str, np.ndarray] = field(default_factory=dict)
    rng_info: Dict[str, Any] = field(default_factory=dict)
    path: Optional[Path] = None
    averaged: Dict[str, np.ndarray] = field(default_factory=dict)   # train.ema_decay's weights

    @property
    def record(self) -> Meta:
        """meta.json as a typed record (Meta)."""
        return Meta.of(self.meta)


@dataclass
class Snapshot:
    """Everything a checkpoint holds, already copied out of Paddle: safe to write later,
    from another thread, while training changes the live tensors."""
    model: Dict[str, np.ndarray]
    optimizer: Dict[str, np.ndarray]
    optimizer_scalars: Dict[str, Any]
    rng: Dict[str, np.ndarray]
    rng_info: Dict[str, Any]
    meta: Dict[str, Any]
    averaged: Dict[str, np.ndarray] = field(default_factory=dict)   # ema.npz: the model with
                                                                     # train.ema_decay's averages

    @property
    def name(self) -> str:
        """Directory name, e.g. ckpt_000000120: zero-padded so name order is step order."""
        return checkpoint_name(self.meta["global_step"])


def capture_rng(step: int = 0) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The state of Python's, numpy's and Paddle's random generators, without pickling:
    the long integer lists as arrays (for rng.npz), the few scalars as a JSON-ready dict.
    `step`: the global step, from which Paddle 2.6 re-seeds its CPU generator (compat.py).

    Example:
        arrays, info = capture_rng()
        x = np.random.rand()
        apply_rng(arrays, info)
        assert np.random.rand() == x
    """
    version, words, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    arrays = {"python": np.asarray(words, dtype=np.int64), "numpy": np.array(keys, dtype=np.uint32)}
    info: Dict[str, Any] = {
        "python": {"version": version, "gauss_next": gauss_next},
        "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "paddle": []}
    for i, (scalars, engine) in enumerate(compat.generator_states(step)):
        arrays[f"paddle_{i}"] = np.asarray(engine, dtype=np.int64)
        info["paddle"].append(scalars)
    return arrays, info


def apply_rng(arrays: Dict[str, np.ndarray], info: Dict[str, Any]) -> None:
    """Put back generator states from capture_rng() (or a loaded State's rng_* fields).

    Example:
        apply_rng(state.rng_arrays, state.rng_info)
    """
    py, npy = info["python"], info["numpy"]
    random.setstate((py["version"], tuple(int(w) for w in arrays["python"]), py["gauss_next"]))
    np.random.set_state((npy["kind"], arrays["numpy"].astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    saved = [(scalars, arrays[f"paddle_{i}"]) for i, scalars in enumerate(info["paddle"])]
    if len(saved) > 1 and len(saved) != len(paddle.get_rng_state()):
        raise CheckpointError(f"the checkpoint holds {len(saved)} Paddle generator states, one per "
                              f"GPU its process saw, but this process has {len(paddle.get_rng_state())}; "
                              "resume where as many GPUs are visible, or evaluate it (--eval-only "
                              "restores no random state), or take its weights alone "
                              "(checkpoint.restore(..., rng=False))")
    try:
        compat.set_generator_states(saved)
    except ValueError as exc:
        raise CheckpointError(f"the checkpoint's random state does not fit this process: {exc}; "
                              "resume where it was written (a GPU's on a GPU), or evaluate it "
                              "(--eval-only restores no random state), or take its weights alone "
                              "(checkpoint.restore(..., rng=False))") from None


def _check_rng(arrays: Dict[str, np.ndarray], info: Any, where: Path) -> None:
    try:
        needed = {"python", "numpy"} | {f"paddle_{i}" for i in range(len(info["paddle"]))}
        ok = (needed <= set(arrays) and {"python", "numpy"} <= set(info)
              and all(len(s) == 3 for s in info["paddle"]))
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise CheckpointError(f"checkpoint {where} has a malformed RNG state (rng.npz or the "
                              f"'rng' entry of meta.json); {FIX}")


def _checked_meta(meta: Dict[str, Any]) -> Dict[str, Any]:
    """A deep copy of `meta` (the caller may change its dict while we write), checked early,
    on the training thread, rather than failing later in the writer."""
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ValueError(f"checkpoint meta lacks {missing}; it needs {list(REQUIRED_META)}")
    clash = [k for k in RESERVED_META if k in meta]
    if clash:
        raise ValueError(f"checkpoint meta keys {clash} are reserved; rename them")
    step = meta["global_step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint meta global_step must be an int >= 0 (got {step!r})")
    return _json_copy(meta, "checkpoint meta")


def _json_copy(data: Dict[str, Any], what: str) -> Dict[str, Any]:
    try:
        return json.loads(json.dumps(data))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be plain JSON data: {exc}") from None


def _to_numpy(state: Dict[str, Any]) -> Dict[str, np.ndarray]:
    # Tensor.numpy() returns a copy, so training may change the tensors right after.
    return {k: np.asarray(v.numpy()) for k, v in state.items()}


def _flatten(state: Dict[str, Any], prefix: str = "") -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """Split a nested optimizer state into arrays (for npz) and JSON scalars."""
    arrays, scalars = {}, {}
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            sub_arrays, sub_scalars = _flatten(value, name + SEP)
            arrays.update(sub_arrays)
            scalars.update(sub_scalars)
        elif isinstance(value, paddle.Tensor):
            arrays[name] = np.asarray(value.numpy())
        elif isinstance(value, np.ndarray):
            arrays[name] = np.array(value)          # a copy: see _to_numpy
        else:
            scalars[name] = value.item() if isinstance(value, np.generic) else value
    return arrays, scalars


def _unflatten(arrays: Dict[str, np.ndarray], scalars: Dict[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, value in list(arrays.items()) + list(scalars.items()):
        *parents, leaf = name.split(SEP)
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _to_tensors(state: Dict[str, Any]) -> Dict[str, Any]:
    return {k: _to_tensors(v) if isinstance(v, dict) else
            (paddle.to_tensor(v) if isinstance(v, np.ndarray) else v) for k, v in state.items()}


def weights_digest(model) -> str:
    """sha256 of a model's parameters and buffers, in name order: equal on every rank of a
    data-parallel job.

    Example:
        weights_digest(net)  # '3f2a...'
    """
    digest = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(np.ascontiguousarray(value.numpy()).tobytes())
    return digest.hexdigest()


@dataclass(frozen=True)
class Written:
    """A checkpoint as its write ended: where, its step, its size in bytes and how long its
    write took (the files, their fsyncs and the renames; not a delay before it)."""

    path: Path
    step: int
    size: int
    seconds: float

    def line(self, what: str = "checkpoint") -> str:
        """`checkpoint for step 40 written: 12.3 MB in 0.21 s`"""
        return f"{what} for step {self.step} written: {self.size / 1e6:,.1f} MB in {self.seconds:.2f} s"
