"""Typed configuration: defaults -> YAML file -> `-o section.key=value` overrides.

Every key has a typed default in schema.py (with the comment that explains it). Setting a
key (config_keys.py): an unknown key or a value of the wrong type is a `ConfigError` naming
the key (and, for a typo, the closest valid key); values are parsed with `yaml.safe_load`,
never `eval`. `validate` then checks what types alone cannot express (ranges, choices, keys
that go together).

A Config is frozen (assigning a field raises dataclasses.FrozenInstanceError): what is
resolved once stays resolved. A changed config is a new one, made by `derived`.

Example:
    cfg = load("configs/mnist_lenet.yaml", ["train.api=hapi", "train.epochs=3"])
    cfg.train.epochs  # -> 3
    derived(cfg, {"train.epochs": 5}).train.epochs   # -> 5; cfg.train.epochs is still 3
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .config_keys import merged, parse_override, with_key
from .errors import ConfigError
from .security import private
from .schema import (CHOICES, CONFIG_DIR, DEFAULT_CONFIG,
                     FAULT_KINDS, NON_NEGATIVE, POSITIVE, VOLATILE_KEYS,
                     Config, DistConfig, TrainConfig)

FIT_RECORD = "fit"      # config.yaml's record of a paddle_dist.fit() run (dump)

def resolve_path(name_or_path: str) -> Path:
    """A config path, or the name of a bundled config ("mnist_mlp" -> configs/mnist_mlp.yaml;
    an installed package has them as paddle_dist/configs/, see schema.CONFIG_DIR).

    A bare name (no "/") is a bundled config and nothing else: a file of that name in the
    working directory, which another user may have put there, is never read by accident.
    Such a file needs a path ("./x.yaml"); one line says so when both exist.

    Example:
        resolve_path("mnist_mlp")       # configs/mnist_mlp.yaml, whatever the working directory holds
        resolve_path("./mine.yaml")     # mine.yaml in the working directory
    """
    if "/" in name_or_path or os.sep in name_or_path:
        path = Path(name_or_path)
        if path.is_dir():
            raise ConfigError(f"config {name_or_path!r} is a directory; pass a YAML file")
        if path.is_file():
            return path
        raise ConfigError(f"config file {name_or_path!r} not found; pass a YAML path or one of: {_known()}")
    stem = name_or_path[:-len(".yaml")] if name_or_path.endswith(".yaml") else name_or_path
    bundled = CONFIG_DIR / f"{stem}.yaml"
    local = [name for name in dict.fromkeys((name_or_path, f"{stem}.yaml")) if Path(name).exists()]
    if bundled.is_file():
        if local:
            _say_once(f"paddle_dist: config {name_or_path!r} is the bundled {bundled}; the file {local[0]} "
                      f"in the working directory is not read (pass ./{local[0]} to use it)")
        return bundled
    if local and Path(local[0]).is_dir():
        raise ConfigError(f"config {name_or_path!r} is a directory; pass a YAML file")
    if local:
        raise ConfigError(f"config {name_or_path!r} is no bundled config; a file in the working directory "
                          f"needs a path: pass -c ./{local[0]} (bundled: {_known()})")
    raise ConfigError(f"config file {name_or_path!r} not found; pass a YAML path or one of: {_known()}")


def _known() -> str:
    return ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))


_said: set = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        print(line, file=sys.stderr, flush=True)


def load(path: Optional[str] = None, overrides: List[str] = (), fit_record: bool = False) -> Config:
    """Build the config: defaults, then the YAML file (default: configs/mnist_lenet.yaml), then overrides.

    A run directory's config.yaml from `paddle_dist.fit()` holds a `fit:` record of the
    script's own model and optimizer (dump), which no built-in job can rebuild: loading it
    is refused unless `fit_record` (a script's own load_config, which ignores the record).
    """
    cfg = Config()
    source = resolve_path(path or DEFAULT_CONFIG)
    data = read_yaml(source)
    record = data.pop(FIT_RECORD, None)
    if record is not None and not fit_record:
        raise ConfigError(refuse_fit_run(source, record, "train.py builds only its built-in models: "
                                                         "run that script again to repeat or continue the run"))
    cfg = _override(merged(cfg, data), overrides)
    if not cfg.output.name:
        cfg = with_key(cfg, "output.name", source.stem)
    validate(cfg)
    return cfg


def refuse_fit_run(where, record: Any, consequence: str) -> str:
    """One line: `where` holds a `fit()` run (its config.yaml's `fit:` record), and so what."""
    model = record.get("model", "?") if isinstance(record, dict) else "?"
    return f"{where} is from a paddle_dist.fit() run of the script's own model {model}; {consequence}"


def fit_record(path: Path) -> Optional[Dict[str, Any]]:
    """The `fit:` record of a run's config.yaml (None for a built-in job's)."""
    record = read_yaml(Path(path)).get(FIT_RECORD)
    return record if isinstance(record, dict) else None


def with_overrides(overrides: List[str] = ()) -> Config:
    """The typed defaults (no YAML file) with `overrides`, checked."""
    cfg = _override(Config(), overrides)
    validate(cfg)
    return cfg


def _override(cfg: Config, overrides: List[str]) -> Config:
    for item in overrides:
        key, text = parse_override(item)
        cfg = with_key(cfg, key, text, from_text=True)
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


def validate(cfg: Config) -> None:
    """Range and choice checks that types alone cannot express."""
    for key, allowed in CHOICES.items():
        value = get_key(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key} must be one of {', '.join(allowed)} (got {value!r})")
    if not 0 <= cfg.train.ema_decay < 1:
        raise ConfigError(f"train.ema_decay must be in [0, 1), e.g. 0.999 (got {cfg.train.ema_decay!r}); 0 = off")
    monitor = cfg.checkpoint.monitor
    if monitor != "train_loss" and not (monitor.startswith("eval_") and len(monitor) > 5):
        raise ConfigError(f"checkpoint.monitor must be train_loss or eval_<metric> such as eval_accuracy, "
                          f"eval_loss or a fit() metric's eval_<name> (got {monitor!r})")
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
    if d.min_nnodes > d.nnodes:
        raise ConfigError(f"dist.min_nnodes={d.min_nnodes} is above dist.nnodes={d.nnodes}; give "
                          f"dist.nnodes={d.min_nnodes}:{max(d.nnodes, d.min_nnodes)}, MIN:MAX")
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


def _validate_sync(cfg: Config) -> None:
    s = cfg.sync
    if s.mode == "dataparallel" and (s.compress != "none" or s.bucket_mb or s.transport != "auto"):
        raise ConfigError("sync.compress, sync.bucket_mb and sync.transport apply to paddle_dist's "
                          "own sync (sync.mode=auto|overlap|fused); paddle.DataParallel's reducer "
                          "has its own buckets")


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
    cfg = merged(Config(), data)
    validate(cfg)
    return cfg


def replace_key(cfg: Config, dotted: str, value: Any) -> Config:
    """`derived` with one key: `cfg` with `dotted` set to `value`."""
    return derived(cfg, {dotted: value})


def derived(cfg: Config, changes: Dict[str, Any]) -> Config:
    """The one way to change a config: a new Config, `cfg` with `changes` (dotted key ->
    value) made in their order, each checked like an override (the key exists, the value
    has its type). `cfg` itself is frozen and stays as it was.

    Example:
        derived(cfg, {"checkpoint.resume": "auto", "faults.inject": ""})
    """
    for dotted, value in changes.items():
        cfg = with_key(cfg, dotted, value)
    return cfg


def dump(cfg: Config, path: Path, fit: Optional[Dict[str, Any]] = None) -> None:
    """Write the resolved config as YAML, loadable again with `load(path)`.

    `fit`: the record of a `paddle_dist.fit()` run (its model, optimizer and data, which
    are the script's own), written first as `fit:`; the keys that run did not use (the
    built-in model and dataset, and the config's optimizer when the script brought its
    own) are left out, so that the file says only what the run was.
    """
    data = cfg.to_dict()
    if fit is not None:
        data.pop("model")
        data["data"] = {"batched": cfg.data.batched}
        if fit.get("optimizer_from") == "script":
            for key in ("optimizer", "lr", "weight_decay"):
                data["train"].pop(key)
        data = {FIT_RECORD: fit, **data}
    private.write_text(path, yaml.safe_dump(data, sort_keys=False))


def config_differences(old: Dict[str, Any], new: Dict[str, Any], limit: int = 6) -> str:
    """The keys in which config dict `new` differs from `old`, beyond VOLATILE_KEYS, in
    words ("" when none): "model.name lenet -> mlp, train.lr 0.1 -> 0.05".

    Example:
        config_differences({"train": {"lr": 0.1}}, {"train": {"lr": 0.05}})   # 'train.lr 0.1 -> 0.05'
    """
    def flat(tree: Dict[str, Any]) -> Dict[str, Any]:
        return {f"{section}.{key}": value for section, leaves in tree.items() if isinstance(leaves, dict)
                for key, value in leaves.items()
                if section not in VOLATILE_KEYS and f"{section}.{key}" not in VOLATILE_KEYS}

    # A key `old` lacks (a config written before the key existed) had its default.
    before, after = {**flat(Config().to_dict()), **flat(old)}, flat(new)
    changed = [f"{key} {before.get(key, '(unset)')} -> {after.get(key, '(unset)')}"
               for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]
    more = f" and {len(changed) - limit} more" if len(changed) > limit else ""
    return ", ".join(changed[:limit]) + more


def config_hash(cfg_dict: Dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the config without the keys a resume may change
    (VOLATILE_KEYS: output, checkpoint, faults, dist, epochs, max_steps, log_every).
    Equal hashes: the same experiment (a run continues only a run with its hash).

    Example:
        config_hash(cfg.to_dict())   # -> '3f9a0c1d2b4e5f60'
    """
    text = json.dumps(_identity(cfg_dict), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def key_digests(cfg_dict: Dict[str, Any]) -> Tuple[Tuple[str, str], ...]:
    """(key, 6 hex digits of its value) for every key config_hash covers, in key order: two
    machines that compare these name the first key in which their configs differ without
    either sending the other its values (launch/host.py, the machines' meeting).

    Example:
        dict(key_digests(cfg.to_dict()))["train.lr"]   # -> '9c1e4b'
    """
    flat = {}
    for section, leaves in _identity(cfg_dict).items():
        for key, value in (leaves.items() if isinstance(leaves, dict) else [("", leaves)]):
            flat[f"{section}.{key}" if key else section] = value
    return tuple((key, hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:6])
                 for key, value in sorted(flat.items()))


def _identity(cfg_dict: Dict[str, Any]) -> Dict[str, Any]:
    """The config without VOLATILE_KEYS: what makes two runs the same experiment."""
    kept = copy.deepcopy(cfg_dict)
    for key in VOLATILE_KEYS:
        section, _, leaf = key.partition(".")
        if not leaf:
            kept.pop(section, None)
        elif isinstance(kept.get(section), dict):
            kept[section].pop(leaf, None)
    return kept
