"""The one override path for nested frozen dataclass configs, their flat views and CLI flags.

Keys are dotted field paths (``train.lr``, ``train.sam.rho``). A field named after a Python keyword
with a trailing underscore (``lambda_``) is spelled without it in keys, dicts and flags
(``train.adversarial.lambda``). Values given as strings (a command line, ``--set``) are converted
to the field's type: JSON (``3e-4``, ``[0, 10]``, ``null``), ``none``, or for tuples also a
comma-separated list (``0,100,200``). A field whose type is a ``ConfigValue`` (a source or model
spec) is built from its short string or dict form, and written back as that form.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True, kw_only=True)
... class Inner:
...     lr: float = 1e-3
...     steps: tuple[int, ...] = ()
>>> @dataclass(frozen=True, kw_only=True)
... class Outer:
...     name: str = "x"
...     inner: Inner = Inner()
>>> apply_overrides(Outer(), {"inner.lr": "3e-4", "inner.steps": "0,10"}).inner
Inner(lr=0.0003, steps=(0, 10))
>>> to_flat_dict(Outer())
{'name': 'x', 'inner.lr': 0.001, 'inner.steps': ()}
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import json
import keyword
import re
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

_NONE = type(None)


class ConfigError(ValueError):
    """A config key or value that cannot be applied; the message names the key and the fix."""


class ConfigValue(ABC):
    """An immutable config value with a short string form (``SourceSpec``, ``ModelSpec``).

    ``cls(value)`` accepts an instance, its string form or its ``to_json()`` form and raises
    ``ValueError`` naming what is wrong; ``str()`` is the canonical string form, which
    ``cls(str(x)) == x`` reads back. Equal values have equal hashes.
    """

    @abstractmethod
    def to_json(self) -> str | dict:
        """The JSON-ready form ``to_dict`` writes; ``cls`` reads it back."""

    @abstractmethod
    def __str__(self) -> str: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class _Dotted(dict):
    """Sub-keys gathered from dotted override keys (``a.b=1``), not a dict value given as such."""


def _external(name: str) -> str:
    """The key spelling of a field: ``lambda_`` -> ``lambda``."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


@functools.cache  # a class's hints do not change, and resolving them costs most of a config's build
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


def _value_class(tp) -> type[ConfigValue] | None:
    return next((t for t in _allowed(tp) if isinstance(t, type) and issubclass(t, ConfigValue)),
                None)


def _tuple_item(tp) -> Any:
    """The element type of the tuple in ``tp`` (``tuple[int, ...]`` -> int), else ``Any``."""
    for arg in (typing.get_args(tp) if typing.get_origin(tp) is not tuple else (tp,)):
        if typing.get_origin(arg) is tuple:
            args = typing.get_args(arg)
            return args[0] if len(args) == 2 and args[1] is Ellipsis else Any
    return Any


def parse_scalar(text: str) -> Any:
    """A JSON scalar or list if ``text`` is one (``3``, ``1e-3``, ``true``), else ``text``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _from_text(key: str, text: str, tp, allowed: tuple) -> Any:
    """A command-line string for a field that is not a plain ``str``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        if text.strip().lower() in ("none", "null") and _NONE in allowed:
            return None
        if tuple in allowed:  # 0,100,200 or B,C
            return [part.strip() for part in text.split(",") if part.strip()]
        raise ConfigError(f"{key}={text!r}: expected {_type_name(tp)}") from None
    if tuple in allowed and value is not None and not isinstance(value, list):
        return [value]  # one element: --checkpoint-steps 5
    return value


