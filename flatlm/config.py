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
    try:
        return typing.get_type_hints(cls)
    except NameError:  # a class defined in a local scope: its annotations are already types
        return {f.name: f.type for f in dataclasses.fields(cls)}


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
    """A copy of ``cfg`` with dotted keys (``train.lr``) replaced; unknown keys are errors.

    All changes to one dataclass are applied together, so cross-field checks in
    ``__post_init__`` see the final values (steps and checkpoint_steps changed at once).
    """
    nested: dict = {}
    for key, value in overrides.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"config key {key!r} conflicts with another override")
        node[leaf] = value
    return _apply_nested(cfg, nested, "")


def _apply_nested(cfg, changes: dict, prefix: str):
    fields = {f.name for f in dataclasses.fields(cfg)}
    types_ = _field_types(type(cfg))
    new = {}
    for name, value in changes.items():
        key = prefix + name
        if name not in fields:
            raise ConfigError(f"unknown config key {key!r}: {type(cfg).__name__} has "
                              f"{', '.join(sorted(fields))}")
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            new[name] = _apply_nested(current, value, key + ".")
        elif isinstance(value, dict) and dict not in _allowed(types_[name]):
            raise ConfigError(f"unknown config key {key + '.' + next(iter(value))!r}: "
                              f"{key} has no sub-fields")
        else:
            new[name] = _coerce(key, value, types_[name])
    try:
        return dataclasses.replace(cfg, **new)
    except (TypeError, ValueError) as e:
        where = prefix.rstrip(".") or type(cfg).__name__
        raise ConfigError(f"{where}: {e}") from None


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
