"""One checkpoint format for both trainers: the full training state, written by global rank 0.

Layout: `<run>/checkpoints/ckpt_000000120/{model.npz, optimizer.npz, rng.npz, meta.json}`,
named by global step (so name order is training order), and a `latest` file naming the
newest. Arrays go to npz files, scalars to meta.json, and npz files are read with
`allow_pickle=False`: loading a checkpoint never unpickles, so it can never run code.
A checkpoint is written under a temporary name, fsynced and renamed into place, so a
crash mid-save leaves the previous one intact and `latest` always names a whole one.

Saving comes in two halves so that rank 0 never keeps the other ranks waiting inside a
collective (gloo gives up after a fixed 30 s) while it writes: `snapshot()` copies the
state to numpy on the training thread (fast) and `write()` does the slow disk work,
which `AsyncSaver` runs in a background thread.

Example:
    meta = {"global_step": 120, "epoch": 1, "step_in_epoch": 20, "world_size": 2, "model": "mlp"}
    saver = AsyncSaver()
    saver.submit(run_dir / "checkpoints", snapshot(net, opt, meta), keep_last=3)
    ...                                     # training goes on meanwhile
    saver.wait()                            # re-raises a failed write
    state = load(run_dir / "checkpoints")   # the newest
    check_compatible(state, world_size=2, model_name="mlp", model=net)
    restore(state, net, opt)

Command line (errors are one line on stderr, exit code 2):
    python -m paddle_dist.checkpoint show runs/x/checkpoints
    python -m paddle_dist.checkpoint export runs/x/checkpoints/ckpt_000000120 model.pdparams
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import threading
import uuid
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import paddle

from .errors import UserError

FORMAT = 2
LATEST = "latest"
SEP = "/"
NAME = re.compile(r"ckpt_(\d+)")
LEFTOVER = re.compile(r"\.ckpt_(\d+)\.(tmp|old|del)-.+")   # what a crashed save may leave
REQUIRED_META = ("global_step", "epoch", "step_in_epoch", "world_size", "model")
RESERVED_META = ("format", "optimizer_scalars", "rng")   # meta.json keys of our own
# Every zip entry gets this time stamp, so the same state always gives the same bytes.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
FIX = "resume from another checkpoint (give its directory) or start fresh with checkpoint.resume=none"

# The package imports this module (through its trainers) before `python -m
# paddle_dist.checkpoint` runs it as __main__, and runpy warns about that on stderr. It is
# harmless here: __main__ only calls main() of the copy the package imported.
warnings.filterwarnings("ignore", category=RuntimeWarning,
                        message=r"'paddle_dist\.checkpoint' found in sys\.modules")


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, corrupt, unsafe, or does not fit this job.

    Example:
        raise CheckpointError("checkpoint runs/x/checkpoints/ckpt_000000010 not found; ...")
    """


@dataclass
class State:
    """A loaded checkpoint: numpy arrays and JSON data only, never unpickled objects."""
    model: Dict[str, np.ndarray]
    optimizer: Dict[str, Any]
    meta: Dict[str, Any]
    rng_arrays: Dict[str, np.ndarray] = field(default_factory=dict)
    rng_info: Dict[str, Any] = field(default_factory=dict)
    path: Optional[Path] = None


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

    @property
    def name(self) -> str:
        """Directory name, e.g. ckpt_000000120: zero-padded so name order is step order."""
        return f"ckpt_{self.meta['global_step']:09d}"


# ---------------------------------------------------------------- random generators
def capture_rng() -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The state of Python's, numpy's and Paddle's random generators, without pickling:
    the long integer lists as arrays (for rng.npz), the few scalars as a JSON-ready dict.

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
    for i, generator in enumerate(paddle.get_rng_state()):
        # GeneratorState pickles as (int, int, int, [int, ...]): keep the same pieces.
        *scalars, engine = generator.__getstate__()
        arrays[f"paddle_{i}"] = np.asarray(engine, dtype=np.int64)
        info["paddle"].append([int(s) for s in scalars])
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
    saved, here = len(info["paddle"]), len(paddle.get_rng_state())
    if saved != here:
        raise CheckpointError(f"the checkpoint holds {saved} Paddle generator state(s) but this "
                              f"process has {here}; resume on the same kind and number of devices "
                              "per process, or restore with rng=False")
    paddle.set_rng_state([_generator_state(scalars, arrays[f"paddle_{i}"])
                          for i, scalars in enumerate(info["paddle"])])


