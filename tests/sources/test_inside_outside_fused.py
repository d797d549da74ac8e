"""The fused inside-outside (all splits of a width at once) against the split-by-split route,
which tests/sources/test_pcfg.py checks against enumeration: the same cells, the same answers."""

import math

import numpy as np
import pytest
import torch

from flatlm.sources import load
from flatlm.sources.inside_outside import inside, outside, sentence_logprob, word_conditionals
from flatlm.sources.inside_outside_fused import FusedPlan, inside_fused, outside_fused
from flatlm.sources.reference import conditionals_from_joint, enumerate_yields
from tests.sources.conftest import all_sentences


def charts(src, tokens, lengths, dtype):
    T = int(lengths.max())
    plan = src.plan(T, "cpu", dtype)
    tokens = tokens[:, :T]
    plain_in = inside(tokens, plan)
    fused_in, stacked = inside_fused(tokens, FusedPlan.of(plan))
    return plan, (plain_in, outside(plain_in, lengths, plan)), \
        (fused_in, outside_fused(stacked, lengths, FusedPlan.of(plan)))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_cell_and_answer_equals_the_split_by_split_route(dtype):
    """Paper grammar, one batch of mixed lengths (2..16 words): every inside and outside cell
    (log score over all symbols, all starts and widths), log Pr(x) and the conditionals."""
    src = load("pcfg:paper")
    tokens, lengths = src.sample(48, seed=2)
    plan, (p_in, p_out), (f_in, f_out) = charts(src, tokens, lengths, dtype)
    atol = 1e-12 if dtype == torch.float64 else 2e-5
    for w in range(1, plan.T + 1):
        widths = torch.full_like(lengths, w)
        for i in range(plan.T - w + 1):
            for a, b in ((p_in, f_in), (p_out, f_out)):
                x, y = a.log(i, widths), b.log(i, widths)
                assert torch.equal(torch.isinf(x), torch.isinf(y)), (w, i)
                finite = torch.isfinite(x)
                torch.testing.assert_close(y[finite], x[finite], rtol=1e-5 if dtype ==
                                           torch.float32 else 1e-12, atol=atol)
    torch.testing.assert_close(sentence_logprob(f_in, lengths, plan),
                               sentence_logprob(p_in, lengths, plan), rtol=0, atol=atol * 10)
    torch.testing.assert_close(word_conditionals(f_out, plan), word_conditionals(p_out, plan),
                               rtol=0, atol=atol)


def test_fused_conditionals_match_enumeration_of_a_recursive_grammar(toy):
    """On the toy grammar (tests/sources/conftest.py: recursive, symbols with both rule kinds,
    one-word sentences, duplicate lines)."""
    joint = enumerate_yields(toy.grammar, toy.max_length)
    _, tokens, lengths = all_sentences(joint, toy.max_length)
    fused = toy.conditionals(tokens, lengths, dtype=torch.float64, fused=True, min_group=50)
    exact = conditionals_from_joint(joint, tokens, lengths, toy.V)
    np.testing.assert_allclose(fused.numpy(), exact, atol=1e-12, rtol=0)
    plain = toy.conditionals(tokens, lengths, dtype=torch.float64, fused=False)
    assert (fused - plain).abs().max() < 1e-13
    assert math.isclose(float(fused.sum()), float(lengths.sum()), rel_tol=1e-12)


def test_fused_route_is_the_chosen_one_on_request():
    """conditionals(fused=True) runs the fused route (a spy counts its calls)."""
    import flatlm.sources.pcfg as pcfg

    src = load("pcfg:paper")
    tokens, lengths = src.sample(20, seed=3)
    calls = []
    real = pcfg.conditionals_fused
    pcfg.conditionals_fused = lambda *a: calls.append(1) or real(*a)
    try:
        src.conditionals(tokens, lengths, fused=True)
        n_fused = len(calls)
        src.conditionals(tokens, lengths, fused=False)  # the CPU default too
        src.conditionals(tokens, lengths)
    finally:
        pcfg.conditionals_fused = real
    assert n_fused == len(lengths.unique()) and len(calls) == n_fused
