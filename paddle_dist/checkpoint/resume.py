"""Resuming: which checkpoint `checkpoint.resume` means, whether it fits this job, and
putting a loaded state back into a model and optimizer.

Example:
    state = load(resolve_resume("auto", run_dir))
    check_compatible(state, world_size=2, model_name="mlp", model=net)
    restore(state, net, opt)
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import paddle

from .format import FIX, REQUIRED_META, CheckpointError, State, _to_tensors, apply_rng
from .io import _locate, latest


def resolve_resume(spec: str, run_dir: Path) -> Optional[Path]:
    """The checkpoint `checkpoint.resume` means: "none" -> None, "auto" -> the latest under
    run_dir/checkpoints (None if there is none), else a path to a checkpoint, a checkpoints
    root or a run directory.

    Example:
        resolve_resume("auto", run_dir)   # -> run_dir/checkpoints/ckpt_000000120 or None
    """
    text = "none" if spec is None else str(spec).strip()
    if text.lower() in ("", "none"):
        return None
    if text.lower() == "auto":
        return latest(Path(run_dir) / "checkpoints")
    try:
        return _locate(Path(text).expanduser())
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint.resume={text!r}: {exc}") from None


def restore(state: State, model, optimizer=None, rng: bool = True) -> None:
    """Put a loaded state back: weights, optimizer state (with its LR scheduler), RNGs.

    Example:
        restore(load(path), net, opt)        # rng=False leaves the generators alone
    """
    differences = _param_differences(state.model, model)
    if differences:
        raise CheckpointError(f"checkpoint {state.path} does not fit this model: "
                              f"{'; '.join(differences)}; build the model it was trained with")
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.model.items()})
    if optimizer is not None:
        optimizer.set_state_dict(_to_tensors(state.optimizer))
    if rng:
        apply_rng(state.rng_arrays, state.rng_info)


def check_compatible(state: State, world_size: int, model_name: str, model=None) -> None:
    """Raise CheckpointError if this job cannot resume `state`: another world size, model
    name or (given `model`) parameter names and shapes. The message says how to proceed.

    Example:
        check_compatible(load(path), env.world_size, cfg.model.name, net)
    """
    meta, where = state.meta, state.path or "(unnamed)"
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint {where} lacks {missing} in meta.json; {FIX}")
    if meta["world_size"] != world_size:
        n = meta["world_size"]
        raise CheckpointError(f"checkpoint {where} was written by {n} ranks but this job has "
                              f"{world_size}; resume with {n} ranks (dist.nprocs={n}), or start "
                              "fresh with checkpoint.resume=none")
    if meta["model"] != model_name:
        raise CheckpointError(f"checkpoint {where} holds model '{meta['model']}' but the config "
                              f"builds '{model_name}'; set model.name={meta['model']}, or start "
                              "fresh with checkpoint.resume=none")
    differences = _param_differences(state.model, model) if model is not None else []
    if differences:
        raise CheckpointError(f"checkpoint {where} does not fit the model '{model_name}' built "
                              f"now: {'; '.join(differences)}; build it as the run that wrote "
                              "the checkpoint did, or start fresh with checkpoint.resume=none")


def _param_differences(saved: Dict[str, np.ndarray], model) -> List[str]:
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    out = []
    if set(own) - set(saved):
        out.append(f"missing in the checkpoint: {_few(set(own) - set(saved))}")
    if set(saved) - set(own):
        out.append(f"not in the model: {_few(set(saved) - set(own))}")
    shapes = [f"{k} {tuple(saved[k].shape)} vs {own[k]}" for k in sorted(set(own) & set(saved))
              if tuple(saved[k].shape) != own[k]]
    if shapes:
        out.append(f"shape (checkpoint vs model) of {_few(shapes)}")
    return out


def _few(items, limit: int = 4) -> str:
    items = sorted(items)
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more
