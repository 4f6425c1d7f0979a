"""Typed configuration: defaults -> YAML file -> `-o section.key=value` overrides.

Every key has a typed default below. An unknown key or a value of the wrong type is a
`ConfigError` naming the key (and, for a typo, the closest valid key). Values are parsed
with `yaml.safe_load`, never `eval`.

Example:
    cfg = load("configs/mnist_lenet.yaml", ["train.api=hapi", "train.epochs=3"])
    cfg.train.epochs  # -> 3
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from .errors import ConfigError

# Keys a run and its resume may differ in without training anything differently: where
# and how the job is started, watched and written, and how long it runs. (The world
# size, part of dist, is checked on its own when a checkpoint is loaded.)
VOLATILE_KEYS = ("output", "checkpoint", "faults", "dist", "train.epochs", "train.max_steps",
                 "train.log_every")
CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
DEFAULT_CONFIG = "mnist_lenet"


@dataclass
class DataConfig:
    name: str = "mnist"            # mnist | cifar10 | imagefolder | synthetic | linear
    root: str = ""                 # mnist: IDX directory; "" = the bundled 4,000/1,000 subset.
                                   # cifar10: cifar-10-python.tar.gz, cifar-10-batches-py/ or
                                   # cifar-10-batches-bin/ (or a directory holding one); "" =
                                   # Paddle's cache (~/.cache/paddle/dataset/cifar), downloaded once
    augment: bool = True           # training images: cifar10 random crop (4-pixel padding) + flip;
                                   # imagefolder random flip
    image_size: int = 32           # imagefolder: shorter side resized to this, centre-cropped square
    mean: str = "0.485,0.456,0.406"  # imagefolder: per-channel (RGB) mean and std after scaling
    std: str = "0.229,0.224,0.225"   # to [0, 1] (one number: every channel)
    num_samples: int = 4096        # synthetic / linear: training samples (synthetic images
                                   # take the model's input shape: 1x28x28, or 3x32x32 for resnets)
    num_eval_samples: int = 1024   # synthetic / linear: evaluation samples
    seed: int = 0                  # synthetic / linear: data generator seed
    batched: bool = True           # in-memory datasets: gather each batch with one indexing op
                                   # (false: paddle.io.DataLoader, per-sample __getitem__ + collate)


@dataclass
class ModelConfig:
    name: str = "lenet"            # lenet | mlp | linear | resnet18 (CIFAR form: 3x3 stem, no
                                   # max-pool) | resnet50 (paddle.vision's)
    num_classes: int = 0           # 0 = the data's: 10, or imagefolder's class folders


@dataclass
class TrainConfig:
    api: str = "loop"              # loop (manual DataParallel) | hapi (paddle.Model.fit)
    epochs: int = 5                # 0: evaluate only (see eval_only)
    eval_only: bool = False        # evaluate checkpoint.resume's checkpoint on the test set on
                                   # every rank (exact counts), write metrics.json, train nothing
    batch_size: int = 64           # per rank; the global batch is batch_size * world_size
    eval_batch_size: int = 500     # per rank
    optimizer: str = "adam"        # adam | sgd | momentum
    lr: float = 0.001              # for lr_reference_batch samples per step (see lr_scaling)
    lr_scaling: str = "none"       # linear | sqrt | none: lr x (global batch / lr_reference_batch),
                                   # or its square root; global batch = batch_size x ranks x accumulate_steps
    lr_reference_batch: int = 256  # the global batch `lr` was tuned for
    warmup_epochs: float = 0.0     # ramp the lr linearly from lr/steps up to its value over these epochs
    lr_schedule: str = "constant"  # constant | cosine (to 0 at the last step) | step
    lr_milestones: str = ""        # step: epochs after which the lr is multiplied by lr_gamma, e.g. "30,60"
    lr_gamma: float = 0.1
    amp: str = "off"               # off | O1 (autocast per op) | O2 (16-bit weights, fp32 master copy)
    amp_dtype: str = "auto"        # auto (float16 on GPU, bfloat16 on CPU) | float16 | bfloat16
    loss_scale: float = 32768.0    # float16: initial dynamic loss scale (bfloat16 needs none)
    weight_decay: float = 0.0
    shuffle: bool = True           # order = Paddle's DistributedBatchSampler, seeded by epoch
    drop_last: bool = False
    seed: int = 2024               # weights and every other random draw
    max_steps: int = 0             # stop after this many steps in total; 0 = run all epochs
    accumulate_steps: int = 1      # micro-batches of batch_size per optimizer step; gradients
                                   # are communicated once per optimizer step
    early_stop_patience: int = 0   # stop after this many evaluations without a better
                                   # checkpoint.monitor value; 0 = never
    log_every: int = 20            # steps between progress lines


@dataclass
class NcclConfig:
    socket_ifname: str = ""        # NCCL_SOCKET_IFNAME, e.g. "eth0" or "^lo,docker"
    ib_hca: str = ""               # NCCL_IB_HCA, e.g. "mlx5_0,mlx5_1"
    ib_disable: Optional[bool] = None   # NCCL_IB_DISABLE
    p2p_disable: Optional[bool] = None  # NCCL_P2P_DISABLE
    debug: str = ""                # NCCL_DEBUG: WARN | INFO | TRACE
    debug_subsys: str = ""         # NCCL_DEBUG_SUBSYS, e.g. "INIT,NET"
    extra: Dict[str, str] = field(default_factory=dict)  # any other NCCL_* variable


@dataclass
class DistConfig:
    nprocs: Optional[int] = None   # processes on this machine (default: one per dist.gpus id, else 1);
                                   # > 1 makes train.py launch them
    launcher: str = "launch"       # launch (python -m paddle.distributed.launch) | spawn | mpirun
    start_method: str = "auto"     # spawn launcher: auto (fork on CPU: the ranks reuse this
                                   # process's `import paddle`; spawn on GPU, as CUDA needs) |
                                   # spawn | fork | forkserver
    nnodes: int = 1                # machines in the job (launch mode: each runs train.py once)
    node_rank: int = 0             # this machine's index, 0 .. nnodes-1
    master: str = ""               # host:port of node 0's rendezvous; needed when nnodes > 1
    host: str = ""                 # this machine's address as the others see it; "" = the
                                   # local address of the route to the master
    hostfile: str = ""             # mpirun: OpenMPI hostfile ("HOST slots=N" lines)
    gpus: str = ""                 # e.g. "0,1": physical ids, as in CUDA_VISIBLE_DEVICES
    backend: str = "auto"          # auto (nccl on GPU, gloo on CPU) | gloo | nccl
    rendezvous_timeout: float = 120.0  # seconds to wait for every rank to arrive; 0 = forever
    hang_timeout: float = 300.0    # a rank with no progress this long (outside collectives) is hung; 0 = off
    stop_timeout: float = 60.0     # after SIGTERM, seconds the ranks get to save and stop before SIGKILL
    max_restarts: int = 0          # restart a failed job from its latest checkpoint up to N times
    nccl: NcclConfig = field(default_factory=NcclConfig)


@dataclass
class SyncConfig:
    mode: str = "auto"             # overlap: buckets all-reduced during backward() as they fill |
                                   # fused: one exchange at the optimizer step | auto: fused when
                                   # every rank is on this machine's CPUs (shared memory), else
                                   # overlap | dataparallel: Paddle's reducer
    transport: str = "auto"        # CPU: auto (shm on one machine, hierarchical across machines
                                   # with several ranks each, else backend) | shm | hierarchical
                                   # (shm within a host + backend between hosts) | backend (the
                                   # process group's all-reduce: gloo, NCCL)
    bucket_mb: float = 0.0         # cap on one buffer in MiB; 0 = the mode's default: one buffer
                                   # (fused), 25 (overlap; small models: ~4 buckets)
    compress: str = "none"         # none | bf16 | fp16: all-reduce gradients in 16 bits
                                   # over the backend (half the bytes; approximate, opt-in)


@dataclass
class CheckpointConfig:
    every_epochs: int = 1          # 0 = never
    every_steps: int = 0           # also every N optimizer steps (mid-epoch); 0 = never
    keep_last: int = 3
    resume: str = "auto"           # auto (latest in this run dir, if any) | none | a checkpoint path
    monitor: str = "eval_accuracy" # the metric that picks <run>/best and early stopping:
                                   # eval_accuracy (higher is better) | eval_loss | train_loss
    save_best: bool = True         # keep the best epoch's checkpoint in <run>/best


@dataclass
class OutputConfig:
    root: str = "runs"             # runs go to <root>/<name>-<timestamp>
    name: str = ""                 # "" = the config file's stem
    run_dir: str = ""              # explicit run directory; must not hold a finished run


@dataclass
class FaultsConfig:
    inject: str = ""               # testing: KIND:RANK:STEP, KIND = raise|exit|kill|hang|slowsave


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


CHOICES = {
    "data.name": ("mnist", "cifar10", "imagefolder", "synthetic", "linear"),
    "model.name": ("lenet", "mlp", "linear", "resnet18", "resnet50"),
    "train.api": ("loop", "hapi"),
    "train.optimizer": ("adam", "sgd", "momentum"),
    "dist.launcher": ("launch", "spawn", "mpirun"),
    "dist.start_method": ("auto", "spawn", "fork", "forkserver"),
    "dist.backend": ("auto", "gloo", "nccl"),
    "sync.mode": ("auto", "overlap", "fused", "dataparallel"),
    "sync.compress": ("none", "bf16", "fp16"),
    "sync.transport": ("auto", "shm", "hierarchical", "backend"),
    "train.lr_scaling": ("none", "linear", "sqrt"),
    "train.lr_schedule": ("constant", "cosine", "step"),
    "train.amp": ("off", "O1", "O2"),
    "train.amp_dtype": ("auto", "float16", "bfloat16"),
    "checkpoint.monitor": ("eval_accuracy", "eval_loss", "train_loss"),
}
# What each built-in model and dataset is for (the model picks its loss and metric).
MODEL_TASKS = {"linear": "regression", "mlp": "classification", "lenet": "classification",
               "resnet18": "classification", "resnet50": "classification"}
# One sample's shape for each model, and for each dataset with a fixed shape (synthetic
# images take their model's).
MODEL_INPUTS = {"linear": (10,), "mlp": (1, 28, 28), "lenet": (1, 28, 28),
                "resnet18": (3, 32, 32), "resnet50": (3, 32, 32)}
DATA_SHAPES = {"mnist": (1, 28, 28), "cifar10": (3, 32, 32)}
ANY_SIZE_MODELS = ("resnet18", "resnet50")     # 3-channel images of any size (8 px and up)
DATA_TASKS = {"linear": "regression", "mnist": "classification", "cifar10": "classification",
              "synthetic": "classification", "imagefolder": "classification"}
POSITIVE = ("data.image_size", "train.batch_size", "train.eval_batch_size", "train.log_every",
            "data.num_samples", "data.num_eval_samples")
POSITIVE += ("dist.nnodes", "train.accumulate_steps", "train.lr_reference_batch", "train.loss_scale")
NON_NEGATIVE = ("model.num_classes", "train.epochs", "dist.node_rank", "train.max_steps", "train.weight_decay", "checkpoint.every_epochs",
                "train.warmup_epochs", "train.lr_gamma", "train.early_stop_patience",
                "checkpoint.every_steps", "checkpoint.keep_last", "dist.rendezvous_timeout",
                "dist.hang_timeout", "dist.stop_timeout", "dist.max_restarts", "sync.bucket_mb")


def resolve_path(name_or_path: str) -> Path:
    """A config path, or the name of a file in configs/ ("mnist_mlp" -> configs/mnist_mlp.yaml)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    if path.is_dir():
        raise ConfigError(f"config {name_or_path!r} is a directory; pass a YAML file")
    bundled = CONFIG_DIR / f"{name_or_path}.yaml"
    if "/" not in name_or_path and bundled.is_file():
        return bundled
    known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
    raise ConfigError(f"config file {name_or_path!r} not found; pass a YAML path or one of: {known}")


