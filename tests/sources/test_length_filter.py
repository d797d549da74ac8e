"""The length filter: the exact share of sentences it keeps (dynamic programming over yield
lengths) against the sampler's histogram, and a clear error, not an endless loop, when the
filter would reject (almost) every draw."""

import numpy as np
import pytest

from flatlm.sources import load
from flatlm.sources.base import SourceError
from flatlm.sources.grammar import parse_grammar
from flatlm.sources.pcfg_sampler import RuleTable, sample_batch

# Recursive and unnormalised on purpose (rows sum to 2): A -> A A | a | b, B -> b
RECURSIVE = """S A 0.7
S B 0.3
A A A 0.6
A a 0.8
A b 0.6
B b 1.0
"""


def test_length_distribution_matches_the_sampler():
    g = parse_grammar("recursive.txt", RECURSIVE)
    exact = g.length_distribution(12)
    rng = np.random.default_rng(0)
    m = 40_000
    _, sent = sample_batch(RuleTable(g), m, 12, rng)
    counts = np.bincount(np.bincount(sent), minlength=13)[:13]
    freq = counts / m
    se = np.sqrt(exact * (1 - exact) / m) + 1e-12
    assert np.all(np.abs(freq[1:] - exact[1:]) < 4.5 * se[1:] + 1e-4), (freq, exact)
    # A alone: P(1) = 1 - 0.3 (rows normalised: A -> A A w.p. 0.3); B yields one word
    assert exact[1] == pytest.approx(0.3 + 0.7 * (1.4 / 2.0))
    assert exact[0] == 0.0


def test_a_filter_no_sentence_passes_is_an_error_naming_the_fix():
    with pytest.raises(SourceError, match=r"max_length=1: .*shortest sentence has 2 words"):
        load('{"kind": "pcfg", "grammar": "paper", "max_length": 1}')


def test_the_paper_grammar_keeps_every_sentence():
    assert load("pcfg:paper").acceptance == pytest.approx(1.0)


def test_a_supercritical_grammar_is_refused_with_its_branching_radius(tmp_path):
    # A -> A A with probability 0.7: 1.4 expected children, infinite trees w.p. 1 - 3/7
    path = tmp_path / "super.txt"
    path.write_text("S A 1.0\nA A A 0.7\nA a 0.3\n")
    assert parse_grammar(path).branching_radius() == pytest.approx(1.4)
    with pytest.raises(SourceError, match=r"supercritical: .* 1\.4 > 1"):
        load(f"pcfg:{path}")
    assert parse_grammar("recursive.txt", RECURSIVE).branching_radius() == pytest.approx(0.6)


def test_a_file_that_is_not_a_grammar_is_named_by_line_without_its_contents(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("admin:$6$s3cr3tHASH:19000:0:99999:7:::\n")
    with pytest.raises(SourceError) as err:
        load(f"pcfg:{secret}")
    assert f"{secret}:1:" in str(err.value) and "s3cr3tHASH" not in str(err.value)
