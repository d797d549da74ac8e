"""The local learning coefficient by SGLD (``measure.llc``) against closed forms.

Quadratic L(w) = 1/2 w^T A w around w* = 0: the localised tempered posterior is Gaussian with
precision P = n beta A + gamma I, so E[n beta L] = sum_i n beta a_i / (2 (n beta a_i + gamma)) over
the eigenvalues a_i of A, -> rank(A) / 2 as gamma -> 0 (d/2 when A is positive definite, the
regular model's learning coefficient). The SGLD chain w <- w - eps/2 P w + N(0, eps) is itself a
Gaussian AR(1) whose stationary variance along a_i is 1 / (p_i (1 - eps p_i / 4)), p_i = n beta a_i
+ gamma: the chain's exact expectation, which the estimate must match within its Monte Carlo s.e.

Mini-batches: with batch gradients A w + s_b the chain's stationary covariance solves a discrete
Lyapunov equation, so its expectation (heated by the batch noise) is exact too.

(w1 w2)^2: lambda = 1/2 (multiplicity 2) while d/2 = 1; given w2, w1 is Gaussian, so the finite
(n beta, gamma) posterior expectation is a 1-D integral (quadrature): the estimate must match it
and sit below 1/2 < d/2.
"""

import math

import numpy as np
import pytest
import torch
from scipy import integrate

from flatlm.core.config import apply_overrides
from flatlm.measure import LLC, LLC_KEYS, se_key
from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.landscape.llc import LLCConfig, estimate_llc, model_loss
from flatlm.measure.landscape.sharpness import batch_losses
from flatlm.measure.registry import metric_keys
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.runs.trial import TrialConfig, tracked_params
from flatlm.sources import load


def quadratic(eigenvalues, seed=0):
    """L(w) = 1/2 w^T A w, A = Q diag(eigenvalues) Q^T with a random rotation Q."""
    a = torch.tensor(eigenvalues, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(len(a), len(a), dtype=torch.float64,
                                       generator=torch.Generator().manual_seed(seed)))
    A = q @ torch.diag(a) @ q.T
    return (lambda w, b: 0.5 * w @ A @ w), a, A


def gaussian_expectation(a, n_beta, gamma, eps=0.0):
    """E[n beta L] under the chain's stationary law (eps = 0: the posterior itself)."""
    p = n_beta * a + gamma
    return float((n_beta * a / (2 * p * (1 - eps * p / 4))).sum())


REGULAR = (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0)  # d = 8: d/2 = 4


@pytest.mark.parametrize(("eigenvalues", "gamma"), [
    (REGULAR, 50.0),  # regular, gamma shrinks the estimate below d/2
    (REGULAR, 0.01),  # regular, gamma -> 0: d/2
    ((1.0, 1.5, 2.0, 3.0, 0, 0, 0, 0), 0.01),  # minimally singular: rank 4, lambda = 2 < d/2
])
def test_quadratic_matches_the_chains_exact_expectation(eigenvalues, gamma):
    loss, a, _ = quadratic(eigenvalues)
    n_beta, eps = 100.0, 5e-4
    cfg = LLCConfig(chains=16, draws=1000, burn_in=200, step_size=eps, gamma=gamma, seed=1)
    out = estimate_llc(loss, torch.zeros(len(a), dtype=torch.float64), n_beta, cfg)
    exact = gaussian_expectation(a, n_beta, gamma, eps)
    posterior = gaussian_expectation(a, n_beta, gamma)
    rank_half = int((a > 0).sum()) / 2
    se = out[se_key(LLC)]
    print(f"d={len(a)} rank/2={rank_half} gamma={gamma}: estimate {out[LLC]:.4f} +- {se:.4f}, "
          f"chain exact {exact:.4f}, posterior {posterior:.4f}")
    assert abs(out[LLC] - exact) < 4 * se, (out, exact)
    assert se < 0.04 * exact  # the s.e. is small enough for the check to mean something
    # eps p / 4 <= 0.04: the chain's law is near the posterior's
    assert 1 < exact / posterior < 1.04
    if gamma < 1:  # gamma -> 0: the learning coefficient, rank / 2
        assert abs(posterior - rank_half) < 1e-3
        assert abs(out[LLC] - rank_half) < 4 * se + (exact - posterior)
    else:  # finite gamma: the estimate separates from d/2
        assert out[LLC] + 4 * se < len(a) / 2
    assert out["llc/diverged"] == 0 and 0 <= out["llc/loss_below_init_frac"] <= 1


