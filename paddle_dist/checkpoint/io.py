"""Writing and reading checkpoints: a snapshot on the training thread, the slow disk work
in the background (AsyncSaver), atomic writes, `latest`, and loading without unpickling.

Saving comes in two halves so that rank 0 never keeps the other ranks waiting inside a
collective (gloo gives up after a fixed 30 s) while it writes: `snapshot()` copies the
state to numpy on the training thread (fast) and `write()` does the slow disk work. A
checkpoint is written under a temporary name, fsynced and renamed into place, so a crash
mid-save leaves the previous one intact and `latest` always names a whole one.

Example:
    saver = AsyncSaver()
    saver.submit(run_dir / "checkpoints", snapshot(net, opt, meta), keep_last=3)
    saver.wait()                            # re-raises a failed write
    state = load(run_dir / "checkpoints")   # the newest
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import numpy as np
import paddle

from .. import compat
from ..runs.layout import CHECKPOINT, CHECKPOINTS, LATEST, META, checkpoint_dirs, latest  # noqa: F401 - latest: the face
from ..security import private
from .format import (AVERAGED, FIX, FORMAT, LEFTOVER, ZIP_TIME, CheckpointError, Meta, Snapshot, State,
                     Written, _check_rng, _checked_meta, _flatten, _json_copy, _to_numpy, _unflatten,
                     capture_rng)


def snapshot(model, optimizer, meta: Union[Meta, Dict[str, Any]],
             averaged: Optional[Dict[str, np.ndarray]] = None) -> Snapshot:
    """Copy model, optimizer, RNG states and meta out of Paddle now, on the training thread.

    `meta` needs global_step, epoch (0-based, the epoch in progress), step_in_epoch
    (optimizer steps done in it), world_size and model; more JSON keys may follow. A
    `Meta` record gives its dict (Meta.to_dict).
    `averaged`: the model's state with the weights' moving averages (ema.npz), if any.

    Example:
        snap = snapshot(net, opt, {"global_step": 120, "epoch": 1, "step_in_epoch": 20,
                                   "world_size": 2, "model": "mlp"})
    """
    meta = _checked_meta(meta.to_dict() if isinstance(meta, Meta) else meta)
    opt_arrays, opt_scalars = _flatten(compat.optimizer_state(optimizer))
    rng_arrays, rng_info = capture_rng(meta["global_step"])
    return Snapshot(model=_to_numpy(model.state_dict()), optimizer=opt_arrays,
                    optimizer_scalars=_json_copy(opt_scalars, "optimizer state"),
                    rng=rng_arrays, rng_info=rng_info, meta=meta, averaged=dict(averaged or {}))


def write(root: Path, snap: Snapshot, keep_last: int = 3) -> Path:
    """Write `snap` as root/ckpt_<global_step>, point `latest` at it, keep the newest
    `keep_last` (0 = all). Never touches Paddle, so it is safe in a background thread.

    Example:
        path = write(run_dir / "checkpoints", snapshot(net, opt, meta), keep_last=3)
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / snap.name
    tmp = root / f".{final.name}.tmp-{_unique()}"
    tmp.mkdir()
    try:
        _write_files(tmp, snap)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _put_in_place(tmp, final)
    _write_atomic(root / LATEST, final.name)
    _prune(root, keep_last, final.name)
    _sweep(root, snap.meta["global_step"])
    return final


def save(root: Path, model, optimizer, meta: Union[Meta, Dict[str, Any]], keep_last: int = 3) -> Path:
    """snapshot() and write() in one go, on the calling thread.

    Example:
        path = save(run_dir / "checkpoints", net, opt, meta, keep_last=3)
    """
    return write(root, snapshot(model, optimizer, meta), keep_last)


def size_of(folder: Path) -> int:
    """The bytes of the files in a checkpoint directory."""
    return sum(f.stat().st_size for f in Path(folder).iterdir() if f.is_file())


