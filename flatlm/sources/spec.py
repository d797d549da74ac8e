"""``SourceSpec``: which source language, as an immutable config value checked on construction.

A spec is a dict with a ``kind`` and that kind's fields, a JSON object string, or a short form
``KIND:VALUE`` / ``KIND:key=value,key=value`` (dotted keys nest, values are read as JSON when they
parse, else as strings; the bare VALUE fills ``grammar`` for pcfg, ``file`` for hmm and ``length``
for dyck). Construction builds the source once (milliseconds; memoised per process), so an
unknown kind, an unknown field or a bad value fails at once with the source kind's own message.
The spec keeps the source's normalised ``Source.spec`` (defaults filled in where the kind fills
them, file paths absolute), so equality is by content and ``str()`` is a canonical short form
(JSON when no short form reads back exactly).

>>> SourceSpec("dyck:length=8")
SourceSpec('dyck:8')
>>> SourceSpec("pcfg:paper").to_dict()
{'kind': 'pcfg', 'grammar': 'paper'}
>>> SourceSpec("dyck:7")
Traceback (most recent call last):
...
flatlm.sources.base.SourceError: dyck spec: 'length' must be an even integer >= 2, got 7; ...
"""

from __future__ import annotations

import copy
import functools
import json
import os
from typing import Any, NamedTuple

from flatlm.core.config import ConfigValue, nest, parse_scalar
from flatlm.core.registry import Ref, Registry, check_ref, load_ref
from flatlm.sources.base import SourceError


class SourceKind(NamedTuple):
    """A registered source kind: its ``Source`` subclass (with ``from_spec``), as itself or as
    ``"module:Class"`` imported when first built, and the field a bare short-form value fills."""

    cls: Ref
    bare: str


# kind -> SourceKind. A new source is a module with a ``Source`` subclass, one
# ``register_source`` call (in a plug-in module for a source of your own: --plugin MODULE) and
# its tests (tests/assets/toy_source.py).
REGISTRY: Registry[SourceKind] = Registry(
    "source kind", key="source",
    how_to_add="flatlm.sources.register_source in a plug-in module: --plugin MODULE")


def register_source(kind: str, cls: Ref, bare: str, *, replace: bool = False) -> SourceKind:
    """Registers the source ``kind``: ``cls`` a ``Source`` subclass or ``"module:Class"``,
    ``bare`` the spec field a short form's bare value fills (``dyck:8`` -> length 8)."""
    if not check_ref(cls):
        raise ValueError(f"register_source({kind!r}): cls={cls!r}: give a Source subclass or "
                         "'module:Class'")
    if not (isinstance(kind, str) and kind.replace("_", "").replace("-", "").isalnum()):
        raise ValueError(f"register_source: kind={kind!r}: use a word such as 'uniform'")
    return REGISTRY.register(kind, SourceKind(cls, bare), replace=replace)


register_source("pcfg", "flatlm.sources.pcfg:PCFG", "grammar")
register_source("hmm", "flatlm.sources.hmm:HMM", "file")
register_source("dyck", "flatlm.sources.dyck:Dyck", "length")
register_source("lm", "flatlm.sources.lm:CausalLM", "model")
register_source("text", "flatlm.sources.text:TextCorpus", "files")


def source_class(kind: str) -> type:
    """The ``Source`` subclass of a registered kind (imported now if named as a string)."""
    _check_kind(kind)
    return load_ref(REGISTRY[kind].cls)


def _check_kind(kind) -> None:
    if kind not in REGISTRY:
        raise SourceError(
            f"source kind {kind!r} is unknown; use one of {', '.join(REGISTRY)} "
            f"(e.g. 'pcfg:paper', 'hmm:seed=0', 'dyck:8'; add one with {REGISTRY.how_to_add})"
        )