def load(path: Optional[str] = None, overrides: List[str] = ()) -> Config:
    """Build the config: defaults, then the YAML file (default: configs/mnist_lenet.yaml), then overrides."""
    cfg = Config()
    source = resolve_path(path or DEFAULT_CONFIG)
    merge(cfg, read_yaml(source))
    for item in overrides:
        key, text = parse_override(item)
        set_key(cfg, key, text, from_text=True)
    if not cfg.output.name:
        cfg.output.name = source.stem
    validate(cfg)
    return cfg


def read_yaml(path: Path) -> Dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where} is not valid YAML ({getattr(exc, 'problem', exc)}); fix the file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not a text (UTF-8) YAML file; pass a YAML config") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (data:, model:, train:, ...)")
    return data


def parse_override(item: str):
    """'train.epochs=3' -> ('train.epochs', '3'): the key and the value's text, read later
    against the key's type (YAML scalars such as 3, 0.1, true; strings kept as typed)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like section.key=value, e.g. train.epochs=3")
    return key.strip(), text.strip()


def _from_text(text: str, type_name: str) -> Any:
    if type_name == "str":   # keep what was typed: output.name=2024_01 stays "2024_01"
        quoted = len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""
        return text[1:-1] if quoted else text
    try:
        return yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text


def merge(cfg: Any, data: Dict[str, Any], prefix: str = "") -> None:
    for key, value in data.items():
        set_key(cfg, f"{prefix}{key}", value)


def set_key(cfg: Config, dotted: str, value: Any, from_text: bool = False) -> None:
    """Set a dotted key, checking that it exists and that the value has its type.
    `from_text`: the value is command-line text, read according to the key's type."""
    *parents, leaf = dotted.split(".")
    node = cfg
    for i, part in enumerate(parents):
        if isinstance(node, dict):
            raise ConfigError(f"{dotted} is too deep; {'.'.join(parents[:i])} holds NAME: value pairs")
        node = getattr(node, _field(node, part, ".".join(parents[: i + 1])))
    if isinstance(node, dict):   # a free-form mapping such as dist.nccl.extra
        node[leaf] = str(value)
        return
    name = _field(node, leaf, dotted)
    current, type_name = getattr(node, name), _field_type(node, name)
    if from_text:
        value = _from_text(value, type_name)
    if dataclasses.is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted} is a section; set its keys, e.g. {dotted}.<key>=...")
        merge(cfg, value, f"{dotted}.")
        return
    setattr(node, name, _coerce(dotted, value, type_name))