class AsyncSaver:
    """Writes snapshots in a background thread while training goes on.

    Why: rank 0 must never keep the other ranks waiting inside a collective (gloo gives
    up after a fixed 30 s) while it writes a big checkpoint. So `submit` never waits: if
    a write is still running, the new snapshot waits its turn, and a newer one for the
    same root replaces it (at most one snapshot per root is held besides the one being
    written). Call it from one thread. `on_written(Written)`, if given, is called after
    each write, in the thread that wrote it (the trainer logs the size and the time).

    Example:
        saver = AsyncSaver()
        saver.submit(root, snapshot(net, opt, meta), keep_last=3)
        ...                 # train on
        saver.close()       # waits for every write; re-raises an error of one
    """

    def __init__(self, on_written: Optional[Callable[[Written], None]] = None) -> None:
        self.on_written = on_written
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)        # notified when a writer stops
        self._writer: Optional[threading.Thread] = None     # the one thread draining the queue
        self._running = False               # whether _writer's start() returned or it began
        self._pending: Dict[Path, tuple] = {}      # root -> its newest queued write, in order
        self._error: Optional[BaseException] = None
        self._path: Optional[Path] = None

    def submit(self, root: Path, snap: Snapshot, keep_last: int = 3,
               before_write: Optional[Callable[[], None]] = None) -> None:
        """Queue `snap` for writing (`before_write` runs first, in the writer thread). If
        an earlier write failed, its error is raised here and `snap` is not written."""
        self._raise_error()
        with self._lock:
            self._pending.pop(Path(root), None)         # the newer snapshot goes last
            self._pending[Path(root)] = (Path(root), snap, keep_last, before_write)
            if self._writer is None:
                # Not a daemon: if training dies, the interpreter still finishes the write.
                self._writer = threading.Thread(target=self._drain, name="paddle_dist-checkpoint")
                self._running = False
                self._writer.start()
                self._running = True

    def wait(self) -> Optional[Path]:
        """Block until every queued write is done; return the last path, or re-raise.

        A queue with no running writer is written here, on the calling thread: Ctrl-C can
        land inside submit() while the writer is being started, and that thread may then run
        late or never (it steps aside when it finds the queue taken over)."""
        with self._lock:
            while self._writer is not None and self._running:
                self._idle.wait()
            take_over = bool(self._pending)
            if take_over:
                self._writer = threading.current_thread()
        if take_over:
            self._drain()
        self._raise_error()
        return self._path

    def close(self) -> None:
        """Same as wait(): call it before the process ends."""
        self.wait()

    def _raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _drain(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                if self._writer is not me:
                    return                              # wait() took the queue over
                self._running = True
                if self._error is not None:
                    self._pending.clear()               # not written after a failed write
                job = self._pending.pop(next(iter(self._pending))) if self._pending else None
                if job is None:
                    self._writer = None
                    self._idle.notify_all()
                    return
            root, snap, keep_last, before_write = job
            try:
                if before_write is not None:
                    before_write()
                began = time.perf_counter()
                self._path = write(root, snap, keep_last)
                if self.on_written is not None:
                    self.on_written(Written(self._path, snap.meta["global_step"], size_of(self._path),
                                            time.perf_counter() - began))
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._error = exc


def _write_files(folder: Path, snap: Snapshot) -> None:
    _save_npz(folder / "model.npz", snap.model)
    _save_npz(folder / "optimizer.npz", snap.optimizer)
    _save_npz(folder / "rng.npz", snap.rng)
    if snap.averaged:
        _save_npz(folder / AVERAGED, snap.averaged)
    info = dict(snap.meta, format=FORMAT, optimizer_scalars=snap.optimizer_scalars,
                rng=snap.rng_info)
    _write_synced(folder / META, json.dumps(info, indent=1, sort_keys=True))
    _fsync_dir(folder)


def _put_in_place(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`. The same step saved again moves the old copy aside first
    (a directory cannot be renamed over a full one) and deletes it only afterwards."""
    aside = None
    if final.exists():
        aside = final.with_name(f".{final.name}.old-{_unique()}")
        os.replace(final, aside)
    os.replace(tmp, final)
    _fsync_dir(final.parent)      # the rename is durable before `latest` names it
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _prune(root: Path, keep_last: int, current: str) -> None:
    """Delete all but the newest `keep_last` checkpoints, never the one just written."""
    if keep_last < 1:
        return
    for old in checkpoint_dirs(root)[:-keep_last]:
        if old.name == current:
            continue
        doomed = old.with_name(f".{old.name}.del-{_unique()}")
        try:
            os.replace(old, doomed)   # gone at once: never a half-deleted ckpt_* left behind
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)


def _sweep(root: Path, step: int) -> None:
    """Delete the temp, set-aside and doomed copies crashed saves left for older steps.
    None is in use: one process writes a root, one checkpoint at a time, in step order."""
    for entry in root.iterdir():
        found = LEFTOVER.fullmatch(entry.name)
        if found and int(found.group(1)) < step:
            shutil.rmtree(entry, ignore_errors=True)


def _unique() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:8]}"


def load(path: Path) -> State:
    """Read a checkpoint: a ckpt_* directory, a checkpoints root (its latest) or a run dir.

    Raises CheckpointError, naming the file and the fix, for anything missing, corrupt
    or holding pickled objects.

    Example:
        state = load("runs/x/checkpoints"); state.meta["global_step"]
    """
    path = _locate(Path(path))
    meta = _read_meta(path)
    meta.pop("format")
    scalars, rng_info = meta.pop("optimizer_scalars", {}), meta.pop("rng", None)
    rng = _load_npz(path / "rng.npz")
    _check_rng(rng, rng_info, path)
    optimizer = _unflatten(_load_npz(path / "optimizer.npz"), scalars)
    averaged = _load_npz(path / AVERAGED) if (path / AVERAGED).exists() else {}
    return State(model=_load_npz(path / "model.npz"), optimizer=optimizer, meta=meta,
                 rng_arrays=rng, rng_info=rng_info, path=path, averaged=averaged)


def _locate(path: Path) -> Path:
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} not found; give a checkpoint directory "
                              "(ckpt_*), a checkpoints root or a run directory")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file; give its directory")
    if CHECKPOINT.fullmatch(path.name) or (path / META).exists() or (path / "model.npz").exists():
        return path
    for root in (path, path / CHECKPOINTS):
        found = latest(root)
        if found is not None:
            return found
    raise CheckpointError(f"no checkpoint in {path}; give a checkpoint directory (ckpt_*), "
                          "a checkpoints root or a run directory that holds some")


def _read_meta(path: Path) -> Dict[str, Any]:
    file = path / META
    if not file.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: meta.json is missing; {FIX}")
    try:
        meta = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {file} ({_brief(exc)}); {FIX}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{file} is not a JSON object; {FIX}")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {meta.get('format', 1)} but this "
                              f"paddle_dist reads format {FORMAT}; {FIX}")
    return meta


def _load_npz(file: Path) -> Dict[str, np.ndarray]:
    if not file.is_file():
        raise CheckpointError(f"checkpoint {file.parent} is incomplete: {file.name} is missing; {FIX}")
    try:
        with open(file, "rb") as f:
            is_zip = f.read(2) == b"PK"
        if not is_zip:   # np.load would take any other file for a pickle
            raise CheckpointError(f"{file} is not an npz archive (corrupt or replaced); {FIX}")
        with np.load(file, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except ValueError as exc:
        if "pickle" not in str(exc):
            raise CheckpointError(f"cannot read {file} ({_brief(exc)}); {FIX}") from None
        raise CheckpointError(f"refusing to load {file}: it holds pickled Python objects, which "
                              f"could run code; {FIX}") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"cannot read {file} ({_brief(exc)}); {FIX}") from None


def _brief(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _save_npz(path: Path, arrays: Dict[str, np.ndarray]) -> None:
    """np.savez's layout (np.load reads it), but with fixed time stamps and no pickling."""
    with open(path, "wb", opener=private.nofollow) as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                entry = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_TIME)
                with archive.open(entry, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", opener=private.nofollow) as f:
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


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{_unique()}")
    _write_synced(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _widened(tensor):
    """float32 for a 16-bit float (a mixed-precision run's weights), which any float32
    model loads; anything else as it is."""
    return tensor.astype("float32") if tensor.dtype in (paddle.float16, paddle.bfloat16) else tensor


def export_pdparams(path: Path, out: Path) -> Path:
    """Write a checkpoint's weights in Paddle's own format (`paddle.save` of the state dict):
    its moving averages when it has them (train.ema_decay), else the trained weights, with
    16-bit floats (a mixed-precision run's) as float32.

    Load them with `load_weights` (weights.py), which refuses a model whose parameter names
    or shapes differ; Paddle's `set_state_dict` only warns and skips what does not match.

    Example:
        export_pdparams("runs/x/checkpoints", "model.pdparams")
        load_weights(net, "model.pdparams")
    """
    state = load(path)       # train.ema_decay: the averages, which the run evaluated and exports
    weights = {k: _widened(paddle.to_tensor(v, place=paddle.CPUPlace()))
               for k, v in (state.averaged or state.model).items()}
    out = Path(out)
    tmp = out.with_name(f".{out.name}.tmp-{_unique()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        paddle.save(weights, str(tmp))
        os.replace(tmp, out)    # a reader never sees half a file
    except OSError as exc:
        raise CheckpointError(f"cannot write {out} ({_brief(exc)}); choose another output path") from None
    finally:
        tmp.unlink(missing_ok=True)
    return out
