"""What differs between the Paddle versions paddle_dist supports, in one place.

Supported: Paddle 2.6 and 3.0-3.3 (tested with 2.6.2, 3.0.0, 3.1.1, 3.2.2 and 3.3.1, CPU
builds from PyPI; GPU users get 2.6.2 from PyPI, 3.x from Paddle's own index). Each
difference below is measured, and tests/unit/test_compat.py checks each on every version:

- numpy. Paddle 2.6 was built for numpy 1. With numpy 2, importing `numpy.random` after
  `paddle` crashes the process (SIGSEGV in zlib's inflateReset2: Paddle's zlib symbols
  win); `numpy<2` is needed there (`numpy_problem`; `make PADDLE=paddlepaddle==2.6.2`
  installs it). paddle_dist imports numpy.random before Paddle in any case.
- numpy views of a tensor's memory. The CPU gradient sync hands gradients to its
  transports as numpy views, without copies. `np.from_dlpack` gives a writable view
  on 3.3; on 3.0-3.2 the view is READ-ONLY (numpy 2 honours the flag Paddle sets), and
  2.6's Tensor has no `__dlpack__` at all. `numpy_view` uses dlpack where it is writable
  and otherwise builds the same view from the tensor's data pointer (numpy's array
  interface), which is also zero-copy: no version pays a copy.
- bfloat16 bits. numpy has no bfloat16: the bits are seen as uint16. 3.3 has
  `Tensor.view(paddle.uint16)`; older versions have no `paddle.uint16` and go through the
  data pointer as well.
- Paddle's CPU cast of float32 to bfloat16 rounds to nearest even on 3.x and truncates
  on 2.6. The CPU transports round in numpy (reducers.to_bf16_bits), the same on every
  version; only `sync.mode=fused` with `sync.compress=bf16` on CPU casts with Paddle
  and so truncates on 2.6 (`cpu_bf16_cast_rounds`).
- The exported program. `paddle.jit.save(net, prefix)` writes `prefix.json` (PIR) on 3.x
  and `prefix.pdmodel` on 2.6 (`program_file` finds it; deploy.json names it).
- Random generator state. 3.x's `GeneratorState` pickles as (device, seed, offset,
  engine), the CPU engine (mt19937_64) included. 2.6's pickles as (device, seed, offset)
  only: a CPU state rebuilt from it starts the engine afresh from `seed`, so a resumed
  run would draw other numbers. There (`ENGINE_SAVED` is False) each checkpoint re-seeds
  the CPU generator from (seed, step) right after the step, in the interrupted and the
  uninterrupted run alike, and saves that fresh state, which its 3 numbers describe
  exactly. The seed comes from the job's seed (`note_seed`, called by
  `process.seed_everything`) and the step, so saving twice at one step saves one state.
  GPU generators (Philox: seed and offset say everything) are saved as they are, the
  process's own GPU's only (`generator_states`).
  A checkpoint moved between 2.6 and 3.x resumes, but its CPU engine starts afresh from
  the saved seed: exact from 2.6 to 3.x, not from 3.x to 2.6 (2.6 cannot set an engine).
- An optimizer's loaded state. `set_state_dict` on an optimizer that has not stepped
  yet keeps the state aside until its first step makes the accumulators; 3.x's
  `state_dict()` returns that state meanwhile, 2.6's returns none of it, so a checkpoint
  written between a resume and the next step lost the optimizer's moments
  (`optimizer_state` returns it on every version).
- A loss scaler's overflow. After `unscale_`, `GradScaler` keeps whether it found inf/nan
  in `_cache_found_inf` on 3.x and `_cache_founf_inf` on 2.6 (`scaler_found_inf`).

Example:
    view = numpy_view(grad)          # writable float32 view of the gradient's own memory
    view *= 0.5                      # changes the gradient itself
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

# Versions (major, minor) that are tested and supported, and how to say so.
SUPPORTED_MINORS = ((2, 6), (3, 0), (3, 1), (3, 2), (3, 3))
SUPPORTED = "2.6 and 3.0-3.3 (tested: 2.6.2, 3.0.0, 3.1.1, 3.2.2, 3.3.1)"
NUMPY_TYPES = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2",
               "int32": "<i4", "int64": "<i8", "uint8": "|u1", "int8": "|i1"}
SEED_BITS = 63


# ---------------------------------------------------------------- the version
def paddle_dir() -> Optional[Path]:
    """The installed `paddle` package's folder, found without importing it; None without
    Paddle."""
    spec = importlib.util.find_spec("paddle")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def build_fields() -> Dict[str, str]:
    """The `name = '...'` lines of paddle/version/__init__.py, which Paddle's build writes
    (full_version, cuda_version, hip_version, ...), read without importing Paddle (about a
    second, which a launcher that only starts ranks never needs); {} without Paddle.

    Example:
        build_fields()["cuda_version"]    # 'False' for a CPU build
    """
    folder = paddle_dir()
    try:
        text = (folder / "version" / "__init__.py").read_text() if folder else ""
    except OSError:
        return {}
    return dict(re.findall(r"^(\w+)\s*=\s*'([^']*)'", text, re.M))


def installed_version() -> Optional[str]:
    """Paddle's version as its build wrote it (e.g. '3.3.1', '0.0.0' for a develop
    build); None without Paddle."""
    return build_fields().get("full_version")


def parse_version(text: str) -> Tuple[int, ...]:
    """The leading numbers of a version string.

    Example:
        parse_version("3.0.0rc1")    # (3, 0, 0)
    """
    return tuple(int(n) for n in re.findall(r"\d+", text.split("rc")[0].split("+")[0])[:3])


def is_supported(version: str) -> bool:
    return parse_version(version)[:2] in SUPPORTED_MINORS


def version_problem(version: Optional[str]) -> Optional[str]:
    """One line when `version` is outside the supported range (None when it is inside).

    Example:
        version_problem("2.5.2")   # 'Paddle 2.5.2 is outside the range paddle_dist supports ...'
    """
    if version is None:
        return ("Paddle is not installed; pip install paddlepaddle==3.3.1 (CPU) or "
                "paddlepaddle-gpu (README: Install)")
    if is_supported(version):
        return None
    what = "a develop build" if parse_version(version)[:1] == (0,) else "outside the range"
    return (f"Paddle {version} is {what}: paddle_dist supports {SUPPORTED}; it may work, "
            "but untested (README: Install)")


def numpy_problem(paddle_version: Optional[str], numpy_version: str) -> Optional[str]:
    """One line when this numpy cannot serve this Paddle (2.6 with numpy 2), else None.

    Example:
        numpy_problem("2.6.2", "2.4.6")   # 'Paddle 2.6.2 needs numpy 1 ...'
    """
    if paddle_version is None or parse_version(paddle_version)[:2] != (2, 6):
        return None
    if parse_version(numpy_version)[:1] < (2,):
        return None
    return (f"Paddle {paddle_version} needs numpy 1 (found {numpy_version}: importing "
            "numpy.random after paddle crashes); pip install \"numpy<2\"")


_said: List[str] = []      # the version lines said in this process


def warn_unsupported(emit) -> None:
    """Say once per process, through `emit(line)`, when this Paddle is outside the range
    or this numpy cannot serve it."""
    version = installed_version()
    for problem in (version_problem(version), numpy_problem(version, np.__version__)):
        if problem and problem not in _said:
            _said.append(problem)
            emit(f"paddle_dist: warning: {problem}")


# ---------------------------------------------------------------- numpy views
@functools.lru_cache(maxsize=None)
def dlpack_writable() -> bool:
    """Whether `np.from_dlpack(tensor)` gives a writable view here (3.3: yes; 3.0-3.2:
    read-only; 2.6: no `__dlpack__`)."""
    import paddle

    probe = paddle.zeros([1], dtype="float32")
    try:
        return bool(np.from_dlpack(probe).flags.writeable)
    except (AttributeError, TypeError, BufferError, RuntimeError):
        return False


class _Memory:
    """Exposes a tensor's memory through numpy's array interface, and keeps the tensor
    alive as long as a view of it is (numpy holds this object as the view's base)."""

    def __init__(self, tensor, length: int, typestr: str):
        self.tensor = tensor
        self.__array_interface__ = {"data": (tensor.data_ptr(), False), "shape": (length,),
                                    "typestr": typestr, "version": 3}


@functools.lru_cache(maxsize=None)
def _dtype_name(dtype) -> str:
    """'float32' for paddle.float32 (cached: numpy_view runs for every gradient, every step)."""
    return str(dtype).split(".")[-1]


def numpy_view(tensor) -> np.ndarray:
    """A writable 1-D numpy view of a contiguous CPU tensor's own memory (no copy):
    writing into it writes the tensor. bfloat16 is seen as its uint16 bits.

    Example:
        g = numpy_view(param.grad)     # float32, param.grad.size elements
    """
    dtype = _dtype_name(tensor.dtype)
    if dtype not in NUMPY_TYPES:
        raise TypeError(f"no numpy view for a {dtype} tensor")
    if dtype != "bfloat16" and dlpack_writable():
        return np.from_dlpack(tensor).reshape(-1)
    if not tensor.place.is_cpu_place():      # a device pointer: numpy would read host memory
        raise TypeError(f"no numpy view of a tensor on {tensor.place}; copy it to the CPU first")
    view = np.asarray(_Memory(tensor, int(tensor.size), NUMPY_TYPES[dtype]))
    if dtype != "bfloat16":
        view = view.view(NUMPY_TYPES[dtype])
    return view


@functools.lru_cache(maxsize=None)
def cpu_bf16_cast_rounds() -> bool:
    """Whether Paddle's CPU cast to bfloat16 rounds to nearest (3.x) or truncates (2.6)."""
    import paddle

    # 1 + 2**-8 + 2**-9 lies past the middle between two bfloat16 values: rounding goes up.
    above_half = paddle.to_tensor([1.0 + 2 ** -8 + 2 ** -9], dtype="float32").astype("bfloat16")
    return int(numpy_view(above_half)[0]) == 0x3F81     # truncated: 0x3F80


def program_file(folder: Path, prefix: str) -> Path:
    """The program `paddle.jit.save(net, folder/prefix)` wrote: prefix.json (3.x) or
    prefix.pdmodel (2.6)."""
    for suffix in (".json", ".pdmodel"):
        path = Path(folder) / f"{prefix}{suffix}"
        if path.is_file():
            return path
    raise FileNotFoundError(f"paddle.jit.save wrote no {prefix}.json or {prefix}.pdmodel in {folder}")


# ---------------------------------------------------------------- random generators
@functools.lru_cache(maxsize=None)
def engine_saved() -> bool:
    """Whether a GeneratorState's pickled form carries the CPU engine (3.x: yes, 2.6: no)."""
    import paddle

    return len(paddle.get_rng_state()[0].__getstate__()) == 4


def generator_states(step: int = 0) -> List[Tuple[List[int], List[int]]]:
    """Paddle's generator states for this process's device, as (scalars, engine) lists of
    ints that rebuild them exactly. Where the CPU engine cannot be saved (2.6), the CPU
    generator is re-seeded first from (seed, `step`) (module docstring).

    On GPUs Paddle keeps one generator per visible GPU; only this process's own is saved
    (`own_device`): another rank's copy of generator k never advanced there, and a rank
    restores the saved one into its own GPU's generator (`set_generator_states`)."""
    import paddle

    if not engine_saved():
        _reseed_cpu(paddle, step)
    own = own_device()
    out = []
    for state in paddle.get_rng_state():
        device, seed, offset, *engine = state.__getstate__()
        if int(device) >= 0 and int(device) != own:
            continue
        out.append(([int(device), int(seed), int(offset)], [int(v) for v in (engine[0] if engine else [])]))
    return out


def own_device() -> int:
    """This process's GPU (its index among the visible ones), or -1 on CPU."""
    import paddle

    kind, _, index = paddle.device.get_device().partition(":")
    return int(index) if kind == "gpu" and index.isdigit() else -1


_job_seed: List[int] = []     # the seed process.seed_everything gave this process


def note_seed(seed: int) -> None:
    """Remember the job's seed: the base of 2.6's re-seeding at checkpoints."""
    _job_seed[:] = [int(seed)]


def _reseed_cpu(paddle, step: int) -> None:
    """Give the CPU generator a seed derived from the job's seed and `step`: the same in
    every run that reaches this step with this seed, however often it saves there."""
    states = paddle.get_rng_state()
    if not any(int(s.__getstate__()[0]) < 0 for s in states):   # device -1: the CPU's
        return
    generator = paddle.base.core.default_cpu_generator()
    if not _job_seed:         # the checkpoint API used without seed_everything
        note_seed(generator.initial_seed())
    digest = hashlib.sha256(f"{_job_seed[0]}:{step}".encode()).digest()
    generator.manual_seed(int.from_bytes(digest[:8], "little") >> (64 - SEED_BITS))


def set_generator_states(states: Sequence[Tuple[Sequence[int], Sequence[int]]]) -> None:
    """Put back what `generator_states()` returned: a CPU state into the CPU generator, a
    GPU state into this process's own GPU's generator (whichever GPU the saving process
    had); the other generators keep theirs. A checkpoint of the older layout, one state per
    visible GPU, goes back position by position, as it was saved. Raises ValueError where
    a saved state has no generator here (a GPU's on a CPU)."""
    import paddle
    from paddle.base import core

    current = list(paddle.get_rng_state())
    devices = [int(s.__getstate__()[0]) for s in current]
    per_position = sum(int(s[0]) >= 0 for s, _ in states) > 1
    own = own_device()
    for i, (scalars, engine) in enumerate(states):
        pieces = tuple(int(s) for s in scalars)
        if per_position:
            slot = i
        else:
            home = pieces[0] if pieces[0] < 0 else own
            slot = next((k for k, d in enumerate(devices) if d == home), None)
            if slot is None or (pieces[0] >= 0) != (home >= 0):
                where = "the CPU" if pieces[0] < 0 else "a GPU"
                raise ValueError(f"it holds {where}'s generator, which this process (on "
                                 f"{paddle.device.get_device()}) does not have")
            pieces = (home,) + pieces[1:]
        if engine_saved() and not len(engine) and pieces[0] < 0:
            # Saved by 2.6 (no engine): its CPU engine starts afresh from the seed, here too.
            generator = core.default_cpu_generator()
            generator.manual_seed(pieces[1])
            current[slot] = generator.get_state()
            continue
        # GeneratorState has no public constructor; this is how unpickling builds one.
        state = core.GeneratorState.__new__(core.GeneratorState)
        state.__setstate__(pieces + ((list(int(v) for v in engine),) if engine_saved() else ()))
        current[slot] = state
    paddle.set_rng_state(current)


# ---------------------------------------------------------------- optimizer state
def optimizer_state(optimizer) -> dict:
    """`optimizer.state_dict()`, including state loaded by `set_state_dict` that waits for
    the first step to be applied (2.6 leaves it out; 3.x includes it, as here)."""
    state = optimizer.state_dict()
    held = getattr(optimizer, "_accumulators_holder", None) or {}
    if not optimizer._accumulators:
        for name, value in held.items():
            state.setdefault(name, value)
    return state


# ---------------------------------------------------------------- a layer's own tensors
def scaler_found_inf(scaler) -> bool:
    """Whether a GradScaler's last unscale found inf or nan (see the module's docstring)."""
    return bool(getattr(scaler, "_cache_found_inf", getattr(scaler, "_cache_founf_inf", False)))


def state_tensors(layer) -> Dict[str, "object"]:
    """`layer.state_dict()` as the layer's own tensors, never copies: with
    `paddle.amp.decorate(..., save_dtype=...)` (O2) every sublayer carries a state-dict
    hook that replaces each floating entry by a cast copy, so writing into the entries
    of `state_dict()` would change nothing, and their `id()` names no parameter.
    `use_hook=False` (2.6 to 3.3) skips those hooks.

    Example:
        state_tensors(net)["bn._mean"] is net.bn._mean       # True, O2 or not
    """
    return layer.state_dict(use_hook=False)


class BatchNormState:
    """A BatchNorm layer's running statistics and how it updates them, read once here
    (Paddle keeps them as attributes of its own: `_mean`, `_variance`, `_momentum`,
    `_data_format`/`_data_layout`, `_use_global_stats`, the same from 2.6 to 3.3).
    `_BatchNormBase` covers BatchNorm1D/2D/3D and SyncBatchNorm; `paddle.nn.BatchNorm`
    is the older layer with `data_layout`."""

    def __init__(self, layer, mean, variance, momentum: float, channel_last: bool, frozen: bool):
        self.layer, self.mean, self.variance = layer, mean, variance
        self.momentum, self.channel_last, self.frozen = momentum, channel_last, frozen

    def channel_axis(self, ndim: int) -> int:
        return ndim - 1 if self.channel_last else 1

    @classmethod
    def of(cls, layer) -> Optional["BatchNormState"]:
        """The layer's statistics, or None when it is no BatchNorm."""
        import paddle

        kinds = (paddle.nn.layer.norm._BatchNormBase, paddle.nn.BatchNorm)
        if not isinstance(layer, kinds):
            return None
        layout = getattr(layer, "_data_format", None) or getattr(layer, "_data_layout", "NCHW")
        frozen = bool(getattr(layer, "_use_global_stats", False))
        momentum = getattr(layer, "_momentum", 0.9)
        return cls(layer, layer._mean, layer._variance, float(momentum),
                   layout in ("NHWC", "NLC", "NDHWC"), frozen)