def _generator_state(scalars: List[int], engine: np.ndarray):
    from paddle.base import core

    # GeneratorState has no public constructor; this is how unpickling builds one.
    state = core.GeneratorState.__new__(core.GeneratorState)
    state.__setstate__((*scalars, [int(v) for v in engine]))
    return state


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


# ---------------------------------------------------------------- saving
def snapshot(model, optimizer, meta: Dict[str, Any]) -> Snapshot:
    """Copy model, optimizer, RNG states and meta out of Paddle now, on the training thread.

    `meta` needs global_step, epoch (0-based, the epoch in progress), step_in_epoch
    (optimizer steps done in it), world_size and model; more JSON keys may follow.

    Example:
        snap = snapshot(net, opt, {"global_step": 120, "epoch": 1, "step_in_epoch": 20,
                                   "world_size": 2, "model": "mlp"})
    """
    meta = _checked_meta(meta)
    opt_arrays, opt_scalars = _flatten(optimizer.state_dict())
    rng_arrays, rng_info = capture_rng()
    return Snapshot(model=_to_numpy(model.state_dict()), optimizer=opt_arrays,
                    optimizer_scalars=_json_copy(opt_scalars, "optimizer state"),
                    rng=rng_arrays, rng_info=rng_info, meta=meta)


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


def save(root: Path, model, optimizer, meta: Dict[str, Any], keep_last: int = 3) -> Path:
    """snapshot() and write() in one go, on the calling thread.

    Example:
        path = save(run_dir / "checkpoints", net, opt, meta, keep_last=3)
    """
    return write(root, snapshot(model, optimizer, meta), keep_last)