def _coerce(key: str, value: Any, tp) -> Any:
    """Converts ``value`` (maybe a string from a command line) to the field's type, or fails."""
    if tp is Any:
        return value
    allowed = _allowed(tp)
    if value is None and _NONE in allowed:
        return None
    spec = _value_class(tp)
    if spec is not None:
        if isinstance(value, str) and value.strip().lower() in ("none", "null") \
                and _NONE in allowed:
            return None
        try:
            return spec(value)
        except ValueError as e:
            raise ConfigError(f"{key}={value!r}: {e}") from None
    if isinstance(value, str) and str not in allowed:
        value = _from_text(key, value, tp, allowed)
    if value is None and _NONE in allowed:
        return None
    if isinstance(value, list | tuple) and tuple in allowed:
        item = _tuple_item(tp)
        return tuple(_coerce(f"{key}[{i}]", v, item) for i, v in enumerate(value))
    for t in allowed:
        if t is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(t, type) and isinstance(value, t):
            if t is int and isinstance(value, bool) and bool not in allowed:
                continue
            return value
    if typing.Any in allowed:
        return value
    raise ConfigError(f"{key}={value!r}: expected {_type_name(tp)}")


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1, "a.c": 2}`` -> ``{"a": {"b": 1, "c": 2}}``; a key both set and nested into
    is an error."""
    nested: dict = {}
    for key, value in flat.items():
        node = nested
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, _Dotted())
            if not isinstance(node, _Dotted):
                raise ConfigError(f"config key {key!r} conflicts with another override")
        if isinstance(node.get(leaf), _Dotted):
            raise ConfigError(f"config key {key!r} conflicts with another override")
        node[leaf] = value
    return nested


def apply_overrides(cfg, overrides: dict[str, Any]):
    """A copy of ``cfg`` with dotted keys (``train.lr``) replaced; unknown keys are errors.

    All changes to one dataclass are applied together, so cross-field checks in
    ``__post_init__`` see the final values (steps and checkpoint_steps changed at once).
    """
    return _apply_nested(cfg, nest(overrides), "")


def refuse_varied(overrides: dict, varied, what: str, fix: str) -> None:
    """A ``--set`` of a key that ``what`` varies itself (its grid or search space) would be
    replaced in every trial, silently: an error naming the keys and the fix (every runner:
    ``flatlm.experiments.paper.build`` for ``flatlm replicate``, ``sweeps.cli`` for the
    sweeps)."""
    clash = sorted(set(overrides) & set(varied))
    if clash:
        raise ValueError(f"--set {', '.join(clash)}: {what} varies {', '.join(clash)} itself, "
                         f"so the value would be ignored; drop the --set ({fix})")


def _names(cls) -> dict[str, str]:
    """key spelling -> field name (both ``lambda`` and ``lambda_`` are accepted)."""
    fields = [f.name for f in dataclasses.fields(cls) if f.name != _open_field(cls)]
    return {**{n: n for n in fields}, **{_external(n): n for n in fields}}


def _unknown(cfg, name: str, key: str, prefix: str) -> ConfigError:
    renamed = getattr(type(cfg), "RENAMED_KEYS", {})
    if name in renamed:
        return ConfigError(f"config key {key!r} was renamed: use {prefix + renamed[name]!r}")
    fields = sorted(_external(f.name) for f in dataclasses.fields(cfg)
                    if f.name != _open_field(cfg))
    sections = _open_section_names(cfg)
    plugged = f"; sections of registered components: {', '.join(sections)}" if sections else ""
    return ConfigError(f"unknown config key {key!r}: {type(cfg).__name__} has "
                       f"{', '.join(fields)}{plugged}")


# Open sections. A config class may leave room for the settings of components registered
# (every algorithm's ``train.<section>.*``, the built-ins' and a plug-in's), so that adding one
# edits no dataclass: it names a field in ``OPEN_SECTIONS`` holding ((section, settings), ...)
# and has classmethods ``section_class(name)`` -> the component's settings dataclass, or None,
# and ``open_section_names()``. Keys, flags, flat dicts and saved dicts spell such a section as
# if it were a field (``train.sam.rho``, ``--sam-rho``); the field itself is never a key.

class OpenSections:
    """What a config with open sections (above) shares: its sections given as a mapping or
    pairs, checked against the registry, stored sorted and without those at their defaults (one
    stored form per config), and read as ``cfg.settings(section)`` or as an attribute
    (``cfg.probe.seeds``, a built-in's section and a plug-in's alike). A subclass is a frozen
    dataclass with the field ``OPEN_SECTIONS`` names, ``section_class`` and
    ``open_section_names``; ``SECTION_KEY`` is its keys' prefix, ``SECTION_OWNER`` what
    registers a section (for the errors)."""

    OPEN_SECTIONS: typing.ClassVar[str] = "sections"
    SECTION_KEY: typing.ClassVar[str] = ""
    SECTION_OWNER: typing.ClassVar[str] = "component"

    def settings(self, section: str):
        """A section's settings: as given, over its config's defaults."""
        cls = type(self).section_class(section)
        if cls is None:
            raise ValueError(f"{self.SECTION_KEY}.{section}: no registered {self.SECTION_OWNER} "
                             "has this section")
        return dict(getattr(self, self.OPEN_SECTIONS)).get(section) or cls()

    def with_settings(self, **sections):
        """This config with the given sections' settings (``cfg.with_settings(probe=...)``)."""
        given = dict(getattr(self, self.OPEN_SECTIONS))
        return dataclasses.replace(self, **{self.OPEN_SECTIONS: {**given, **sections}})

    def __getattr__(self, name: str):
        # only called when no field, method or class attribute has the name; never for
        # dunders (pickle and copy look those up before __init__ has run)
        if name.startswith("_") or type(self).section_class(name) is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.settings(name)

    def _store_sections(self) -> None:
        """Each section given is a registered one's, of its class, and shadows no attribute of
        the config; stored sorted, those at their defaults dropped."""
        field = self.OPEN_SECTIONS
        given = getattr(self, field)
        pairs = list(given.items() if isinstance(given, dict) else given)
        for name, value in pairs:
            cls = type(self).section_class(name)
            if cls is None or not isinstance(value, cls):
                raise ValueError(f"{self.SECTION_KEY}.{name}={value!r}: set a registered "
                                 f"{self.SECTION_OWNER}'s own section, "
                                 f"{self.SECTION_KEY}.<section>.<key>")
        object.__setattr__(self, field, tuple(sorted(
            ((name, value) for name, value in pairs if value != type(value)()),
            key=lambda item: item[0])))

    @classmethod
    def check_section_names(cls) -> None:
        """No registered section has the name of a field or attribute of the config (it would
        read as that, not as the section)."""
        taken = [s for s in cls.open_section_names() if hasattr(cls, s)
                 or s in {f.name for f in dataclasses.fields(cls)}]
        if taken:
            raise ValueError(f"{cls.SECTION_KEY}.{taken[0]}: a registered "
                             f"{cls.SECTION_OWNER}'s section has the name of a "
                             f"{cls.__name__} field or attribute; register it under another")


