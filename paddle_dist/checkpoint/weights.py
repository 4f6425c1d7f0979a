"""Weights into a model exactly, or not at all: the same parameter and buffer names, shapes
and dtypes on both sides, else one CheckpointError that lists the differences, and the
model is left as it was. Paddle's own `set_state_dict` loads what matches, warns "Skip
loading for ..." about the rest and goes on: a model whose names changed (wrapped in
another Layer, say) keeps its random weights, and nothing stops.

- load_weights: a .pdparams file, a checkpoint or a run's latest checkpoint, into a model;
- put_weights: the check and the load (also `restore`'s);
- weight_differences: the check alone, in words (also `check_compatible`'s).

A .pdparams file is a pickle. It is read by an unpickler that builds numpy arrays and plain
values only, so a file from elsewhere cannot run code, as a checkpoint cannot.

Example:
    net = MyNet()
    load_weights(net, "runs/mine-20261123-061500/best")   # or model.pdparams, a ckpt_* dir
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Dict, List, Mapping, Set

import numpy as np
import paddle

from ..compat import state_tensors
from ..security.safepickle import ArraysOnly
from .format import AVERAGED, CheckpointError
from .io import _brief, _load_npz, _locate, _read_meta

WHAT = "a .pdparams file, a checkpoint directory (ckpt_*), a checkpoints root or a run directory"
SAVED_BY = "give a file that paddle.save(net.state_dict(), path) wrote"
# paddle.save writes this entry beside a state dict's arrays: their names in the static
# program, which paddle.load gives its tensors. Loading by structured name never needs them.
NAME_TABLE = "StructuredToParameterName@@"


def load_weights(model, path, averaged: bool = True) -> Path:
    """Load the weights at `path` into `model` exactly: every parameter and buffer, by name,
    with its shape and dtype. A name on one side only, or another shape or dtype, is refused
    with a CheckpointError (one line naming the differences) and `model` is left as it was.

    `path`: a .pdparams file (`paddle.save(net.state_dict(), path)`, or
    `python -m paddle_dist.checkpoint export`), a checkpoint directory (ckpt_*), a checkpoints
    root such as <run>/best (its latest) or a run directory (its latest checkpoint).
    Returns the file or checkpoint directory it loaded. A checkpoint of a run with
    train.ema_decay gives its moving averages (the weights it evaluated), unless `averaged`
    is False.

    Example:
        net = MyNet()
        paddle_dist.checkpoint.load_weights(net, "runs/mine-20261123-061500/best")
    """
    path = Path(path).expanduser()
    if path.is_file():
        put_weights(_read_pdparams(path), model, str(path), "file")
        return path
    if not path.exists():
        raise CheckpointError(f"{path} not found; give {WHAT}")
    found = _locate(path)
    _read_meta(found)               # a whole checkpoint of this format, or a clear error
    name = AVERAGED if averaged and (found / AVERAGED).exists() else "model.npz"
    put_weights(_load_npz(found / name), model, f"checkpoint {found}", "checkpoint")
    return found


def put_weights(saved: Mapping[str, np.ndarray], model, where: str, source: str,
                fix: str = "build the model the weights were saved from") -> None:
    """Set `model`'s parameters and buffers to `saved` (name -> array) exactly, or raise
    CheckpointError "<where> does not fit this model: <differences>; <fix>" and set none.
    `source` names `saved` in the differences ("checkpoint", "file").

    Example:
        put_weights(state.model, net, f"checkpoint {state.path}", "checkpoint")
    """
    differences, tensors = weight_differences(saved, model, source), {}
    if not differences:
        # Compared as Paddle will see them (a uint16 array becomes bfloat16): Paddle itself
        # checks a dtype only while it sets, with an AssertionError after the others are set.
        tensors = _in_model_floats({k: paddle.to_tensor(v) for k, v in saved.items()}, model)
        differences = _dtype_differences(tensors, model, source)
    if differences:
        fix = _renamed(set(saved), set(model.state_dict()), source) or fix
        raise CheckpointError(f"{where} does not fit this model: {'; '.join(differences)}; {fix}")
    model.set_state_dict(tensors)


def weight_differences(saved: Mapping[str, np.ndarray], model, source: str = "checkpoint") -> List[str]:
    """What keeps `saved` (name -> array) from loading into `model`, in words: names on one
    side only, and shapes that differ (a few of each, then "and N more"). Empty if it fits.

    Example:
        weight_differences(state.model, net)   # ['missing in the checkpoint: fc.bias, fc.weight', ...]
    """
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = []
    if set(own) - set(saved):
        out.append(f"missing in the {source}: {few(set(own) - set(saved))}")
    if set(saved) - set(own):
        out.append(f"not in the model: {few(set(saved) - set(own))}")
    shapes = [f"{k} {tuple(saved[k].shape)} vs {own[k]}" for k in sorted(set(own) & set(saved))
              if tuple(saved[k].shape) != own[k]]
    if shapes:
        out.append(f"shape ({source} vs model) of {few(shapes)}")
    return out


def few(items, limit: int = 4) -> str:
    """The first `limit` of `items` in order, then how many more: "a, b, c, d and 6 more"."""
    items = sorted(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


FLOATS = (paddle.float16, paddle.bfloat16, paddle.float32)


def _in_model_floats(tensors: Mapping[str, paddle.Tensor], model) -> Dict[str, paddle.Tensor]:
    """Floating-point weights in the model's own floating dtype: a mixed-precision (O2)
    run's 16-bit weights into a float32 model (exact: widening), and its weights saved as
    float32 (amp.decorate's save_dtype) back into its 16-bit ones (exact: they were 16-bit
    values). Any other dtype difference stays one (_dtype_differences). The model's own
    tensors are compared (an O2 model's state_dict() hands out float32 copies, while
    set_state_dict writes into its 16-bit tensors)."""
    own = state_tensors(model)
    return {k: t.astype(own[k].dtype) if t.dtype != own[k].dtype and t.dtype in FLOATS
            and own[k].dtype in FLOATS else t for k, t in tensors.items()}


def _dtype_differences(tensors: Mapping[str, paddle.Tensor], model, source: str) -> List[str]:
    own = state_tensors(model)
    wrong = [f"{k} {_dtype(t)} vs {_dtype(own[k])}" for k, t in sorted(tensors.items())
             if t.dtype != own[k].dtype]
    return [f"dtype ({source} vs model) of {few(wrong)}"] if wrong else []


def _dtype(tensor) -> str:
    return str(tensor.dtype).replace("paddle.", "")


def _renamed(saved: Set[str], own: Set[str], source: str) -> str:
    """How to load weights whose names are all the model's with one prefix, or the other way
    round: a Layer that holds another as `self.net` names its parameters `net.<name>`."""
    outer = _prefix(saved, own)
    if outer:
        return (f"every name in the {source} is this model's with '{outer}' in front (saved from "
                f"a Layer that holds this model as '{outer[:-1]}'): load into that Layer, then "
                f"use its '{outer[:-1]}'")
    inner = _prefix(own, saved)
    if inner:
        return (f"every name in this model is the {source}'s with '{inner}' in front: load into "
                f"its sublayer '{inner[:-1]}'")
    return ""


def _prefix(longer: Set[str], shorter: Set[str]) -> str:
    """`p` (ending in ".") when `longer` is `shorter` with p in front of every name, else ""."""
    if not shorter or len(longer) != len(shorter):
        return ""
    name = min(longer)
    for end in (i + 1 for i, char in enumerate(name) if char == "."):
        if {name[:end] + k for k in shorter} == longer:
            return name[:end]
    return ""


class _Refused(pickle.UnpicklingError):
    """A pickle names a global that a state dict never needs."""


def _read_pdparams(file: Path) -> Dict[str, np.ndarray]:
    """name -> array of a state dict that paddle.save wrote, unpickling arrays and plain values only."""
    try:
        with open(file, "rb") as f:
            if f.read(1) != b"\x80":    # how every pickle of protocol 2 on starts; paddle.save writes 4
                raise CheckpointError(f"{file} is not a file paddle.save wrote; give {WHAT}")
            f.seek(0)
            data = ArraysOnly(f, "latin1", lambda name: _Refused(
                f"it refers to {name}, which a state dict never needs")).load()
    except _Refused as exc:
        raise CheckpointError(f"refusing to load {file}: {exc}, and loading it could run code; "
                              f"{SAVED_BY}") from None
    except CheckpointError:
        raise
    except Exception as exc:   # noqa: BLE001 - a damaged pickle fails in many ways: EOFError, KeyError...
        raise CheckpointError(f"cannot read {file} ({_brief(exc)}); {SAVED_BY}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file} holds a {type(data).__name__}, not a state dict; {SAVED_BY}")
    data.pop(NAME_TABLE, None)
    odd = [str(k) for k, v in data.items()
           if not isinstance(k, str) or not isinstance(v, np.ndarray) or v.dtype.kind not in "biufc"]
    if odd:
        raise CheckpointError(f"{file} holds entries that are not weights ({few(odd)}); {SAVED_BY}")
    return data
