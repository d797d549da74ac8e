"""Adaptive sharpness (``measure.sharpness``) against closed forms: a linear loss and a quadratic
at its minimum (exact for the worst case, within the s.e. for the average), and the first-order
closed form on a tiny BERT at a small radius."""

import dataclasses

import pytest
import torch
from torch import nn

from flatlm.measure import SHARPNESS_AVG, se_key, sharpness_worst_key
from flatlm.measure.curvature.common import masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.landscape.sharpness import (
    SharpnessConfig,
    adaptive_sharpness,
    batch_losses,
    measure_sharpness,
)
from flatlm.models import build_model, parse_model

P = 6


def weights(seed: int) -> nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    return nn.Parameter(torch.randn(P, generator=g, dtype=torch.float64) + 0.5)


def test_linear_loss_worst_case_is_exact_and_average_is_zero():
    """L_S(w) = a_S . w: max over ||u||_inf <= rho of a . (|w| u) = rho ||a * w||_1, over
    ||u||_2 <= rho: rho ||a * w||_2; the average case is 0."""
    w = weights(0)
    g = torch.Generator().manual_seed(1)
    a = [torch.randn(P, generator=g, dtype=torch.float64) for _ in range(3)]  # 3 batches
    cfg = SharpnessConfig(rho_linf=0.05, rho_l2=0.3, rho_avg=0.1, samples=64, seed=2)
    before = w.detach().clone()
    out = adaptive_sharpness([lambda a=ai: a @ w for ai in a], [w], cfg)
    c = before.abs()
    linf = [cfg.rho_linf * float((ai * c).abs().sum()) for ai in a]
    l2 = [cfg.rho_l2 * float((ai * c).norm()) for ai in a]
    assert out["worst_linf"]["mean"] == pytest.approx(sum(linf) / 3, rel=1e-10)
    assert out["worst_l2"]["mean"] == pytest.approx(sum(l2) / 3, rel=1e-6)
    assert out["worst_l2"]["se"] == pytest.approx(torch.tensor(l2).std().item() / 3**0.5, rel=1e-5)
    assert abs(out["avg"]["mean"]) < 3 * out["avg"]["se"]
    assert torch.equal(w.detach(), before)  # the weights are put back exactly


def test_quadratic_at_its_minimum():
    """L(w) = 1/2 (w - w*)^T H (w - w*) at w = w*, C = diag|w*|: worst l_2 = rho^2 / 2
    lambda_max(C H C); with H diagonal >= 0 the worst l_inf is a corner, rho^2 / 2 sum c^2 H_ii;
    average = rho^2 / 2 sum c_i^2 H_ii for any H."""
    w = weights(3)
    star = w.detach().clone()
    g = torch.Generator().manual_seed(4)
    B = torch.randn(P, P, generator=g, dtype=torch.float64)
    H = B @ B.T / P + torch.diag(torch.linspace(0.1, 2.0, P, dtype=torch.float64))
    D = torch.diag(torch.rand(P, generator=g, dtype=torch.float64) + 0.2)
    c = star.abs()

    def quadratic(M):
        return lambda: 0.5 * (w - star) @ M @ (w - star)

    cfg = SharpnessConfig(rho_l2=0.2, rho_linf=0.05, rho_avg=0.1, steps=60, samples=20, seed=5)
    full = adaptive_sharpness([quadratic(H)], [w], cfg)
    top = float(torch.linalg.eigvalsh(c[:, None] * H * c[None, :])[-1])
    assert full["worst_l2"]["mean"] == pytest.approx(cfg.rho_l2**2 / 2 * top, rel=1e-6)
    diagonal = adaptive_sharpness([quadratic(D)], [w], cfg)
    corner = cfg.rho_linf**2 / 2 * float((c**2 * D.diagonal()).sum())
    assert diagonal["worst_linf"]["mean"] == pytest.approx(corner, rel=1e-10)
    many = adaptive_sharpness([quadratic(H)] * 100, [w], dataclasses.replace(cfg, norms=()))
    exact = cfg.rho_avg**2 / 2 * float((c**2 * H.diagonal()).sum())
    assert abs(many["avg"]["mean"] - exact) < 3 * many["avg"]["se"], (many["avg"], exact)
    assert many["avg"]["se"] < 0.1 * exact


def test_mlm_sharpness_at_a_small_radius_is_first_order(src):
    """On a tiny float64 BERT away from a minimum, at rho = 1e-6 the worst case is the first-order
    one per batch: rho ||g_S * w||_1 (l_inf), rho ||g_S * w||_2 (l_2), g_S the batch gradient."""
    shape = dataclasses.replace(parse_model("d8-h2-l1-i16"), dropout=0.0)
    model = build_model(shape, src.V, src.max_length, seed=0).double()
    tokens, lengths = src.sample(32, seed=1)
    cfg = SharpnessConfig(rho_linf=1e-6, rho_l2=1e-6, n_inputs=32, batch_size=16, samples=2)
    exclude = ("*pooler*", "cls.predictions.bias")
    out = measure_sharpness(model, src, tokens, lengths, cfg, exclude, "cpu")
    x = masked_inputs(tokens, lengths, cfg.seed, n=32)
    q = soft_labels(src, tokens, lengths, x.positions)
    params = list(selected_parameters(model, exclude).values())
    first = {"linf": [], "l2": []}
    for loss in batch_losses(model.eval(), x, q, cfg.batch_size, "cpu"):
        gw = torch.cat([(g * p.detach()).flatten() for g, p in
                        zip(torch.autograd.grad(loss(), params), params, strict=True)]).abs()
        first["linf"].append(1e-6 * float(gw.sum()))
        first["l2"].append(1e-6 * float(gw.norm()))
    for norm in ("linf", "l2"):
        assert out[sharpness_worst_key(norm)] == pytest.approx(sum(first[norm]) / 2, rel=1e-3)
        assert out[se_key(sharpness_worst_key(norm))] > 0
    assert SHARPNESS_AVG in out and se_key(SHARPNESS_AVG) in out
