"""A config's dotted keys, set with their types checked: `-o section.key=value` overrides and
YAML mappings alike.

An unknown key is a `ConfigError` naming the closest valid key; a value of the wrong type
is one saying what the key takes. Command-line text is read against the key's type
(`yaml.safe_load` for numbers and booleans, never `eval`; a str key keeps what was typed).
A Config is frozen: each function returns a new one, sharing the sections it left alone.

Example:
    cfg = with_key(Config(), *parse_override("train.epochs=3"), from_text=True)   # cfg.train.epochs == 3
    cfg = merged(cfg, {"train": {"lr": 0.1}})
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Dict, List

import yaml

from .errors import ConfigError
from .schema import Config


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


def merged(cfg: Config, data: Dict[str, Any], prefix: str = "") -> Config:
    """`cfg` with every key of the nested mapping `data` (a YAML file's) set, in its order."""
    for key, value in data.items():
        cfg = with_key(cfg, f"{prefix}{key}", value)
    return cfg


def with_key(cfg: Config, dotted: str, value: Any, from_text: bool = False) -> Config:
    """`cfg` with one dotted key set, checking that it exists and that the value has its
    type. `from_text`: the value is command-line text, read according to the key's type."""
    *parents, leaf = dotted.split(".")
    path = [cfg]          # the sections from the root down to the key's
    for i, part in enumerate(parents):
        if isinstance(path[-1], dict):
            raise ConfigError(f"{dotted} is too deep; {'.'.join(parents[:i])} holds NAME: value pairs")
        path.append(getattr(path[-1], _field(path[-1], part, ".".join(parents[: i + 1]))))
    node = path[-1]
    if isinstance(node, dict):   # a free-form mapping such as dist.nccl.extra
        return _rebuilt(path, parents, {**node, leaf: str(value)})
    name, changes = _field(node, leaf, dotted), {}
    if dotted == "dist.nnodes" and isinstance(value, str) and ":" in value:
        changes["min_nnodes"], value, from_text = _nodes_range(value), value.partition(":")[2].strip(), True
    current, type_name = getattr(node, name), _field_type(node, name)
    if from_text:
        value = _from_text(value, type_name)
    if dataclasses.is_dataclass(current):
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted} is a section; set its keys, e.g. {dotted}.<key>=...")
        return merged(cfg, value, f"{dotted}.")
    changes[name] = _coerce(dotted, value, type_name)
    return _rebuilt(path, parents, dataclasses.replace(node, **changes))


def _rebuilt(path: List[Any], names: List[str], node: Any) -> Any:
    """The root `path[0]` with the section at the end of `path` (reached through the fields
    `names`) replaced by `node`: each section above it a new one."""
    for parent, name in zip(reversed(path[:-1]), reversed(names)):
        node = dataclasses.replace(parent, **{name: node})
    return node


def _nodes_range(text: str) -> int:
    """dist.nnodes=MIN:MAX, as torchrun's --nnodes: MIN (dist.min_nnodes); MAX stays nnodes's."""
    low, _, high = text.partition(":")
    if not (low.strip().isdigit() and high.strip().isdigit() and 1 <= int(low) <= int(high)):
        raise ConfigError(f"dist.nnodes={text!r} must be N or MIN:MAX with 1 <= MIN <= MAX, e.g. 1:2 "
                          "(in YAML, quote it: nnodes: \"1:2\")")
    return int(low)


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
