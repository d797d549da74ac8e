"""Which settings of the layers restate what a lower layer gives (``flatlm.experiments.layers``):
a measurement of the layers, not a test. Every ``apply_overrides`` of ``flatlm.experiments.paper``
and ``scales`` is recorded while the trials of ``trial_configs`` are built; each key it sets is a
setting of a place (a scale's table, the paper's text, a switch, a source kind, an experiment).

    PYTHONPATH=. python -m tests.experiments.layer_settings   # the table, then each finding

A setting is *no-op* where the config already had its value, *overwritten* where a later layer
(or the grid point) replaces it; one that is one of the two in every trial it is applied to
changes no trial's config: it restates a lower layer or is dead. Places that write the same
(key, value) are listed too.
"""

from __future__ import annotations

import inspect
import re
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import flatlm.experiments.paper as paper
import flatlm.experiments.scales as scales
from flatlm.core.config import apply_overrides
from flatlm.experiments.presets import source_kind
from flatlm.experiments.protocols import BASE_SETTINGS, PAPER, SWITCHES, parse_protocol
from tests.experiments.trial_configs import (
    PLAIN_SOURCES,
    SCALE_NAMES,
    _variants,
    file_sources,
    protocols,
)

CALLS: list = []
INHERITS = {"sweep": "testbed"}  # SWEEP = replace(TESTBED, ...): its tables start as the testbed's


def _recorder(module):
    real = module.apply_overrides

    def record(cfg, overrides):
        caller = sys._getframe(1).f_code.co_name
        CALLS.append((caller, cfg, dict(overrides)))
        return real(cfg, overrides)
    return record


def place(caller: str, key: str, scale: str, protocol: str, source, experiment: str) -> str:
    """The place (layer: table) that wrote ``key`` in a call from ``caller``."""
    sc = scales.scale(scale)
    for table in ("CPU_SETTINGS", "CPU_ADVERSARY"):  # a table the scales share (written once)
        shared = getattr(scales, table, {})
        mine = sc.overrides if caller == "base" else sc.adversarial
        if caller in ("base", "_with_adversary") and key in shared and all(
                mine.get(k) == v for k, v in shared.items()):  # the scale holds the table
            return f"scales: {table}"
    parent = INHERITS.get(scale)
    if parent and caller in ("base", "_with_adversary"):  # written once, in the parent's table
        table = "overrides" if caller == "base" else "adversarial"
        mine, theirs = getattr(sc, table), getattr(scales.scale(parent), table)
        if key in mine and key in theirs and mine[key] == theirs[key]:
            return f"scale {parent}: {table}"
    if caller == "base":
        return f"scale {scale}: overrides" if key in sc.overrides else "scales: base()"
    if caller == "protocol_base":
        if key in ("model", "source"):
            return "protocol: model/source switches"
        base, switches = parse_protocol(protocol)
        where = "protocol PAPER" if key in PAPER else None
        where = f"protocol base {base}" if key in BASE_SETTINGS[base] else where
        for s in switches:
            if key in SWITCHES[s].overrides:
                where = f"switch {s}"
        return where
    if caller in ("build", "base_of"):
        return f"source kind {source_kind(source)}"
    if caller == "_long_run":
        if key in sc.long_overrides:
            return f"scale {scale}: long_overrides"
        if key in re.findall(r'"(train\.\w+)"', inspect.getsource(paper._long_run)):
            return "experiments: _long_run"
        return f"experiment {experiment}"
    if caller == "_with_selection_measures":
        return f"scale {scale}: selection_what"
    if caller == "_with_adversary":
        return (f"scale {scale}: adversarial" if key in sc.adversarial
                else "experiment algorithms: adversary task")
    if caller == "_sizes" and key in sc.sizes_overrides:
        return f"scale {scale}: sizes_overrides"
    return f"experiment {caller.lstrip('_')}"


# keys a later layer computes from the value before it (so that value is not overwritten)
READ_BACK = ("measure.what", "train.checkpoint_steps")


def _without(cfg, overrides: dict, key: str):
    """``cfg`` with ``overrides`` but ``key``; None where that is refused (a cross-field rule)."""
    try:
        return apply_overrides(cfg, {k: v for k, v in overrides.items() if k != key})
    except ValueError:
        return None