class AsyncSaver:
    """Writes snapshots in a background thread while training goes on.

    Why: rank 0 must never keep the other ranks waiting inside a collective (gloo gives
    up after a fixed 30 s) while it writes a big checkpoint. So `submit` never waits: if
    a write is still running, the new snapshot waits its turn, and a newer one for the
    same root replaces it (at most one snapshot per root is held besides the one being
    written). Call it from one thread.

    Example:
        saver = AsyncSaver()
        saver.submit(root, snapshot(net, opt, meta), keep_last=3)
        ...                 # train on
        saver.close()       # waits for every write; re-raises an error of one
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
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
            if self._thread is None:
                # Not a daemon: if training dies, the interpreter still finishes the write.
                self._thread = threading.Thread(target=self._drain, name="paddle_dist-checkpoint")
                self._thread.start()

    def wait(self) -> Optional[Path]:
        """Block until every queued write is done; return the last path, or re-raise."""
        while True:
            with self._lock:
                thread = self._thread
            if thread is None:
                break
            thread.join()
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
        while True:
            with self._lock:
                job = self._pending.pop(next(iter(self._pending))) if self._pending else None
                if job is None or self._error is not None:
                    self._thread = None
                    return
            root, snap, keep_last, before_write = job
            try:
                if before_write is not None:
                    before_write()
                self._path = write(root, snap, keep_last)
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread
                self._error = exc


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


def _write_files(folder: Path, snap: Snapshot) -> None:
    _save_npz(folder / "model.npz", snap.model)
    _save_npz(folder / "optimizer.npz", snap.optimizer)
    _save_npz(folder / "rng.npz", snap.rng)
    info = dict(snap.meta, format=FORMAT, optimizer_scalars=snap.optimizer_scalars,
                rng=snap.rng_info)
    _write_synced(folder / "meta.json", json.dumps(info, indent=1, sort_keys=True))
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
    for old in _checkpoint_dirs(root)[:-keep_last]:
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


# ---------------------------------------------------------------- finding and loading
def latest(root: Path) -> Optional[Path]:
    """The checkpoint `root/latest` names; if that is missing or gone, the newest
    `ckpt_*` directory (a crash can land between the two renames); else None.

    Example:
        latest(run_dir / "checkpoints")   # -> .../checkpoints/ckpt_000000120
    """
    root = Path(root)
    try:
        name = (root / LATEST).read_text().strip()
    except (OSError, ValueError):
        name = ""
    if name and name == Path(name).name and not name.startswith(".") and (root / name).is_dir():
        return root / name
    found = _checkpoint_dirs(root)
    return found[-1] if found else None


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
    return State(model=_load_npz(path / "model.npz"), optimizer=optimizer, meta=meta,
                 rng_arrays=rng, rng_info=rng_info, path=path)


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


def _locate(path: Path) -> Path:
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} not found; give a checkpoint directory "
                              "(ckpt_*), a checkpoints root or a run directory")
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a file; give its directory")
    if NAME.fullmatch(path.name) or (path / "meta.json").exists() or (path / "model.npz").exists():
        return path
    for root in (path, path / "checkpoints"):
        found = latest(root)
        if found is not None:
            return found
    raise CheckpointError(f"no checkpoint in {path}; give a checkpoint directory (ckpt_*), "
                          "a checkpoints root or a run directory that holds some")


def _read_meta(path: Path) -> Dict[str, Any]:
    file = path / "meta.json"
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


def _checkpoint_dirs(root: Path) -> List[Path]:
    """ckpt_* directories under `root`, oldest step first."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return []
    found = [(int(m.group(1)), p) for p in entries if (m := NAME.fullmatch(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


# ---------------------------------------------------------------- restoring and checking
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


# ---------------------------------------------------------------- export and command line
def export_pdparams(path: Path, out: Path) -> Path:
    """Write a checkpoint's weights in Paddle's own format, for `paddle.load`.

    Example:
        export_pdparams("runs/x/checkpoints", "model.pdparams")
        net.set_state_dict(paddle.load("model.pdparams"))
    """
    weights = {k: paddle.to_tensor(v, place=paddle.CPUPlace()) for k, v in load(path).model.items()}
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


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m paddle_dist.checkpoint show CKPT` | `export CKPT OUT.pdparams`."""
    from .cli import _Parser   # argparse whose errors are UserErrors: one line, exit 2

    parser = _Parser(prog="python -m paddle_dist.checkpoint",
                     description="Inspect a paddle_dist checkpoint or export its weights.")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="print the checkpoint's meta data as JSON")
    show.add_argument("checkpoint", help="a ckpt_* directory, a checkpoints root or a run dir")
    export = commands.add_parser("export", help="write the weights for paddle.load")
    export.add_argument("checkpoint", help="a ckpt_* directory, a checkpoints root or a run dir")
    export.add_argument("out", help="output file, e.g. model.pdparams")
    args = parser.parse_args(argv)
    if args.command == "show":
        print(json.dumps(load(args.checkpoint).meta, indent=1, sort_keys=True))
    else:
        print(f"wrote {export_pdparams(args.checkpoint, args.out)}")
    return 0


# ---------------------------------------------------------------- arrays and files
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


def _save_npz(path: Path, arrays: Dict[str, np.ndarray]) -> None:
    """np.savez's layout (np.load reads it), but with fixed time stamps and no pickling."""
    with open(path, "wb") as f:
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, array in arrays.items():
                entry = zipfile.ZipInfo(f"{name}.npy", date_time=ZIP_TIME)
                with archive.open(entry, "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
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


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{_unique()}")
    _write_synced(tmp, text)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


if __name__ == "__main__":
    from paddle_dist.checkpoint import main as _main   # the package's copy, not a second one
    from paddle_dist.cli import run

    run(_main)