def _open_field(cfg) -> str | None:
    return getattr(type(cfg) if not isinstance(cfg, type) else cfg, "OPEN_SECTIONS", None)


def _open_section_names(cfg) -> list[str]:
    names = getattr(type(cfg), "open_section_names", None)
    return list(names()) if names else []


def _open_section(cfg, given: str, value, key: str):
    """The new settings of the open section ``given`` (changes ``value``), or None when ``cfg``
    has no open section of that name."""
    field = _open_field(cfg)
    cls = type(cfg).section_class(given) if field else None
    if cls is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"{key}={value!r}: {key} is a section; set its keys ({key}.<key>)")
    current = dict(getattr(cfg, field)).get(given) or cls()
    return _apply_nested(current, value, key + ".")


def _apply_nested(cfg, changes: dict, prefix: str):
    names = _names(type(cfg))
    types_ = _field_types(type(cfg))
    new, opened = {}, {}
    for given, value in changes.items():
        key = prefix + given
        if given not in names:
            section = _open_section(cfg, given, value, key)
            if section is None:
                raise _unknown(cfg, given, key, prefix)
            opened[given] = section
            continue
        name = names[given]
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            new[name] = _apply_nested(current, value, key + ".")
        elif isinstance(value, _Dotted) and dict not in _allowed(types_[name]):
            raise ConfigError(f"unknown config key {key + '.' + next(iter(value))!r}: "
                              f"{key} has no sub-fields; set {key} as a whole")
        else:
            new[name] = _coerce(key, value, types_[name])
    # fields that follow a change the overrides did not give (a config's ``followers``, e.g.
    # the checkpoints of a shortened run): given values always win
    if opened:
        field = _open_field(cfg)
        new[field] = tuple(sorted({**dict(getattr(cfg, field)), **opened}.items()))
    follow = getattr(cfg, "followers", None)
    new = {**(follow(new) if follow else {}), **new}
    try:
        return dataclasses.replace(cfg, **new)
    except (TypeError, ValueError) as e:
        where = prefix.rstrip(".") or type(cfg).__name__
        raise ConfigError(f"{where}: {e}") from None


def to_flat_dict(cfg, prefix: str = "") -> dict[str, Any]:
    """Nested dataclass -> {"a.b": value}; the MLflow params and the sweep's search keys.
    Specs appear as their canonical strings."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{_external(f.name)}"
        if f.name == _open_field(cfg):
            for section, settings in value:
                out.update(to_flat_dict(settings, f"{prefix}{section}."))
        elif dataclasses.is_dataclass(value):
            out.update(to_flat_dict(value, key + "."))
        elif isinstance(value, ConfigValue):
            out[key] = str(value)
        elif isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in flatten_dict(value).items()})
        else:
            out[key] = value
    return out


def flatten_dict(d: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (a saved config's flat view)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_dict(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, ConfigValue):
        return value.to_json()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_dict(cfg) -> dict:
    """Nested plain dict (JSON-ready) of a dataclass config; ``from_dict`` reads it back."""
    out = {_external(f.name): _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
           if f.name != _open_field(cfg)}
    if _open_field(cfg):
        out.update((section, to_dict(settings))
                   for section, settings in getattr(cfg, _open_field(cfg)))
    return out


def from_dict(cls, data: dict):
    """Rebuilds a nested dataclass config from ``to_dict`` output (unknown keys are errors)."""
    return _apply_nested(cls(), dict(data), "")


def parse_assignments(pairs: Iterable[str], flag: str = "--set") -> dict[str, str]:
    """``["train.lr=3e-4", ...]`` -> ``{"train.lr": "3e-4"}`` (values stay strings)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {pair!r}: write KEY=VALUE, e.g. train.lr=3e-4")
        out[key.strip()] = value.strip()
    return out


