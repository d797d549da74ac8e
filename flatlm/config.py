"""The one override path for nested frozen dataclass configs, and their flat views.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, kw_only=True)
... class Inner:
...     lr: float = 1e-3
>>> @dataclass(frozen=True, kw_only=True)
... class Outer:
...     name: str = "x"
...     inner: Inner = Inner()
>>> apply_overrides(Outer(), {"inner.lr": "3e-4"}).inner.lr
0.0003
>>> to_flat_dict(Outer())
{'name': 'x', 'inner.lr': 0.001}
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A config key or value that cannot be applied; the message names the key and the fix."""


def _field_types(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _allowed(tp) -> tuple:
    """The plain types a field accepts (Optional/unions unpacked; Literal values kept)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(tp) for t in _allowed(arg))
    if origin is tuple:
        return (tuple,)
    if origin is dict:
        return (dict,)
    return (tp,)


def _coerce(key: str, value: Any, tp) -> Any:
    """Converts ``value`` (maybe a string from a command line) to the field's type, or fails."""
    allowed = _allowed(tp)
    if isinstance(value, str) and str not in allowed:
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            if value.lower() in ("none", "null") and type(None) in allowed:
                return None
            raise ConfigError(f"{key}={value!r}: expected {tp}") from None
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, list) and tuple in allowed:
        return tuple(value)
    for t in allowed:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(t, type) and isinstance(value, t):
            if t is int and isinstance(value, bool) and bool not in allowed:
                continue
            return value
    if typing.Any in allowed:
        return value
    raise ConfigError(f"{key}={value!r}: expected {tp}")


def apply_overrides(cfg, overrides: dict[str, Any]):
    """A copy of ``cfg`` with dotted keys (``train.lr``) replaced; unknown keys are errors."""
    for key, value in overrides.items():
        cfg = _apply_one(cfg, key.split("."), value, key)
    return cfg


def _apply_one(cfg, path: list[str], value, full_key: str):
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    head = path[0]
    if head not in fields:
        raise ConfigError(f"unknown config key {full_key!r}: {type(cfg).__name__} has "
                          f"{', '.join(sorted(fields))}")
    current = getattr(cfg, head)
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"unknown config key {full_key!r}: {head} has no sub-fields")
        new = _apply_one(current, path[1:], value, full_key)
    elif dataclasses.is_dataclass(current) and isinstance(value, dict):
        new = apply_overrides(current, {k: v for k, v in value.items()})
    else:
        new = _coerce(full_key, value, _field_types(type(cfg))[head])
    try:
        return dataclasses.replace(cfg, **{head: new})
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{full_key}={value!r}: {e}") from None


def to_flat_dict(cfg, prefix: str = "") -> dict[str, Any]:
    """Nested dataclass -> {"a.b": value}; the MLflow params and the sweep's search keys."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(to_flat_dict(value, key + "."))
        elif isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in _flatten_dict(value).items()})
        else:
            out[key] = value
    return out


def _flatten_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def to_dict(cfg) -> dict:
    """Nested plain dict (JSON-ready) of a dataclass config."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=list))


def from_dict(cls, data: dict):
    """Rebuilds a nested dataclass config from ``to_dict`` output (unknown keys are errors)."""
    flat = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            flat[f.name] = data[f.name]
    unknown = set(data) - set(flat)
    if unknown:
        raise ConfigError(f"unknown config key(s) {sorted(unknown)} for {cls.__name__}")
    return apply_overrides(cls(), flat)
