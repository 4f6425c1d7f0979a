"""One checkpoint format for both trainers, written by global rank 0 only.

Layout: `<run>/checkpoints/epoch_0003/{model.npz, optimizer.npz, meta.json}` and a
`latest` file naming the newest. Arrays are stored with numpy's npz and read back with
`allow_pickle=False`, so loading a checkpoint never runs code. A checkpoint directory is
written under a temporary name and renamed into place, so a crash mid-save leaves the
previous one intact.

Example:
    path = save(run_dir / "checkpoints", epoch=3, model=net, optimizer=opt, keep_last=3)
    state = load(path); net.set_state_dict(state.model)
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import paddle

LATEST = "latest"
SEP = "/"


@dataclass
class State:
    model: Dict[str, np.ndarray]
    optimizer: Dict[str, Any]
    meta: Dict[str, Any]


def save(root: Path, epoch: int, model, optimizer, keep_last: int = 3,
         meta: Optional[Dict[str, Any]] = None) -> Path:
    """Write model + optimizer + metadata atomically; keep the newest `keep_last`."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"epoch_{epoch:04d}"
    tmp = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _save_npz(tmp / "model.npz", _to_numpy(model.state_dict()))
    opt_arrays, opt_scalars = _flatten(optimizer.state_dict())
    _save_npz(tmp / "optimizer.npz", opt_arrays)
    info = dict(meta or {}, epoch=epoch, optimizer_scalars=opt_scalars, format=1)
    _write_synced(tmp / "meta.json", json.dumps(info, indent=1, sort_keys=True))
    _fsync_dir(tmp)
    old = root / f".{final.name}.old-{os.getpid()}"
    if final.exists():            # re-saving an epoch: move the old copy aside, never delete first
        os.replace(final, old)
    os.replace(tmp, final)
    _write_atomic(root / LATEST, final.name)
    shutil.rmtree(old, ignore_errors=True)
    _prune(root, keep_last)
    return final


def load(path: Path) -> State:
    """Read a checkpoint directory (or a checkpoints root: its `latest`)."""
    path = Path(path)
    if (path / LATEST).is_file():
        path = path / (path / LATEST).read_text().strip()
    meta = json.loads((path / "meta.json").read_text())
    model = _load_npz(path / "model.npz")
    optimizer = _unflatten(_load_npz(path / "optimizer.npz"), meta.pop("optimizer_scalars", {}))
    return State(model=model, optimizer=optimizer, meta=meta)


def latest(root: Path) -> Optional[Path]:
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    path = Path(root) / pointer.read_text().strip()
    return path if path.is_dir() else None


def restore(state: State, model, optimizer=None) -> None:
    """Put a loaded state back into a network (and optimizer)."""
    model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.model.items()})
    if optimizer is not None:
        optimizer.set_state_dict(_to_tensors(state.optimizer))


def _to_numpy(state: Dict[str, Any]) -> Dict[str, np.ndarray]:
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
        elif isinstance(value, (paddle.Tensor, np.ndarray)):
            arrays[name] = np.asarray(value.numpy() if isinstance(value, paddle.Tensor) else value)
        else:
            scalars[name] = value
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


def _save_npz(path: Path, arrays: Dict[str, np.ndarray]) -> None:
    with open(path, "wb") as f:
        np.savez(f, **arrays)
        f.flush()
        os.fsync(f.fileno())


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Make renames and new files in `path` durable (a crash could otherwise lose them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_npz(path: Path) -> Dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_synced(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _prune(root: Path, keep_last: int) -> None:
    if keep_last < 1:
        return
    done = sorted(p for p in root.glob("epoch_*") if p.is_dir())
    for old in done[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