def _parse_short(spec: str) -> dict:
    kind, _, rest = spec.partition(":")
    kind = kind.strip()
    _check_kind(kind)
    flat: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        if "=" in part:
            key, _, value = part.partition("=")
            flat[key.strip()] = parse_scalar(value.strip())
        elif REGISTRY[kind].bare not in flat:
            flat[REGISTRY[kind].bare] = parse_scalar(part)
        else:
            raise SourceError(f"source {spec!r}: cannot read {part!r}; write key=value")
    try:
        return {"kind": kind, **_plain_dicts(nest(flat))}
    except ValueError as e:
        raise SourceError(f"source {spec!r}: {e}") from None


def _plain_dicts(d: dict) -> dict:
    return {k: _plain_dicts(v) if isinstance(v, dict) else v for k, v in d.items()}


def parse_spec(spec: str | dict | SourceSpec) -> dict:
    """Normalises a spec (dict, JSON string or short form) to a plain dict with a ``kind``.
    Only the form and the kind are checked here; ``SourceSpec`` checks the fields too."""
    if isinstance(spec, SourceSpec):
        return spec.to_dict()
    if isinstance(spec, dict):
        out = dict(spec)
    elif isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            out = json.loads(spec)
        except json.JSONDecodeError as e:
            raise SourceError(f"source {spec!r} is not valid JSON: {e}") from None
    elif isinstance(spec, str):
        out = _parse_short(spec)
    else:
        raise SourceError(f"source spec must be a dict or a string, got {type(spec).__name__}")
    _check_kind(out.get("kind"))
    return out


@functools.lru_cache(maxsize=256)
def _normalised(spec_json: str, cwd: str) -> str:
    """The built source's own spec (JSON), which also proves the spec valid. ``cwd`` is part of
    the cache key because relative paths become absolute."""
    spec = json.loads(spec_json)
    try:
        source = source_class(spec["kind"]).from_spec(spec)
    except (OSError, TypeError) as e:  # an unreadable file, a field of the wrong type
        raise SourceError(f"{spec['kind']} spec: {e}") from None
    return json.dumps(source.spec)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def short_form(spec: dict) -> str:
    """``KIND:VALUE,key=value`` if that reads back as ``spec`` exactly, else compact JSON."""
    fields = _flat({k: v for k, v in spec.items() if k != "kind"})
    bare = REGISTRY[spec["kind"]].bare
    parts = [_text(fields.pop(bare))] if bare in fields else []
    parts += [f"{k}={_text(v)}" for k, v in fields.items()]
    text = f"{spec['kind']}:{','.join(parts)}"
    try:
        if parse_spec(text) == spec:
            return text
    except SourceError:
        pass
    return json.dumps(spec, separators=(",", ":"))


class SourceSpec(ConfigValue):
    """A valid source spec; ``flatlm.sources.load(spec)`` builds the source. Immutable."""

    __slots__ = ("_spec", "_key")

    def __init__(self, spec: str | dict | SourceSpec = "pcfg:paper"):
        if isinstance(spec, SourceSpec):
            normalised = spec._spec
        else:
            raw = json.dumps(parse_spec(spec), default=str)
            normalised = json.loads(_normalised(raw, os.getcwd()))
        object.__setattr__(self, "_spec", normalised)
        object.__setattr__(self, "_key", json.dumps(normalised, sort_keys=True))

    def __setattr__(self, name, value):
        raise AttributeError(f"SourceSpec is immutable; build a new one (cannot set {name})")

    def __reduce__(self):
        return (SourceSpec, (self.to_dict(),))

    @property
    def kind(self) -> str:
        return self._spec["kind"]

    def to_dict(self) -> dict:
        """The normalised spec (a copy): what ``Source.spec`` of the built source holds."""
        return copy.deepcopy(self._spec)

    def to_json(self) -> dict:
        return self.to_dict()

    def __str__(self) -> str:
        return short_form(self._spec)

    def __eq__(self, other) -> bool:
        return isinstance(other, SourceSpec) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)
