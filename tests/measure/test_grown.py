"""Flatness in the grown shape (``measure.grown``) against dense brute force on tiny float64 BERTs.

The dense references (``Exact``) and the 6-sentence pool come from ``test_flatness.py``.
"""

import dataclasses

import pytest
import torch

from flatlm.measure import (  # noqa: E402
    HESSIAN_FISHER_GAP,
    TRACE_FISHER,
    TRACE_FISHER_GROWN,
    TRACE_HESSIAN,
    TRACE_HESSIAN_GROWN,
    grown_key,
    se_key,
)
from flatlm.measure.curvature.common import FlatnessConfig  # noqa: E402
from flatlm.measure.curvature.fisher import trace_fisher  # noqa: E402
from flatlm.measure.curvature.grown import grown_flatness, grown_model, lcm_shape  # noqa: E402
from flatlm.measure.run import EvalData, MeasureConfig, measure_model  # noqa: E402
from flatlm.models import TABLE4, build_model, parse_model, shape_string, word_logits  # noqa: E402
from flatlm.models.constructions import CONSTRUCTIONS  # noqa: E402
from flatlm.models.growth import bert_shape  # noqa: E402
from tests.measure.test_flatness import Exact, replicated_pool, tiny_bert  # noqa: E402

SMALL, BIG = "d8-h2-l1-i16", "d16-h4-l1-i32"  # head size 4; width x2, MLP x2
DEEPER = "d16-h4-l2-i32"  # ... and one added block
WIDER = "d24-h6-l1-i48"  # width x3, MLP x3


def test_lcm_shape_of_table4_is_its_largest_row():
    assert shape_string(lcm_shape(TABLE4)) == shape_string(parse_model("bert-950m"))
    assert shape_string(lcm_shape(["d128-h2-l4-i512", "d192-h3-l5-i768"])) == "d384-h6-l5-i1536"
    assert shape_string(lcm_shape([SMALL])) == SMALL  # one shape: itself


@pytest.mark.parametrize("shapes, match", [
    ([], "at least one"), (["d64-h1-l1-i256", "lstm-h8-l1"], "only BERTs"),
    (["d64-h1-l1-i256", "d64-h2-l1-i256"], "head sizes"),
])
def test_lcm_shape_errors(shapes, match):
    with pytest.raises(ValueError, match=match):
        lcm_shape(shapes)


def test_grow_to_is_checked_when_the_config_is_built():
    with pytest.raises(ValueError, match="measure.grow_to='lstm-h8-l1': only BERT shapes"):
        MeasureConfig(grow_to="lstm-h8-l1")
    with pytest.raises(ValueError, match="measure.grow_to='d7'"):
        MeasureConfig(grow_to="d7")
    small = tiny_bert(SMALL, seed=0)
    with pytest.raises(ValueError, match=r"measure.grow_to='d12-h3-l1-i16'.*not a multiple"):
        grown_model(small, "d12-h3-l1-i16")


@pytest.mark.parametrize("construction", CONSTRUCTIONS)
@pytest.mark.parametrize("target", [BIG, DEEPER, WIDER])
def test_grown_model_keeps_the_function(target, construction):
    small = tiny_bert(SMALL, seed=7, scale=0.5)
    big = grown_model(small, target, seed=3, construction=construction)
    x = Exact(small).x  # every (sentence, position) of the pool, masked
    with torch.no_grad():
        a = word_logits(small.eval(), x.input_ids, x.attention_mask, x.positions)
        b = word_logits(big, x.input_ids, x.attention_mask, x.positions)
    assert shape_string(bert_shape(big)) == target
    torch.testing.assert_close(b, a, rtol=0, atol=1e-9)


# dense Tr(F) of the SMALL model (tiny_bert seed 7, scale 0.5): native 86.2; grown to BIG
# 94.0 (paper) / 72.7 (head-norm), to WIDER 106.9 / 69.1, to DEEPER 101.6 / 80.5
@pytest.mark.parametrize("construction, target", [("paper", WIDER), ("head-norm", BIG)])
def test_grown_trace_fisher_is_measured_in_the_grown_shape(construction, target):
    """Same function, another parameterisation: the dense Tr(F) of the grown model differs from
    the native one, and ``grown_flatness`` converges to the grown one (not the native)."""
    small = tiny_bert(SMALL, seed=7, scale=0.5)
    big = grown_model(small, target, seed=3, construction=construction)
    exclude = FlatnessConfig().exclude
    native = Exact(small, exclude).fisher_trace_by_labels()
    dense_grown = Exact(big, exclude).fisher_trace_by_labels()
    assert abs(dense_grown - native) > 0.1 * native
    tokens, lengths = replicated_pool(400)  # 2400 inputs
    cfg = FlatnessConfig(n_inputs=len(tokens), batch_size=800, seed=5)
    big = grown_model(small, target, seed=3, construction=construction)
    out = grown_flatness(big, None, tokens, lengths, cfg)
    assert set(out) == {TRACE_FISHER_GROWN, se_key(TRACE_FISHER_GROWN)}
    est, se = out[TRACE_FISHER_GROWN], out[se_key(TRACE_FISHER_GROWN)]
    assert abs(est - dense_grown) < 3 * se < 0.1 * dense_grown, (est, se, dense_grown, native)
    assert abs(est - native) > 3 * se


