"""The PCFG's exact truth against brute force: enumeration of every sentence and every parse."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from flatlm.sources import load
from flatlm.sources.grammar import parse_grammar
from flatlm.sources.pcfg import PCFG
from flatlm.sources.reference import (
    conditionals_from_joint,
    enumerate_parses,
    enumerate_yields,
    slow_conditionals,
)
from tests.sources.conftest import all_sentences


def random_tiny(seed, **knobs):
    random = dict(vocab=3, roots=2, nonterminals_per_level=2, depth=2, binary_per_root=2,
                  binary_per_nonterminal=3, terminal_share=0.3, words_per_nonterminal=2)
    random.update(knobs)
    return load({"kind": "pcfg", "random": random, "seed": seed})


def check_against_enumeration(src, dtype, tol):
    joint = enumerate_yields(src.grammar, src.max_length)
    _, tokens, lengths = all_sentences(joint, src.max_length)
    fast = src.conditionals(tokens, lengths, dtype=dtype)
    slow = conditionals_from_joint(joint, tokens, lengths, src.V)
    np.testing.assert_allclose(fast.double().numpy(), slow, atol=tol, rtol=0)
    logp = src.sentence_logprob(tokens, lengths).numpy()
    np.testing.assert_allclose(logp, [math.log(joint[tuple(t[:n].tolist())])
                                      for t, n in zip(tokens, lengths, strict=True)], atol=1e-9)


def test_toy_grammar_merges_duplicates_and_matches_enumeration(toy):
    assert toy.grammar.report["merged_duplicate_lines"] == 1
    assert toy.max_length == 6  # recursive: the length filter sets T
    check_against_enumeration(toy, torch.float64, 1e-12)
    check_against_enumeration(toy, torch.float32, 2e-6)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_grammars_match_enumeration(seed):
    src = random_tiny(seed)
    assert src.max_length == 4
    check_against_enumeration(src, torch.float64, 1e-12)


def test_paper_grammar_matches_one_inside_pass_per_candidate():
    src = load("pcfg:paper")
    assert (src.V, src.grammar.N, src.max_length) == (200, 49, 16)
    tokens, lengths = src.sample(64, seed=5)
    pick = torch.stack([lengths.argmax(), (lengths == 7).nonzero()[0, 0]])  # 16 and 7 words
    tokens, lengths = tokens[pick], lengths[pick]
    assert int(lengths[0]) == 16
    fast = src.conditionals(tokens, lengths, dtype=torch.float64)
    slow = slow_conditionals(src, tokens, lengths)
    assert (fast - slow).abs().max() < 1e-9
    fast32 = src.conditionals(tokens, lengths, dtype=torch.float32)
    assert (fast32.double() - slow).abs().max() < 1e-4


def test_rows_sum_to_one_and_padding_is_zero():
    src = load("pcfg:paper")
    tokens, lengths = src.sample(200, seed=1)
    probs = src.conditionals(tokens, lengths, batch_size=64)
    real = tokens >= 0
    assert torch.allclose(probs.sum(-1)[real], torch.ones(()), atol=1e-5)
    assert probs[~real].abs().max() == 0
    assert probs.shape == (200, 16, 200)


def test_log_space_survives_32_word_sentences():
    # depth 5 with no terminal rules above the last level: every sentence has 32 words.
    src = random_tiny(7, vocab=50, depth=5, nonterminals_per_level=4, terminal_share=0.0,
                      words_per_nonterminal=30)
    tokens, lengths = src.sample(8, seed=0)
    assert (lengths == 32).all()
    assert src.sentence_logprob(tokens, lengths).max() < math.log(1e-38)  # underflows in fp32
    p32 = src.conditionals(tokens, lengths, dtype=torch.float32)
    p64 = src.conditionals(tokens, lengths, dtype=torch.float64)
    assert torch.isfinite(p32).all()
    assert (p32.double() - p64).abs().max() < 1e-4
    slow = slow_conditionals(src, tokens[:1], lengths[:1])
    assert (p64[:1] - slow).abs().max() < 1e-9


def test_sampler_frequencies_match_exact_probabilities(toy):
    joint = enumerate_yields(toy.grammar, toy.length_filter)
    kept = sum(joint.values())  # the length filter renormalises by this
    tokens, lengths = toy.sample(20000, seed=11)
    seen = {}
    for t, n in zip(tokens.tolist(), lengths.tolist(), strict=True):
        seen[tuple(t[:n])] = seen.get(tuple(t[:n]), 0) + 1
    assert set(seen) <= set(joint)
    common = [y for y in joint if joint[y] / kept * 20000 >= 5]
    observed = [seen.get(y, 0) for y in common] + [20000 - sum(seen.get(y, 0) for y in common)]
    expected = [joint[y] / kept * 20000 for y in common]
    expected.append(20000 - sum(expected))
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_sampling_is_deterministic_and_filters_length(toy):
    a, la = toy.sample(500, seed=3)
    b, lb = toy.sample(500, seed=3)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert int(la.max()) <= 6 and int(la.min()) >= 1
    assert not torch.equal(a, toy.sample(500, seed=4)[0])


@pytest.mark.parametrize("rule", ["inside", "posterior"])
def test_labels_match_brute_force_parses(toy, rule):
    joint = enumerate_yields(toy.grammar, 5)
    sentences, tokens, lengths = all_sentences(joint, toy.max_length)
    g = toy.grammar
    for task, span in (("A", None), ("B", 2)):
        got = toy.labels(tokens, lengths, task, rule=rule).tolist()
        for y, label in zip(sentences, got, strict=True):
            L = len(y) if span is None else span
            if len(y) < L:
                assert label == -1
                continue
            parses = enumerate_parses(g, y) if rule == "posterior" else None
            if rule == "inside":
                score = [sum(p for p, _ in enumerate_parses(g, y[:L], symbol=A))
                         for A in range(g.N)]
            else:
                total = sum(p for p, _ in parses)
                score = [sum(p for p, s in parses if (A, 0, L) in s) / total for A in range(g.N)]
            if task == "A":
                score = score[: len(g.root_symbols())]
            elif rule == "posterior":
                score = score + [1 - sum(score)]
            elif max(score) == 0:
                score = score + [1.0]
            assert score[label] == pytest.approx(max(score), abs=1e-12), (y, task)


def test_entropy_matches_enumeration(toy):
    joint = enumerate_yields(toy.grammar, toy.length_filter)
    kept = sum(joint.values())
    sentences, tokens, lengths = all_sentences(joint, toy.max_length)
    probs = conditionals_from_joint(joint, tokens, lengths, toy.V)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(np.where(probs > 0, probs * np.log(probs), 0.0), axis=(1, 2))
    weights = np.array([joint[y] / kept for y in sentences])
    exact = (weights * h).sum() / (weights * lengths.numpy()).sum()
    mean, se = toy.entropy(20000, seed=2)
    assert abs(mean - exact) < 4 * se
    assert 0 < se < 0.02


def test_random_grammar_shape_and_determinism(tmp_path):
    src = load("pcfg:seed=4,random.vocab=30,random.depth=3,random.nonterminals_per_level=3")
    assert src.V == 30 and src.max_length == 8 and src.vocab[:3] == ["w0", "w1", "w2"]
    again = load({"kind": "pcfg", "seed": 4, "random": {"vocab": 30, "depth": 3,
                                                         "nonterminals_per_level": 3}})
    assert again.fingerprint() == src.fingerprint()
    assert load("pcfg:seed=5,random.vocab=30").fingerprint() != src.fingerprint()


def test_spec_errors_name_the_field():
    with pytest.raises(ValueError, match="colour"):
        load({"kind": "pcfg", "grammar": "paper", "colour": 1})
    with pytest.raises(ValueError, match=r"names no grammar.*random\.vocab=50.*'seed' alone"):
        load("pcfg:seed=3")  # the README's example without its knob
    with pytest.raises(ValueError, match="both 'grammar' and 'random'"):
        load({"kind": "pcfg", "grammar": "paper", "random": {"vocab": 10}})
    with pytest.raises(ValueError, match="label_rule"):
        load({"kind": "pcfg", "grammar": "paper", "label_rule": "viterbi"})
    with pytest.raises(ValueError, match="kind"):
        load("cfg:paper")
    with pytest.raises(ValueError, match="depht"):
        load({"kind": "pcfg", "random": {"depht": 3}})


def test_paper_grammar_file_is_the_shipped_copy():
    src = load({"kind": "pcfg", "grammar": "paper"})
    assert isinstance(src, PCFG)
    assert src.grammar.report["merged_duplicate_lines"] > 0
    assert list(src.grammar.nonterminals[:9]) == [f"S{i}" for i in range(1, 10)]
    assert src.num_classes("A") == 9 and src.num_classes("B") == 50
    again = parse_grammar(src.grammar.report["file"])
    assert np.array_equal(again.emission, src.grammar.emission)


def test_left_corner_counts_match_brute_force():
    """LC(A) = E[number of spans (A, 0, j) in a random parse], summed over the finite language."""
    src = random_tiny(3)
    g = src.grammar
    joint = enumerate_yields(g, src.max_length)
    assert sum(joint.values()) == pytest.approx(1.0, abs=1e-12)  # finite language: all of it
    lc = np.zeros(g.N)
    for y in joint:
        for p, spans in enumerate_parses(g, y):
            for A, i, _ in spans:
                lc[A] += p if i == 0 else 0.0
    got = src.log_left_corner.exp().numpy()
    np.testing.assert_allclose(got, lc, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("seed", [3, 7])
def test_span_rule_matches_brute_force_over_prefixes(seed):
    """"span": argmax_A Pr(A spans [0, L), x_1..x_L), the rest of the sentence summed out, by
    enumerating every sentence with that prefix and every parse of it."""
    src = random_tiny(seed)
    g = src.grammar
    joint = enumerate_yields(g, src.max_length)
    sentences, tokens, lengths = all_sentences(joint, src.max_length)
    L = 2
    by_prefix = {}
    for y in joint:
        if len(y) < L:
            continue
        score = by_prefix.setdefault(tuple(y[:L]), np.zeros(g.N))
        for p, spans in enumerate_parses(g, y):
            for A in range(g.N):
                score[A] += p if (A, 0, L) in spans else 0.0
    src.spans = {"B": L}  # the tiny grammar's sentences are short: B over the first 2 words
    got = src.labels(tokens, lengths, "B", rule="span").tolist()
    for y, label in zip(sentences, got, strict=True):
        if len(y) < L:
            assert label == -1
            continue
        score = list(by_prefix[tuple(y[:L])])
        score = score + [1.0] if max(score) == 0 else score + [0.0]
        assert score[label] == pytest.approx(max(score), rel=1e-9), y
    posterior = src.labels(tokens, lengths, "B", rule="posterior")
    assert not torch.equal(torch.tensor(got), posterior)  # a different rule on this grammar


def test_task_a_span_and_posterior_rules_agree(toy):
    tokens, lengths = toy.sample(300, seed=1)
    a = toy.labels_of_tasks(tokens, lengths, ("A",), "span")["A"]
    assert torch.equal(a, toy.labels(tokens, lengths, "A", rule="posterior"))


def test_downstream_sentences_have_the_minimum_length():
    src = load({"kind": "pcfg", "grammar": "paper"})
    assert src.downstream_min_length == 5 and src.label_rules[0] == "posterior"
    tokens, lengths, classes = src.sample_downstream(400, seed=0)
    assert int(lengths.min()) >= 5 and len(tokens) == 400
    assert torch.equal(src.sample_downstream(400, seed=0)[0], tokens)
    pre = src.sample(4000, seed=0)[1]
    assert int(pre.min()) < 5  # pre-training keeps short sentences
    assert load("pcfg:paper,downstream_min_length=4").downstream_sentences(5, 0)[1].min() >= 4
    with pytest.raises(ValueError, match="downstream_min_length"):
        load("pcfg:paper,downstream_min_length=17")
    # a span longer than some downstream sentences: its label would be undefined
    with pytest.raises(ValueError, match=r"spans: B=4 is longer than the shortest downstream "
                                         r"sentence \(downstream_min_length=1"):
        load("pcfg:paper,downstream_min_length=1")
    with pytest.raises(ValueError, match="spans: B=9 is longer"):
        load({"kind": "pcfg", "grammar": "paper", "spans": {"B": 9}})
    assert load("pcfg:paper,downstream_min_length=1,spans.B=1,spans.C=1").spans == {"B": 1,
                                                                                       "C": 1}


def test_spans_by_parse_depth_are_the_texts_and_released_the_codes():
    """spans="depth" (A.1): B, C over the first T/2, T/4 words of the longest sentence T (the
    paper grammar: 16 words -> 8, 4), every downstream sentence at least that long; the same
    labels as the spans written out. spans="released": B = 4, C = 2, the default."""
    depth = load("pcfg:paper,spans=depth,label_rule=span")
    assert depth.spans == {"B": 8, "C": 4} and depth.downstream_min_length == 8
    written = load({"kind": "pcfg", "grammar": "paper", "spans": {"B": 8, "C": 4},
                    "downstream_min_length": 8, "label_rule": "span"})
    _, lengths, got = depth.sample_downstream(300, seed=1)
    _, _, want = written.sample_downstream(300, seed=1)
    assert int(lengths.min()) >= 8 and all(torch.equal(got[t], want[t]) for t in "ABC")
    assert all(int(got[t].min()) >= 0 for t in "ABC")  # every sentence labelled
    assert load("pcfg:paper,spans=released").spans == load("pcfg:paper").spans == {"B": 4,
                                                                                     "C": 2}
    with pytest.raises(ValueError, match="spans='deep': use 'released'"):
        load("pcfg:paper,spans=deep")


@pytest.mark.parametrize("rule", ["posterior", "span", "inside"])
def test_labels_grouped_by_length_equal_one_padded_batch(rule):
    """The fast path (a chart per sentence length, batches cut across groups) labels as one
    chart over the whole padded batch does, on the paper grammar (2..16 words)."""
    src = load("pcfg:paper")
    tokens, lengths = src.sample(120, seed=5)
    tokens, lengths = tokens[:, : int(lengths.max())], lengths
    tasks = ("A", "B", "C")
    plain = src._labels_batch(tokens, lengths, tasks, rule)
    grouped = src.labels_of_tasks(tokens, lengths, tasks, rule, batch_size=7)
    merged = src.labels_of_tasks(tokens, lengths, tasks, rule, min_group=25, fused=True)
    assert len(lengths.unique()) > 5  # (merged and fused: the GPU's defaults)
    for task in tasks:
        assert grouped[task].dtype == torch.int64
        assert torch.equal(grouped[task], plain[task]), task
        assert torch.equal(merged[task], plain[task]), task
    assert bool((grouped["B"][lengths < 4] == -1).all()) and bool((grouped["A"] >= 0).all())


def test_merged_length_groups_give_the_per_length_conditionals():
    """Neighbouring lengths sharing a padded chart (the GPU default) change only the rounding."""
    from flatlm.sources.pcfg import length_groups

    src = load("pcfg:paper")
    tokens, lengths = src.sample(150, seed=6)
    groups = length_groups(lengths, 40)
    rows = torch.cat([g for g, _ in groups])
    assert 1 < len(groups) < len(lengths.unique())
    assert sorted(rows.tolist()) == list(range(150))
    assert all(int(lengths[g].max()) == L for g, L in groups)
    assert len(length_groups(lengths)) == len(lengths.unique())  # CPU default: one per length
    per_length = src.conditionals(tokens, lengths, dtype=torch.float64)
    merged = src.conditionals(tokens, lengths, dtype=torch.float64, min_group=40, batch_size=33)
    torch.testing.assert_close(merged, per_length, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="min_group"):
        src.conditionals(tokens, lengths, min_group=0)