def _field(node: Any, name: str, dotted: str) -> str:
    names = [f.name for f in dataclasses.fields(node)]
    if name in names:
        return name
    section = dotted.rpartition(".")[0]
    full = [f"{section}.{n}" if section else n for n in names]
    close = difflib.get_close_matches(dotted, full + _all_keys(), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; valid keys here: {', '.join(full)}"
    raise ConfigError(f"unknown config key {dotted!r}{hint}")


def _all_keys(node: Any = None, prefix: str = "") -> List[str]:
    node = node if node is not None else Config()
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            keys += _all_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def _field_type(node: Any, name: str) -> str:
    return str({f.name: f.type for f in dataclasses.fields(node)}[name])


def _coerce(key: str, value: Any, type_name: str) -> Any:
    """Check a value against a field's annotation; ints are accepted for floats, nothing else converts."""
    if value is None and type_name.startswith("Optional"):
        return None
    base = type_name[len("Optional["):-1] if type_name.startswith("Optional[") else type_name
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, (str, int, float)) and not isinstance(value, bool),
        "Dict[str, str]": isinstance(value, dict),
    }[base]
    if not ok and base == "float" and isinstance(value, str):
        # YAML 1.1 reads 1e-3 (no dot) as a string; it is still a number.
        try:
            value, ok = float(value), True
        except ValueError:
            pass
    if not ok:
        raise ConfigError(f"{key} must be {_type_words(base)}, got {value!r}")
    if base == "float":
        return float(value)
    if base == "str":
        return str(value)
    if base == "Dict[str, str]":
        return {str(k): str(v) for k, v in value.items()}
    return value


