"""Resuming: which checkpoint `checkpoint.resume` means, whether it fits this job, and
putting a loaded state back into a model and optimizer.

Example:
    state = load(resolve_resume("auto", run_dir))
    check_compatible(state, world_size=2, model_name="mlp", model=net)
    restore(state, net, opt)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .format import FIX, REQUIRED_META, CheckpointError, State, _to_tensors, apply_rng
from .io import _locate, latest
from ..runs.layout import Run
from .weights import put_weights, weight_differences


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
        return latest(Run(run_dir).checkpoints)
    try:
        return _locate(Path(text).expanduser())
    except CheckpointError as exc:
        raise CheckpointError(f"checkpoint.resume={text!r}: {exc}") from None


def restore(state: State, model, optimizer=None, rng: bool = True) -> None:
    """Put a loaded state back: weights (exactly, or CheckpointError listing the parameters
    whose names, shapes or dtypes differ), optimizer state (with its LR scheduler), RNGs.

    Example:
        restore(load(path), net, opt)        # rng=False leaves the generators alone
    """
    put_weights(state.model, model, f"checkpoint {state.path}", "checkpoint",
                fix="build the model it was trained with")
    if optimizer is not None:
        optimizer.set_state_dict(_to_tensors(state.optimizer))
    if rng:
        apply_rng(state.rng_arrays, state.rng_info)


def check_compatible(state: State, world_size: Optional[int], model_name: str, model=None) -> None:
    """Raise CheckpointError if this job cannot resume `state`: another world size (unless
    `world_size` is None: the trainer continues a run on any number of ranks with its data
    plan, trainer/sampling.py), model name or (given `model`) parameter names and shapes.
    The message says how to proceed.

    Example:
        check_compatible(load(path), env.world_size, cfg.model.name, net)
    """
    meta, where = state.meta, state.path or "(unnamed)"
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise CheckpointError(f"checkpoint {where} lacks {missing} in meta.json; {FIX}")
    if world_size is not None and meta["world_size"] != world_size:
        n = meta["world_size"]
        raise CheckpointError(f"checkpoint {where} was written by {n} ranks but this job has "
                              f"{world_size}; resume with {n} ranks (dist.nprocs={n}), or start "
                              "fresh with checkpoint.resume=none")
    if meta["model"] != model_name:
        raise CheckpointError(f"checkpoint {where} holds model '{meta['model']}' but the config "
                              f"builds '{model_name}'; set model.name={meta['model']}, or start "
                              "fresh with checkpoint.resume=none")
    differences = weight_differences(state.model, model) if model is not None else []
    if differences:
        raise CheckpointError(f"checkpoint {where} does not fit the model '{model_name}' built "
                              f"now: {'; '.join(differences)}; build it as the run that wrote "
                              "the checkpoint did, or start fresh with checkpoint.resume=none")