def product_expectation(tau):
    """E[tau u1^2 u2^2] under exp(-tau u1^2 u2^2 - |u|^2 / 2): the posterior of (w1 w2)^2 with
    n beta = tau gamma^2 in u = sqrt(gamma) w. Given u2, u1 ~ N(0, 1 / (2 tau u2^2 + 1))."""
    def marginal(u, k):
        s = 2 * tau * u * u + 1
        return (tau * u * u / s) ** k * np.exp(-u * u / 2) / np.sqrt(s)
    num = integrate.quad(marginal, -np.inf, np.inf, args=(1,), limit=500)[0]
    return num / integrate.quad(marginal, -np.inf, np.inf, args=(0,), limit=500)[0]


def test_a_singular_model_separates_from_d_over_2():
    n_beta, gamma, eps = 100.0, 1.0, 2e-3  # tau = n beta / gamma^2 = 100
    cfg = LLCConfig(chains=8, draws=3000, burn_in=500, step_size=eps, gamma=gamma, seed=2)
    out = estimate_llc(lambda w, b: (w[0] * w[1]) ** 2, torch.zeros(2, dtype=torch.float64),
                       n_beta, cfg)
    exact = product_expectation(n_beta / gamma**2)
    se = out[se_key(LLC)]
    print(f"(w1 w2)^2: estimate {out[LLC]:.4f} +- {se:.4f}, posterior {exact:.4f}, "
          "lambda 1/2, d/2 1")
    # the discretisation's bias, O(eps n beta w2^2), is within the s.e. at this eps (measured)
    assert abs(out[LLC] - exact) < 4 * se, (out, exact)
    assert out[LLC] + 4 * se < 0.5 < 1.0  # lambda = 1/2 (approached from below) < d/2


def stochastic_gradient_expectation(A, shifts, weights, n_beta, gamma, eps):
    """E[n beta L] of the chain whose batch b (probability weights[b]) has the gradient
    A w + shifts[b], sum_b weights[b] shifts[b] = 0: w' = M w - eps/2 n beta s_b + N(0, eps),
    M = I - eps/2 (n beta A + gamma I), so the stationary covariance S solves the discrete
    Lyapunov equation S = M S M + eps I + (eps n beta / 2)^2 E[s s^T]."""
    d = len(A)
    eye = torch.eye(d, dtype=torch.float64)
    M = eye - eps / 2 * (n_beta * A + gamma * eye)
    noise = sum(p * torch.outer(s, s) for p, s in zip(weights, shifts, strict=True))
    Q = eps * eye + (eps * n_beta / 2) ** 2 * noise
    S = torch.linalg.solve(torch.eye(d * d, dtype=torch.float64) - torch.kron(M, M),
                           Q.reshape(-1)).reshape(d, d)
    return float(n_beta / 2 * torch.trace(A @ S))


def test_mini_batches_are_unbiased_and_their_noise_is_the_chains():
    """L = sum_b |b|/n L_b with unequal batches: the draws' increases L_b(w) - L_b(w*) average
    to L(w) - L(w*); the batch gradients' noise heats the chain, exactly as its Lyapunov
    equation says."""
    loss, a, A = quadratic((1.0, 2.0, 3.0))
    shift = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    # L_0 = L(w) + shift.w (weight 2/3), L_1 = L(w) - 2 shift.w (weight 1/3): mean L(w)
    shifts, weights = (shift, -2 * shift), (2 / 3, 1 / 3)
    n_beta, gamma, eps = 100.0, 10.0, 5e-4
    cfg = LLCConfig(chains=8, draws=1000, burn_in=200, step_size=eps, gamma=gamma, seed=3)
    out = estimate_llc(lambda w, b: loss(w, b) + shifts[b] @ w,
                       torch.zeros(3, dtype=torch.float64), n_beta, cfg, weights=weights)
    exact = stochastic_gradient_expectation(A, shifts, weights, n_beta, gamma, eps)
    full_batch = gaussian_expectation(a, n_beta, gamma, eps)
    assert full_batch == pytest.approx(stochastic_gradient_expectation(
        A, [0 * shift], [1.0], n_beta, gamma, eps), rel=1e-10)
    print(f"mini-batches: estimate {out[LLC]:.4f} +- {out[se_key(LLC)]:.4f}, chain exact "
          f"{exact:.4f}, full-batch chain {full_batch:.4f}")
    assert abs(out[LLC] - exact) < 4 * out[se_key(LLC)], (out, exact)


def test_a_diverging_chain_gives_nan_with_a_warning(caplog):
    loss, a, _ = quadratic((1.0, 2.0))
    cfg = LLCConfig(chains=2, draws=50, burn_in=0, step_size=1.0, gamma=1.0)  # eps p >> 4
    out = estimate_llc(loss, torch.zeros(2, dtype=torch.float64), 100.0, cfg)
    assert math.isnan(out[LLC]) and math.isnan(out[se_key(LLC)])
    assert out["llc/diverged"] == 2
    assert "diverged" in caplog.text