def _type_words(base: str) -> str:
    return {"bool": "true or false", "int": "an integer", "float": "a number",
            "str": "a string", "Dict[str, str]": "a mapping of NAME: value"}[base]


def validate(cfg: Config) -> None:
    """Range and choice checks that types alone cannot express."""
    for key, allowed in CHOICES.items():
        value = get_key(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)} (got {value!r})")
    for key in POSITIVE:
        if get_key(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1 (got {get_key(cfg, key)!r})")
    for key in NON_NEGATIVE:
        if get_key(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0 (got {get_key(cfg, key)!r})")
    if cfg.dist.nprocs is not None and cfg.dist.nprocs < 1:
        raise ConfigError(f"dist.nprocs must be >= 1 (got {cfg.dist.nprocs}); use 2 for two processes")
    if not (math.isfinite(cfg.train.lr) and cfg.train.lr > 0):
        raise ConfigError(f"train.lr must be a finite number > 0 (got {cfg.train.lr!r})")
    _validate_fault(cfg.faults.inject)
    if evaluates_only(cfg) and str(cfg.checkpoint.resume).strip().lower() in ("auto", "none", ""):
        raise ConfigError("evaluating only (train.eval_only, --eval-only or train.epochs=0) needs "
                          "the checkpoint to evaluate: add -o checkpoint.resume=PATH (a run "
                          "directory, its best/ or checkpoints/, or one ckpt_* directory)")
    _validate_nodes(cfg.dist)
    _validate_sync(cfg)
    _validate_schedule(cfg.train)
    for name in cfg.dist.nccl.extra:
        if not name.startswith("NCCL_"):
            raise ConfigError(f"dist.nccl.extra.{name}: only NCCL_* variables belong here")


def evaluates_only(cfg: Config) -> bool:
    """True when the job evaluates a checkpoint and trains nothing."""
    return cfg.train.eval_only or cfg.train.epochs == 0


def _validate_nodes(d: DistConfig) -> None:
    if d.node_rank >= d.nnodes:
        raise ConfigError(f"dist.node_rank must be below dist.nnodes ({d.node_rank} >= {d.nnodes}); "
                          "number the machines 0 .. nnodes-1")
    if d.nnodes > 1 and d.launcher != "launch":
        raise ConfigError(f"dist.nnodes={d.nnodes} needs dist.launcher=launch (spawn runs on one "
                          "machine; mpirun takes its machines from dist.hostfile)")
    if d.master:
        host, sep, port = d.master.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"dist.master {d.master!r} must be host:port, e.g. 10.0.0.1:6170")
    elif d.nnodes > 1:
        raise ConfigError("dist.nnodes > 1 needs dist.master=host:port (node 0's address and a free "
                          "port), the same on every machine")
    if d.hostfile and not Path(d.hostfile).is_file():
        raise ConfigError(f"dist.hostfile {d.hostfile!r} not found; give an OpenMPI hostfile "
                          "with lines like 'node1 slots=8'")


def check_pairing(cfg: Config) -> None:
    """The built-in job's model and data must be for the same task (not needed by `fit`,
    which takes the user's own model and data)."""
    task, data_task = MODEL_TASKS[cfg.model.name], DATA_TASKS[cfg.data.name]
    if task != data_task:
        raise ConfigError(f"model.name={cfg.model.name} ({task}) does not fit data.name="
                          f"{cfg.data.name} ({data_task}); use model.name=linear with data.name=linear, "
                          "a classifier (lenet, mlp, resnet18, resnet50) with mnist, cifar10 or synthetic")
    shape = DATA_SHAPES.get(cfg.data.name)
    if shape and shape != MODEL_INPUTS[cfg.model.name]:
        fits = [m for m, s in MODEL_INPUTS.items() if s == shape]
        raise ConfigError(f"model.name={cfg.model.name} takes {_dims(MODEL_INPUTS[cfg.model.name])} "
                          f"inputs but data.name={cfg.data.name} has {_dims(shape)} images; use "
                          f"model.name={' or '.join(fits)}")
    if cfg.data.name == "imagefolder" and cfg.model.name not in ANY_SIZE_MODELS:
        raise ConfigError(f"model.name={cfg.model.name} takes {_dims(MODEL_INPUTS[cfg.model.name])} "
                          f"inputs but data.name=imagefolder has 3x{cfg.data.image_size}x"
                          f"{cfg.data.image_size} images; use model.name={' or '.join(ANY_SIZE_MODELS)}")


def _dims(shape) -> str:
    return "x".join(str(n) for n in shape)


def check_compress(compress: str, backend: str) -> None:
    """sync.compress against the process group's backend, once that is known."""
    if compress == "fp16" and backend == "gloo":
        raise ConfigError("sync.compress=fp16 does not work with gloo (Paddle's gloo all-reduce "
                          "of float16 returns inf); use sync.compress=bf16")


def _validate_sync(cfg: Config) -> None:
    s = cfg.sync
    if s.mode == "dataparallel" and (s.compress != "none" or s.bucket_mb or s.transport != "auto"):
        raise ConfigError("sync.compress, sync.bucket_mb and sync.transport apply to paddle_dist's "
                          "own sync (sync.mode=auto|overlap|fused); paddle.DataParallel's reducer "
                          "has its own buckets")
    if s.transport in ("shm", "hierarchical") and s.compress != "none":
        raise ConfigError(f"sync.compress casts the backend's buffers; sync.transport={s.transport} "
                          "exchanges float32 through shared memory, so use sync.transport=auto or backend")


def milestones(text: str) -> List[int]:
    """train.lr_milestones "30,60" -> [30, 60] (epochs, increasing)."""
    try:
        found = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        found = []
    if text.strip() and (not found or found != sorted(set(found)) or found[0] < 1):
        raise ConfigError(f"train.lr_milestones {text!r} must be increasing epochs, e.g. 30,60")
    return found


def _validate_schedule(t: TrainConfig) -> None:
    steps = milestones(t.lr_milestones)
    if t.lr_schedule == "step" and not steps:
        raise ConfigError("train.lr_schedule=step needs train.lr_milestones, e.g. -o train.lr_milestones=30,60")
    if steps and t.lr_schedule != "step":
        raise ConfigError(f"train.lr_milestones applies to train.lr_schedule=step (got {t.lr_schedule})")


def _validate_fault(spec: str) -> None:
    if not spec:
        return
    from .faults import FAULT_KINDS

    parts = spec.split(":")
    if len(parts) != 3 or parts[0] not in FAULT_KINDS or not all(p.isdigit() for p in parts[1:]):
        raise ConfigError(f"faults.inject {spec!r} must be KIND:RANK:STEP with KIND one of "
                          f"{', '.join(FAULT_KINDS)}, e.g. raise:1:5")


def get_key(cfg: Config, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def from_dict(data: Dict[str, Any]) -> Config:
    """Rebuild a Config from `to_dict()` output (what a spawned child receives)."""
    cfg = Config()
    merge(cfg, data)
    validate(cfg)
    return cfg


def replace_key(cfg: Config, dotted: str, value: Any) -> Config:
    """A copy of `cfg` with one key changed (checked like an override)."""
    copy = from_dict(cfg.to_dict())
    set_key(copy, dotted, value)
    return copy


def dump(cfg: Config, path: Path) -> None:
    """Write the resolved config as YAML, loadable again with `load(path)`."""
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def config_hash(cfg_dict: Dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the config without the keys a resume may change
    (VOLATILE_KEYS: output, checkpoint, faults, dist, epochs, max_steps, log_every).
    Equal hashes: the same experiment (a run continues only a run with its hash).

    Example:
        config_hash(cfg.to_dict())   # -> '3f9a0c1d2b4e5f60'
    """
    kept = copy.deepcopy(cfg_dict)
    for key in VOLATILE_KEYS:
        section, _, leaf = key.partition(".")
        if not leaf:
            kept.pop(section, None)
        elif isinstance(kept.get(section), dict):
            kept[section].pop(leaf, None)
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