def section_assignments(pairs: Iterable[str], section: str) -> dict[str, str]:
    """``--set`` pairs in the trial config's key space (``train.sam.rho=0.1``), for a command that
    configures one ``section`` of it (``flatlm train``: train; ``flatlm measure``: measure), with
    the section's prefix taken off. One key space for every command: a line copied from a sweep
    works here. A key without the prefix is an error that names the key to write."""
    out = {}
    for key, value in parse_assignments(pairs).items():
        head, dot, rest = key.partition(".")
        if head != section or not dot:
            raise ConfigError(f"--set {key}: keys are the trial config's, as in the sweeps; this "
                              f"command sets the {section} section: write {section}.{key}=...")
        out[rest] = value
    return out


# ------------------------------------------------------------------ command-line flags

_DEST = "config:"  # argparse dest prefix of generated flags: cannot clash with other options


def _type_name(tp) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        return f"comma-separated {_type_name(_tuple_item(tp))}s"
    return "None" if tp is _NONE else getattr(tp, "__name__", str(tp))


@functools.cache
def field_docs(cls) -> dict[str, str]:
    """field -> its trailing ``# comment`` in the class source, continuation lines joined."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    docs: dict[str, str] = {}
    current = None
    for line in lines:
        field = re.match(r"\s+(\w+)\s*:[^#]*#\s?(.*)$", line)
        more = re.match(r"\s+#\s+(.*)$", line)
        if field and field.group(1) in names:
            current = field.group(1)
            docs[current] = field.group(2).strip()
        elif more and current:
            docs[current] += " " + more.group(1).strip()
        else:
            current = None
    return docs


def add_arguments(parser: argparse.ArgumentParser, cls, prefix: str = "", *,
                  exclude: Iterable[str] = ()) -> None:
    """Adds one option per leaf field of the dataclass ``cls``; ``overrides_from_args`` reads
    back the ones given, as ``apply_overrides`` keys (``prefix`` + the field's dotted path).

    Option names: the dotted path with ``.`` and ``_`` as ``-`` (``sam.rho`` -> ``--sam-rho``,
    ``adversarial.lambda_`` -> ``--adversarial-lambda``). A bool is ``--x/--no-x``; a tuple
    takes ``0,100,200`` (or JSON); ``X | None`` takes ``none``; other values are converted (and
    checked) by ``apply_overrides``. Help comes from the field's comment and its default.
    """
    _add_fields(parser, cls, "", prefix, set(exclude))


def _add_fields(parser, cls, path: str, prefix: str, exclude: set) -> None:
    types_ = _field_types(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        key = path + _external(f.name)
        if f.name == _open_field(cls):  # the sections registered by now, as if fields
            for section in cls.open_section_names():
                if path + section not in exclude:
                    _add_fields(parser, cls.section_class(section), path + section + ".",
                                prefix, exclude)
            continue
        if key in exclude:
            continue
        tp = types_[f.name]
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        if dataclasses.is_dataclass(tp):
            _add_fields(parser, tp, key + ".", prefix, exclude)
            continue
        flag = "--" + key.replace(".", "-").replace("_", "-")
        help_text = (docs.get(f.name) or _type_name(tp)).replace("%", "%%")
        help_text += f" [{prefix}{key}; default: {_default_text(default)}]"
        if tp is bool:
            parser.add_argument(flag, dest=_DEST + prefix + key, default=argparse.SUPPRESS,
                                action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, dest=_DEST + prefix + key, default=argparse.SUPPRESS,
                                metavar=_metavar(tp), help=help_text)


def _default_text(default) -> str:
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "empty"
    return str(default)


def _metavar(tp) -> str:
    allowed = [t for t in _allowed(tp) if t is not _NONE]
    if allowed == [tuple]:
        return "A,B,..."
    return "|".join(getattr(t, "__name__", str(t)).upper() for t in allowed)


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The overrides given through ``add_arguments`` options: ``{"train.sam.rho": "0.1"}``."""
    return {k[len(_DEST):]: v for k, v in vars(args).items() if k.startswith(_DEST)}