def chain_findings(calls, grid_keys, ctx) -> list[tuple[str, str, object, str]]:
    """(place, key, value, effect) of every setting of one build's ``calls``."""
    out = []
    for i, (caller, cfg, overrides) in enumerate(calls):
        full = apply_overrides(cfg, overrides)
        for key, value in overrides.items():
            if _without(cfg, overrides, key) == full:
                effect = "noop"
            elif key in grid_keys or (key not in READ_BACK and any(
                    key in o for _, _, o in calls[i + 1:])):
                effect = "overwritten"
            else:
                effect = "effective"
            out.append((place(caller, key, *ctx), key, _plain(value), effect))
    return out


def _plain(value):
    return repr(value)


def measure(sources=PLAIN_SOURCES) -> dict:
    """(place, key, value) -> {effect: how many builds}."""
    stats: dict = defaultdict(lambda: defaultdict(int))
    patched = {m: m.apply_overrides for m in (paper, scales)}
    for m in patched:
        m.apply_overrides = _recorder(m)
    try:
        for scale in SCALE_NAMES:
            for protocol in protocols():
                for source in sources.values():
                    builds = [("base", None, {})] + [(n, e, o) for n, e, o in _variants(scale)
                                                     if not n.endswith("]")]
                    for name, experiment, options in builds:
                        CALLS.clear()
                        try:
                            if experiment is None:
                                paper.base_of(scale, protocol, source)
                                grid = {}
                            else:
                                grid = paper.build(experiment, scale=scale, protocol=protocol,
                                                   source=source, **options).grid
                        except Exception:  # noqa: BLE001 (a refused combination sets nothing)
                            continue
                        ctx = (scale, protocol, source, name)
                        for where, key, value, effect in chain_findings(list(CALLS), grid, ctx):
                            stats[(where, key, value)][effect] += 1
    finally:
        for m, real in patched.items():
            m.apply_overrides = real
    return stats


def layer_of(where: str) -> str:
    layer = where.split(":")[0].split(" ")[0].removesuffix("s")
    return "protocol" if layer == "switch" else layer


def report(stats: dict) -> str:
    """A table per layer: places (tables or functions) that set keys, settings (place, key),
    those never effective (a no-op or overwritten wherever applied), those a no-op somewhere,
    and (key, value) pairs written by more than one place; then each finding."""
    settings: dict = defaultdict(lambda: defaultdict(int))
    values: dict = defaultdict(set)
    for (where, key, value), effects in stats.items():
        for effect, n in effects.items():
            settings[(where, key)][effect] += n
        values[(where, key)].add(value)
    rows: dict = defaultdict(lambda: [set(), 0, 0, 0])
    lines = []
    for (where, key), effects in sorted(settings.items()):
        row = rows[layer_of(where)]
        row[0].add(where)
        row[1] += 1
        shown = f"{where:40s} {key} = {' | '.join(sorted(values[(where, key)]))[:90]}"
        if not effects.get("effective"):
            row[2] += 1
            lines.append(f"never effective  {shown}  {dict(effects)}")
        elif effects.get("noop"):
            row[3] += 1
            lines.append(f"sometimes no-op  {shown}  {dict(effects)}")
    same = defaultdict(set)
    for where, key, value in stats:
        same[(key, value)].add(where)
    dup = {k: v for k, v in same.items() if len(v) > 1}
    table = ["layer       places  settings  never-effective  no-op-somewhere"]
    for layer, (places, n, dead, some) in rows.items():
        table.append(f"{layer:11s} {len(places):6d}  {n:8d}  {dead:15d}  {some:15d}")
    total = [sum(len(r[0]) for r in rows.values()),
             *(sum(r[i] for r in rows.values()) for i in (1, 2, 3))]
    table.append(f"{'total':11s} {total[0]:6d}  {total[1]:8d}  {total[2]:15d}  {total[3]:15d}")
    table.append(f"(key, value) pairs written by several places: {len(dup)}")
    return "\n".join([*table, "", *lines, "", "(key, value) written in several places:",
                      *(f"  {k} = {v[:80]}: {sorted(w)}" for (k, v), w in sorted(dup.items()))])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:  # every source of the snapshot
        print(report(measure({**PLAIN_SOURCES, **file_sources(Path(tmp))})))