@pytest.mark.parametrize("target", [BIG, DEEPER, WIDER])
def test_the_two_constructions_give_different_trace_fisher(target):
    """The construction is a setting that matters: same logits, different Tr(F) (dense, and
    ``trace_fisher``'s estimate well outside its standard error), the paper's the larger here."""
    small = tiny_bert(SMALL, seed=7, scale=0.5)
    tokens, lengths = replicated_pool(400)
    cfg = FlatnessConfig(n_inputs=len(tokens), batch_size=800, seed=5)
    dense, est = {}, {}
    for construction in CONSTRUCTIONS:
        big = grown_model(small, target, seed=3, construction=construction)
        dense[construction] = Exact(big, cfg.exclude).fisher_trace_by_labels()
        est[construction] = trace_fisher(big, tokens, lengths, cfg)
    assert dense["paper"] > 1.15 * dense["head-norm"], dense
    gap = est["paper"]["mean"] - est["head-norm"]["mean"]
    assert gap > 5 * (est["paper"]["se"] ** 2 + est["head-norm"]["se"] ** 2) ** 0.5, est
    for construction in CONSTRUCTIONS:
        e = est[construction]
        assert abs(e["mean"] - dense[construction]) < 3 * e["se"], (construction, e, dense)


def test_growth_constructions_are_checked_when_the_config_is_built():
    with pytest.raises(ValueError, match="measure.growth_construction='flatlm': use one of"):
        MeasureConfig(growth_construction="flatlm")
    with pytest.raises(ValueError, match="measure.growth_compare='x': use one of"):
        MeasureConfig(grow_to=BIG, growth_compare=("x",))
    with pytest.raises(ValueError, match="name each construction once, and not measure.growth_c"):
        MeasureConfig(grow_to=BIG, growth_compare=("paper",))
    with pytest.raises(ValueError, match="needs measure.grow_to"):
        MeasureConfig(growth_compare=("head-norm",))
    assert MeasureConfig().growth_construction == "paper"  # B.4.2 by default


def test_measure_model_logs_native_and_grown_keys(src):
    model = build_model(dataclasses.replace(parse_model(SMALL), dropout=0.0), src.V,
                        src.max_length, seed=0).double()
    tokens, lengths = src.sample(96, seed=1)
    cfg = MeasureConfig(what=("hessian",), grow_to=BIG, growth_compare=("head-norm",),
                        sections=dict(flatness=FlatnessConfig(n_inputs=None, batch_size=48,
                                                              hutchinson_batch_size=24)))
    empty = tokens[:0]
    data = EvalData(tokens, lengths, empty, lengths[:0], {})
    out = measure_model(model, src, data, cfg, "cpu")
    for key in (TRACE_FISHER, TRACE_HESSIAN, HESSIAN_FISHER_GAP):
        for grown in (grown_key(key), grown_key(key, "head-norm")):
            assert key in out and grown in out and se_key(grown) in out
    assert grown_key(TRACE_HESSIAN) == TRACE_HESSIAN_GROWN and "time/flatness_grown_s" in out
    assert "time/flatness_grown_head_norm_s" in out
    for construction in CONSTRUCTIONS:  # each key is its construction's
        alone = grown_flatness(grown_model(model, BIG, construction=construction), src,
                               tokens, lengths, cfg.flatness)
        key = grown_key(TRACE_FISHER, None if construction == "paper" else construction)
        assert alone[TRACE_FISHER_GROWN] == pytest.approx(out[key], rel=1e-10)
    # growing into the model's own shape is the identity: the same estimate as the native one
    same = grown_flatness(grown_model(model, SMALL), src, tokens, lengths, cfg.flatness)
    assert same[TRACE_FISHER_GROWN] == pytest.approx(out[TRACE_FISHER], rel=1e-10)


def test_a_pre_ln_model_grows_into_a_post_ln_spelled_target(src):
    """A sweep varying ln_mode shares one grow_to: the model keeps its own LayerNorm placement."""
    model = build_model(dataclasses.replace(parse_model(SMALL + "-pre"), dropout=0.0), src.V,
                        src.max_length, seed=0).double().eval()
    big = grown_model(model, "d16-h4-l2-i32")
    from flatlm.models.bert import ln_mode

    assert ln_mode(big) == "pre"
    tokens, lengths = src.sample(8, seed=2)
    from flatlm.core.tokens import encode

    ids, mask = encode(tokens, lengths)
    pos = torch.zeros(8, dtype=torch.long)
    with torch.no_grad():
        diff = (word_logits(model, ids, mask, pos) - word_logits(big.double(), ids, mask, pos))
    assert float(diff.abs().max()) < 1e-9
