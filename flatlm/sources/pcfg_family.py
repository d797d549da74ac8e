"""Random layered PCFGs as source specs: a family of grammars (``RandomGrammarConfig`` knobs, each
drawn from a tuple of choices), with the paper's downstream tasks laid out by parse depth.

A family is a dict ``knob -> choices`` over the knobs of a random grammar (``vocab``, ``roots``,
``nonterminals_per_level``, ``depth``, ...) plus ``max_length``, the length filter. Drawing is
seeded, so a family and a seed name the same grammars on every machine (the testbed searches,
``bench/testbed_search.py`` and ``bench/testbed_v2.py``, record their candidates by id).

>>> spec = layered_pcfg_spec({"vocab": 12, "depth": 3}, max_length=8, grammar_seed=0)
>>> spec["spans"], spec["downstream_min_length"]
({'B': 4, 'C': 2}, 5)
>>> [c["id"] for c in draw_pcfg_specs({"vocab": (12, 16), "depth": (3,), "max_length": (8,)},
...                                   n=2, seed=0, prefix="g")]
['g0-0', 'g0-1']
"""

from __future__ import annotations

import numpy as np


def layered_pcfg_spec(knobs: dict, max_length: int, grammar_seed: int) -> dict:
    """The pcfg spec of one random grammar: its knobs and seed, the length filter, spans by parse
    depth (B: T/2, C: T/4 words, T = min(max_length, 2^depth) the longest sentence, as the text's
    L = 32/16/8 of sentences up to 32), downstream sentences of at least max(5, T/2) words and
    labels by the paper's ``span`` rule."""
    T = min(max_length, 2 ** knobs["depth"])  # the longest sentence (terminal_share > 0: the
    #   shortest is shorter, so the length filter can bind)
    spans = {"B": max(1, T // 2), "C": max(1, T // 4)}
    return {"kind": "pcfg", "seed": grammar_seed, "max_length": max_length, "spans": spans,
            "downstream_min_length": min(T, max(5, spans["B"])), "label_rule": "span",
            "random": knobs}


def draw_pcfg_specs(family: dict, n: int, seed: int, prefix: str) -> list[dict]:
    """``n`` grammars of ``family`` (knob -> choices, ``max_length`` among them), each
    ``{"id": f"{prefix}{seed}-{i}", "spec": ...}``: per grammar, one choice per knob in the
    family's order, then the grammar's seed (0-999), all from one generator seeded by ``seed``."""
    if "max_length" not in family or "depth" not in family:
        raise ValueError(f"draw_pcfg_specs: a family needs 'depth' and 'max_length' choices, got "
                         f"{sorted(family)}; add them (e.g. 'depth': (3,), 'max_length': (8,))")
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        knobs = {k: v[int(rng.integers(len(v)))] for k, v in family.items()}
        knobs = {k: (float(v) if isinstance(v, float) else int(v)) for k, v in knobs.items()}
        max_length = knobs.pop("max_length")
        out.append({"id": f"{prefix}{seed}-{i}", "spec": layered_pcfg_spec(
            knobs, max_length, grammar_seed=int(rng.integers(1000)))})
    return out