@pytest.mark.parametrize(("field", "value", "message"), [
    ("step_size", -1, r"measure\.llc\.step_size=-1: use a value > 0"),
    ("gamma", 0.0, r"measure\.llc\.gamma=0\.0: use a value > 0"),
    ("n_beta", float("nan"), r"measure\.llc\.n_beta=nan: use a value > 0"),
    ("chains", 0, r"measure\.llc\.chains=0: use an integer >= 1"),
    ("burn_in", -1, r"measure\.llc\.burn_in=-1: use an integer >= 0"),
    ("draws", 2.5, r"measure\.llc\.draws=2\.5: use an integer >= 1"),
])
def test_a_bad_config_names_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        LLCConfig(**{field: value})


def test_a_bad_override_names_the_field():
    with pytest.raises(ValueError, match=r"measure\.llc\.step_size=-1\.0: use a value > 0"):
        apply_overrides(TrialConfig(), {"measure.llc.step_size": -1})


@pytest.mark.parametrize("shape", ["d16-h1-l1-i32", "lstm-h16-l1"])
def test_the_model_closure_is_the_population_loss_over_the_counted_parameters(shape):
    """loss(w*, b) and its gradient are those of the model's own parameters (tied and
    excluded ones as flatness counts them), so SGLD moves the model, BiLSTM included."""
    src = load("dyck:4")
    model = build_model(parse_model(shape), src.V, src.max_length, seed=0).double().eval()
    tokens, lengths = src.sample(24, seed=0)
    x = masked_inputs(tokens, lengths, seed=0)
    q = soft_labels(src, tokens, lengths, x.positions)
    params = selected_parameters(model, FlatnessConfig().exclude)
    loss, w_star, weights = model_loss(model, params, x, q, 10, "cpu")
    assert weights == [10 / 24, 10 / 24, 4 / 24]
    for b, reference in enumerate(batch_losses(model, x, q, 10, "cpu")):
        w = w_star.clone().requires_grad_(True)
        value = loss(w, b)
        (grad,) = torch.autograd.grad(value, w)
        expected = reference()
        grads = torch.autograd.grad(expected, list(params.values()))
        assert float(value.detach()) == pytest.approx(float(expected.detach()), rel=1e-12)
        assert torch.allclose(grad, torch.cat([g.reshape(-1) for g in grads]), rtol=1e-10,
                              atol=1e-14)
    # a moved w moves the loss the model would have with those weights
    w = w_star + 0.01 * torch.randn(w_star.shape, dtype=w_star.dtype,
                                    generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p, v in zip(params.values(), w.split([p.numel() for p in params.values()]),
                        strict=True):
            p.copy_(v.view(p.shape))
        assert float(loss(w, 0)) == pytest.approx(float(batch_losses(model, x, q, 10, "cpu")[0]()),
                                                  rel=1e-12)


TINY = {"what": ["llc"], "n_eval": 64, "n_downstream": 20, "llc.chains": 2, "llc.draws": 20,
        "llc.burn_in": 5, "llc.batch_size": 16}


def test_llc_on_a_tiny_bert_is_finite_and_deterministic():
    src = load("dyck:4")
    shape = parse_model("d16-h1-l1-i32")
    cfg = apply_overrides(MeasureConfig(), TINY)
    model = build_model(shape, src.V, src.max_length, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    data = eval_data(src, cfg, shape)
    out = measure_model(model, src, data, cfg, "cpu")
    assert {k for k in out if not k.startswith("time/")} == set(metric_keys(["llc"], ()))
    assert set(LLC_KEYS) <= set(out) and out["time/llc_s"] > 0
    assert all(math.isfinite(out[k]) for k in LLC_KEYS), out
    assert out["llc/diverged"] == 0 and out["llc/n_beta"] == pytest.approx(64 / math.log(64))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    again = measure_model(model, src, data, cfg, "cpu")
    assert all(again[k] == out[k] for k in LLC_KEYS)  # seeded: the same numbers
    other = measure_model(model, src, data, apply_overrides(cfg, {"llc.seed": 1}), "cpu")
    assert other[LLC] != out[LLC]


def test_the_calibration_is_logged_with_the_trial():
    logged = tracked_params(TrialConfig(measure=MeasureConfig(what=("llc",))))
    assert {"measure.llc.step_size", "measure.llc.gamma", "measure.llc.n_beta",
            "measure.llc.draws", "measure.flatness.exclude"} <= set(logged)
    assert "measure.llc.step_size" not in tracked_params(TrialConfig())
