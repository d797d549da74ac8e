"""Source languages with exact masked-LM conditionals: ``load(spec)`` builds one.

A spec is a dict with a ``kind`` and that kind's fields, a JSON object string, or a short form
``KIND:VALUE`` / ``KIND:key=value,key=value`` (dotted keys nest)::

    load("pcfg:paper")                       # the paper's grammar, shipped with flatlm
    load("pcfg:path/to/rules.txt")           # a grammar file in the paper's format
    load("pcfg:seed=3,random.vocab=20")      # a random layered grammar
    load("hmm:seed=0")                       # a random block-diagonal HMM
    load("hmm:path/to/hmm.npz")              # arrays initial, transition, emission
    load("dyck:length=8")                    # or "dyck:8"

>>> src = load("dyck:4")
>>> src.spec
{'kind': 'dyck', 'length': 4}
"""

from __future__ import annotations

import json
from typing import Any

from flatlm.sources.base import PAD, Source, SourceError

__all__ = ["PAD", "Source", "SourceError", "load", "parse_spec", "KINDS"]

# Which field a bare short-form value fills, per kind.
_BARE_FIELD = {"pcfg": "grammar", "hmm": "file", "dyck": "length"}


def _kinds() -> dict[str, type]:
    # Imported lazily so that ``flatlm.sources`` stays cheap to import.
    from flatlm.sources.dyck import Dyck
    from flatlm.sources.hmm import HMM
    from flatlm.sources.pcfg import PCFG

    return {"pcfg": PCFG, "hmm": HMM, "dyck": Dyck}


KINDS = tuple(_BARE_FIELD)


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_spec(spec: str | dict) -> dict:
    """Normalises a spec (dict, JSON string or short form) to a plain dict with a ``kind``."""
    if isinstance(spec, dict):
        out = dict(spec)
    elif isinstance(spec, str) and spec.lstrip().startswith("{"):
        out = json.loads(spec)
    elif isinstance(spec, str):
        kind, _, rest = spec.partition(":")
        kind = kind.strip()
        _check_kind(kind)
        out = {"kind": kind}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            if "=" not in part:
                if kind in _BARE_FIELD and _BARE_FIELD[kind] not in out:
                    out[_BARE_FIELD[kind]] = _scalar(part)
                    continue
                raise SourceError(f"source {spec!r}: cannot read {part!r}; write key=value")
            key, _, value = part.partition("=")
            node = out
            *parents, leaf = key.strip().split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = _scalar(value.strip())
    else:
        raise SourceError(f"source spec must be a dict or a string, got {type(spec).__name__}")
    _check_kind(out.get("kind"))
    return out


def _check_kind(kind) -> None:
    if kind not in _BARE_FIELD:
        raise SourceError(
            f"source kind {kind!r} is unknown; use one of {', '.join(KINDS)} "
            "(e.g. 'pcfg:paper', 'hmm:seed=0', 'dyck:8')"
        )


def load(spec: str | dict) -> Source:
    """Builds the source a spec describes (see the module docstring for the forms)."""
    spec = parse_spec(spec)
    return _kinds()[spec["kind"]].from_spec(spec)
