"""flatlm/sources/pcfg_family.py: the spans of a layered grammar by parse depth (a table), drawing
reproduces every random candidate both testbed searches committed, a spec builds its source."""

import json
from pathlib import Path

import pytest

from apps.testbed_search import first, second
from flatlm.sources import load
from flatlm.sources.pcfg_family import draw_pcfg_specs, layered_pcfg_spec

RESULTS = Path(__file__).parents[2] / "bench" / "results"


@pytest.mark.parametrize(("depth", "max_length", "spans", "downstream_min_length"), [
    # T = min(max_length, 2^depth); B = T/2, C = T/4 (at least 1); min length = min(T, max(5, B))
    (3, 8, {"B": 4, "C": 2}, 5),  # the testbed's shape: 8 words
    (4, 16, {"B": 8, "C": 4}, 8),  # one level deeper
    (4, 12, {"B": 6, "C": 3}, 6),  # the length filter binds below 2^depth
    (2, 8, {"B": 2, "C": 1}, 4),  # short sentences: the minimum is T itself
    (1, 8, {"B": 1, "C": 1}, 2),  # spans never empty
])
def test_spans_follow_the_parse_depth(depth, max_length, spans, downstream_min_length):
    spec = layered_pcfg_spec({"depth": depth}, max_length, grammar_seed=3)
    assert spec["spans"] == spans
    assert spec["downstream_min_length"] == downstream_min_length
    assert (spec["seed"], spec["max_length"], spec["label_rule"]) == (3, max_length, "span")


def test_a_spec_builds_its_source_with_those_spans():
    spec = layered_pcfg_spec({"vocab": 12, "roots": 3, "nonterminals_per_level": 3, "depth": 3,
                              "binary_per_nonterminal": 3, "words_per_nonterminal": 6,
                              "terminal_share": 0.0}, 8, grammar_seed=0)
    source = load(json.dumps(spec))
    assert (source.max_length, source.spans, source.label_rule) == (8, {"B": 4, "C": 2}, "span")


def _committed(path: str) -> dict[str, dict]:
    return {r["id"]: r["spec"] for r in
            json.loads((RESULTS / path).read_text())["stage0"]["candidates"]}


@pytest.mark.parametrize(("results", "search"), [("testbed_search.json", first),
                                                 ("testbed_v2_search.json", second)])
def test_drawing_reproduces_every_committed_candidate(results, search):
    """Every random candidate in a search's committed results is the draw of its family at seed
    0 (the ids name family and index): the testbed's grammar q0-23 among them."""
    committed = _committed(results)
    by_prefix = {prefix: family for family, prefix in search.ID_PREFIX.items()}
    checked = 0
    for family_prefix, family in by_prefix.items():
        ids = [i for i in committed if i.startswith(f"{family_prefix}0-")]
        if not ids:
            continue
        n = 1 + max(int(i.split("-")[1]) for i in ids)
        drawn = {c["id"]: c["spec"] for c in draw_pcfg_specs(
            search.SPACES[family], n, seed=0, prefix=family_prefix)}
        assert {i: committed[i] for i in ids} == {i: drawn[i] for i in ids}
        checked += len(ids)
    assert checked >= 80


def test_different_seeds_draw_different_grammars():
    family = second.SPACES["v2-varlen"]
    a, b = (draw_pcfg_specs(family, 5, seed=s, prefix="V") for s in (0, 1))
    assert [c["spec"] for c in a] != [c["spec"] for c in b]
    assert a == draw_pcfg_specs(family, 5, seed=0, prefix="V")


def test_a_family_without_max_length_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="'max_length'.*add them"):
        draw_pcfg_specs({"vocab": (12,), "depth": (3,)}, 1, seed=0, prefix="x")
