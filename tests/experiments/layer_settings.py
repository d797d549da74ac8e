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

import sys
from collections import defaultdict

import flatlm.experiments.paper as paper
import flatlm.experiments.scales as scales
from flatlm.core.config import apply_overrides
from flatlm.experiments.presets import source_kind
from flatlm.experiments.protocols import BASE_SETTINGS, PAPER, SWITCHES, parse_protocol
from tests.experiments.trial_configs import (
    PLAIN_SOURCES,
    SCALE_NAMES,
    _variants,
    protocols,
)

CALLS: list = []


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
    if caller == "base":
        return f"scale {scale}: overrides" if key in sc.overrides else f"scale {scale}: base()"
    if caller == "protocol_base":
        if key in ("model", "source"):
            return "protocol: model/source switches"
        base, switches = parse_protocol(protocol)
        where = "protocol PAPER" if key in PAPER else None
        where = f"protocol base {base}" if key in BASE_SETTINGS[base] else where
        for s in switches:
            if key in SWITCHES[s][1]:
                where = f"switch {s}"
        return where
    if caller in ("build", "base_of"):
        return f"source kind {source_kind(source)}"
    if caller == "_long_run":
        if key in sc.long_overrides:
            return f"scale {scale}: long_overrides"
        if key in ("train.steps", "train.checkpoint_steps"):
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
    return where.split(":")[0].split(" ")[0]


def report(stats: dict) -> str:
    by_layer: dict = defaultdict(lambda: [0, 0, 0])
    lines = []
    for (where, key, value), effects in sorted(stats.items()):
        layer = layer_of(where)
        by_layer[layer][0] += 1
        if not effects.get("effective"):
            by_layer[layer][1] += 1
            lines.append(f"never effective  {where:42s} {key} = {value}  {dict(effects)}")
        elif effects.get("noop"):
            by_layer[layer][2] += 1
            lines.append(f"sometimes no-op  {where:42s} {key} = {value}  {dict(effects)}")
    same = defaultdict(set)
    for where, key, value in stats:
        same[(key, value)].add(where)
    dup = {k: v for k, v in same.items() if len({layer_of(w) + w.split(":")[0] for w in v}) > 1}
    table = ["layer       settings  never-effective  sometimes-no-op"]
    for layer, (n, dead, some) in by_layer.items():
        table.append(f"{layer:11s} {n:8d}  {dead:15d}  {some:15d}")
    n = [sum(v[i] for v in by_layer.values()) for i in range(3)]
    table.append(f"{'total':11s} {n[0]:8d}  {n[1]:15d}  {n[2]:15d}")
    return "\n".join([*table, "", *lines, "", "(key, value) written in several places:",
                      *(f"  {k} = {v}: {sorted(w)}" for (k, v), w in sorted(dup.items()))])


if __name__ == "__main__":
    print(report(measure()))
