"""Section 5 (Theorem 5.1) measured: exact Tr H against the dense Hessian, the enumerated
distributions against the paper's definitions, and the theorem's comparison at T = 6."""

import math

import pytest
import torch

from flatlm.experiments.section5 import (
    OneLayerTransformer,
    Section5Config,
    downstream_inputs,
    fits,
    flat_lower_bound,
    pretraining_inputs,
    rebalance,
    trace_hessian,
    trace_hessian_dense,
)

T = 6


def random_model(m: int, seed: int) -> OneLayerTransformer:
    """Non-uniform attention and a non-zero loss: every term of Tr H is exercised."""
    model = OneLayerTransformer(T, m, 2)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    return model


def test_the_enumerated_distributions_are_the_papers():
    x, y = pretraining_inputs(T)
    assert x.shape == (math.comb(T, T // 2) * T * 2, T, 2 * T)
    assert len(torch.unique(x.flatten(1), dim=0)) == len(x)  # every input once
    assert torch.equal(-x[:, :, :T].sum((1, 2)), y)  # g*(x) = -<1_T, [sum_t x_t]_{1:T}>
    assert torch.equal(x[:, :, T:].abs().sum((1, 2)), torch.ones(len(x), dtype=x.dtype))
    assert y.sum() == 0  # "<" and ">" masked equally often
    x_ds, g_ds = downstream_inputs(T)
    assert x_ds.shape == (2**T, T, 2 * T) and x_ds[:, :, T:].abs().sum() == 0
    assert torch.equal(-x_ds[:, :, :T].sum((1, 2)), g_ds)


@pytest.mark.parametrize("seed", [0, 1])
def test_trace_hessian_equals_the_dense_hessians_trace(seed):
    x, y = pretraining_inputs(T)
    model = random_model(4, seed)
    assert trace_hessian(model, x, y) == pytest.approx(trace_hessian_dense(model, x, y),
                                                       rel=1e-9)
    with torch.no_grad():
        before = model(x)
    rebalanced = trace_hessian(model, x, y)
    rebalance(model, x, y)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before)  # the rescaling keeps the function
    assert trace_hessian(model, x, y) <= rebalanced + 1e-12
    assert trace_hessian(model, x, y) == pytest.approx(trace_hessian_dense(model, x, y),
                                                       rel=1e-9)


def test_the_flattest_fit_solves_g_star_and_the_other_fits_do_not():
    cfg = Section5Config(length=T, neurons=256, random_fits=1, train_steps=300, lr=1e-2,
                         adversary_split=16, n_downstream=(8,), draws=10)
    rows = {r["fit"]: r for r in fits(cfg)}
    assert list(rows) == ["flat", "random-0", "adversarial", "trained"]
    flat = rows.pop("flat")
    bound = flat_lower_bound(cfg)
    assert flat["trace_hessian"] == pytest.approx(bound, rel=1e-9)  # Lemma G.1's minimum
    assert flat["mlm_loss"] < 1e-20 and flat["downstream_acc@8"] > 0.9
    for name, row in rows.items():
        exact = name != "trained"
        assert row["mlm_loss"] < (1e-20 if exact else 1e-2), name  # they fit the MLM loss
        assert row["trace_hessian"] > 5 * bound, name  # and are sharper
        assert row["downstream_acc@8"] < flat["downstream_acc@8"] - 0.15, name  # and worse


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="section5.length=7"):
        Section5Config(length=7)
    with pytest.raises(ValueError, match="section5.neurons=64: .* m >= 240"):
        Section5Config(length=T, neurons=64)
