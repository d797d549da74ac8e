"""Hutchinson's vectors stacked into one batched Hessian-vector product (the fast path) against
one product per vector (the reference path), and the per-batch values kept on the device
against the released per-probe float loop."""

import dataclasses

import pytest
import torch

from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs, selected_parameters
from flatlm.measure.curvature.hessian_trace import (
    eager_attention,
    quadratic,
    rademacher_like,
    second_order_logits,
    stacked_quadratics,
    trace_hessian,
)
from flatlm.models import build_model, parse_model

STACKED_RTOL = 1e-5  # float32: the stacked sum's rounding (FlatnessConfig.hutchinson_stack)


def _model(shape: str, src, dtype=torch.float32, seed=0):
    cfg = dataclasses.replace(parse_model(shape), dropout=0.0)
    return build_model(cfg, src.V, src.max_length, seed=seed).to(dtype).eval()


@pytest.mark.parametrize("shape", ["d16-h2-l1-i32", "lstm-h8-l1"])
def test_stacked_products_equal_one_at_a_time_in_float64(src, shape):
    model = _model(shape, src, torch.float64, seed=1)
    tokens, lengths = src.sample(12, seed=2)
    cfg = FlatnessConfig(n_inputs=12, exclude=())
    params = list(selected_parameters(model, cfg.exclude).values())
    x = masked_inputs(tokens, lengths, 0).batch(0, 12, "cpu")
    with eager_attention(model):
        z = second_order_logits(model)(model, x.input_ids, x.attention_mask, x.positions)
        loss = -z.log_softmax(-1).gather(1, x.targets[:, None]).sum()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        g = torch.Generator().manual_seed(3)
        vs = [rademacher_like(params, g) for _ in range(5)]
        one = torch.stack([quadratic(grads, v, params) for v in vs])
        stacked = stacked_quadratics(grads, vs, params)
    assert stacked.shape == (5,)
    torch.testing.assert_close(stacked, one, rtol=1e-12, atol=0)
    assert float(one.abs().min()) > 0  # a real comparison, not of zeros


def _released_trace(model, tokens, lengths, cfg, q):
    """The released loop: one product per vector, each read to a Python float at once."""
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs)
    params = list(selected_parameters(model, cfg.exclude).values())
    g = torch.Generator().manual_seed(cfg.seed + 2)
    values = []
    with eager_attention(model):
        for start in range(0, len(x), cfg.hutchinson_batch_size):
            b = x.batch(start, start + cfg.hutchinson_batch_size, "cpu")
            z = second_order_logits(model)(model, b.input_ids, b.attention_mask, b.positions)
            qb = q[start : start + cfg.hutchinson_batch_size].to(z.dtype)
            grads = torch.autograd.grad(-(qb * z.log_softmax(-1)).sum(), params,
                                        create_graph=True)
            h = 0.0
            for _ in range(cfg.hutchinson_probes):
                h += float(quadratic(grads, rademacher_like(params, g), params))
            values.append(h / cfg.hutchinson_probes)
    return values


def test_default_stack_keeps_the_released_numbers_bit_for_bit(src):
    model = _model("d16-h2-l1-i32", src)
    tokens, lengths = src.sample(40, seed=4)
    cfg = FlatnessConfig(n_inputs=40, hutchinson_batch_size=16, hutchinson_probes=3)
    q = torch.softmax(torch.randn(40, src.V, generator=torch.Generator().manual_seed(5)), -1)
    released = _released_trace(model, tokens, lengths, cfg, q.double())
    counts = [16, 16, 8]
    mean = sum(released) / sum(counts)
    out = trace_hessian(model, tokens, lengths, cfg, soft_labels=q.double())
    assert out["mean"] == mean  # exactly: the same products added in the same order


def test_stacked_trace_equals_the_default_within_rounding(src):
    model = _model("d16-h2-l1-i32", src)
    tokens, lengths = src.sample(64, seed=6)
    base = FlatnessConfig(n_inputs=64, hutchinson_batch_size=32, hutchinson_probes=4)
    one = trace_hessian(model, tokens, lengths, base, with_gap=False)
    q = torch.softmax(torch.randn(64, src.V, generator=torch.Generator().manual_seed(7)),
                      -1).double()
    for stack in (2, 4):
        cfg = dataclasses.replace(base, hutchinson_stack=stack)
        out = trace_hessian(model, tokens, lengths, cfg, with_gap=False)
        assert out["mean"] == pytest.approx(one["mean"], rel=STACKED_RTOL)
        gap1 = trace_hessian(model, tokens, lengths, base, soft_labels=q, with_gap=True)
        gap = trace_hessian(model, tokens, lengths, cfg, soft_labels=q, with_gap=True)
        assert gap["gap_mean"] == pytest.approx(gap1["gap_mean"], rel=STACKED_RTOL)


def test_stack_setting_is_checked():
    with pytest.raises(ValueError, match=r"flatness.hutchinson_stack=3: use 1..2"):
        FlatnessConfig(hutchinson_probes=2, hutchinson_stack=3)
    with pytest.raises(ValueError, match="flatness.hutchinson_stack"):
        FlatnessConfig(hutchinson_stack=0)
