"""Preconditioned sharpness (``measure.precond``) and critical sharpness (``measure.critical``)
against dense float64 references, and end to end through a trial.

The exact cases use ``test_spectrum``'s population: the 20 (sentence, position) pairs of
``test_flatness``'s pool with Dirichlet soft labels, on a float64 d4-h1-l1-i8 BERT of which 36
parameters in three blocks count, so that the full Hessian (``torch.autograd.functional.
hessian``) is cheap. The optimizer states are real ones: ``train.algorithms.build_optimizer``'s
AdamW and SGD, stepped on that loss and saved as a training checkpoint saves them.
"""

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flatlm.cli import main as flatlm_main
from flatlm.core.config import apply_overrides
from flatlm.measure import (
    CRITICAL_SHARPNESS,
    CRITICAL_SHARPNESS_X_LR,
    CRITICAL_STEP,
    PRECOND_SHARPNESS,
    PRECOND_SHARPNESS_RATIO,
    PRECOND_SHARPNESS_X_LR,
    UPDATE_CURVATURE,
    se_key,
)
from flatlm.measure.curvature.common import selected_parameters
from flatlm.measure.curvature.hessian_trace import eager_attention
from flatlm.measure.curvature.hvp import CurvatureOperator, flatten
from flatlm.measure.landscape.critical import (
    KEYS as CRITICAL_KEYS,
)
from flatlm.measure.landscape.critical import (
    LineLoss,
    critical_metrics,
    displaced,
    fit_line,
    update_direction,
)
from flatlm.measure.landscape.optimizer_state import saved_optimizer
from flatlm.measure.landscape.precond import KEYS as PRECOND_KEYS
from flatlm.measure.landscape.precond import precond_top_eigenvalue, preconditioner
from flatlm.measure.run import MeasureConfig
from flatlm.models.checkpoint import TRAINING_STATE_NAME
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.train.algorithms import build_optimizer
from flatlm.train.config import TrainConfig, resolve
from tests.measure.test_flatness import Exact, V, pool_pairs, tiny_bert
from tests.measure.test_spectrum import KEEP, excluding_all_but, fd_hessian

LR = 0.01


@pytest.fixture(scope="module")
def tiny():
    model = tiny_bert("d4-h1-l1-i8", seed=7, scale=0.5)
    exclude = excluding_all_but(model, KEEP)
    params = list(selected_parameters(model, exclude).values())
    x, rows, positions, _ = pool_pairs()
    g = torch.Generator().manual_seed(8)
    e = -torch.rand(len(rows), V, generator=g, dtype=torch.float64).log()
    q = e / e.sum(-1, keepdim=True)  # Dirichlet(1) soft labels per pair
    op = CurvatureOperator(model, params, x, q, 7, "cpu")  # 3 batches
    exact = Exact(model, exclude)

    def loss(theta):  # the mean over the pairs, as the operator's
        return -(q * exact.logits(theta).log_softmax(-1)).sum() / len(q)

    with eager_attention(model):
        H = torch.autograd.functional.hessian(loss, exact.theta)
    return SimpleNamespace(model=model, exclude=exclude, params=params, x=x, q=q, op=op, H=H)


def stepped(tiny, algorithm: str, steps: int, tmp_path, seed: int = 0):
    """flatlm's optimizer of ``algorithm`` over the whole model, stepped ``steps`` times on
    gradients of the population loss plus noise (so that m is not v's square root), saved as a
    checkpoint saves it; the weights put back after. (optimizer, checkpoint dir)"""
    cfg = resolve(TrainConfig(algorithm=algorithm, lr=LR, steps=10, warmup_steps=0))
    optimizer = build_optimizer(cfg, tiny.model)
    weights = [p.detach().clone() for p in tiny.model.parameters()]
    line = LineLoss(tiny.model, tiny.x, tiny.q, 7, "cpu")
    g = torch.Generator().manual_seed(seed)
    everything = list(tiny.model.parameters())
    with eager_attention(tiny.model):
        for _ in range(steps):
            grads = line.gradient(everything)
            for p, gr in zip(everything, grads, strict=True):
                p.grad = gr + 0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype)
            optimizer.step()
    with torch.no_grad():
        for p, w in zip(everything, weights, strict=True):
            p.copy_(w)
    torch.save({"optimizer": optimizer.state_dict()}, tmp_path / TRAINING_STATE_NAME)
    return optimizer, tmp_path


# --- the saved state and the update direction -------------------------------------------------

def test_the_saved_moments_are_the_optimizers_own(tiny, tmp_path):
    optimizer, ckpt = stepped(tiny, "adamw", 3, tmp_path)
    saved, why = saved_optimizer(ckpt, tiny.model, tiny.params)
    assert why == "" and saved.kind == "adam" and saved.decoupled
    assert saved.steps == (3,) * len(tiny.params) and saved.lr == LR
    assert saved.betas == (0.9, 0.98) and saved.eps == 1e-6  # the paper's, TrainConfig's
    for i, p in enumerate(tiny.params):
        state = optimizer.state[p]
        assert torch.equal(saved.exp_avg_sq[i], state["exp_avg_sq"])
        assert torch.equal(saved.exp_avg[i], state["exp_avg"])
        assert saved.weight_decay[i] == (0.01 if p.dim() >= 2 else 0.0)  # build_optimizer's


@pytest.mark.parametrize(("algorithm", "steps"), [("adamw", 2), ("adamw", 0), ("sgd", 2)])
def test_the_direction_is_the_optimizers_next_update(tiny, tmp_path, algorithm, steps):
    """d = (w after optimizer.step() - w) / lr to rounding, the gradient folded in: Adam's
    moments and bias correction, AdamW's decoupled decay, SGD's coupled decay; at step 0
    Adam's first update."""
    optimizer, ckpt = stepped(tiny, algorithm, steps, tmp_path, seed=1)
    saved, _ = saved_optimizer(ckpt, tiny.model, tiny.params)
    line = LineLoss(tiny.model, tiny.x, tiny.q, 7, "cpu")
    with eager_attention(tiny.model):
        grads = line.gradient(list(tiny.model.parameters()))
    selected = {id(p) for p in tiny.params}
    chosen = [g for p, g in zip(tiny.model.parameters(), grads, strict=True) if id(p) in selected]
    d = update_direction(saved, chosen, tiny.params, weight_decay=True)
    weights = [p.detach().clone() for p in tiny.params]
    everything = [p.detach().clone() for p in tiny.model.parameters()]
    try:
        for p, g in zip(tiny.model.parameters(), grads, strict=True):
            p.grad = g
        optimizer.param_groups[0]["lr"] = optimizer.param_groups[1]["lr"] = LR
        optimizer.step()
        moved = [(p.detach() - w) / LR for p, w in zip(tiny.params, weights, strict=True)]
    finally:
        with torch.no_grad():
            for p, w in zip(tiny.model.parameters(), everything, strict=True):
                p.copy_(w)
    torch.testing.assert_close(flatten(d), flatten(moved), rtol=1e-9, atol=1e-12)
    assert saved.kind == ("sgd" if algorithm == "sgd" else "adam")


# --- preconditioned sharpness: exact ----------------------------------------------------------

def test_the_full_hessian_is_the_operators(tiny):
    """The dense reference itself, two ways: autograd.functional.hessian (double backward through
    functional_call) and central differences of gradients (first derivatives only)."""
    fd = fd_hessian(tiny.op)
    torch.testing.assert_close(tiny.H, fd, rtol=1e-6, atol=1e-8)
    assert float(torch.linalg.eigvalsh(tiny.H)[0]) < 0  # indefinite, not a Fisher


@pytest.mark.parametrize("planted", [True, False], ids=["planted-v", "adamw-state"])
def test_precond_sharpness_is_the_top_eigenvalue_of_P_inv_H(tiny, tmp_path, planted):
    """Lanczos on P^{-1/2} H P^{-1/2} (36 steps on 36 parameters: the Krylov space is the whole
    space) equals numpy's top eigenvalue of the dense P^{-1/2} H P^{-1/2}, and of P^{-1} H (not
    symmetric; the same eigenvalues), to 1e-8 relative. The planted v spans six decades, so P
    reorders H's spectrum."""
    _, ckpt = stepped(tiny, "adamw", 2, tmp_path)
    saved, _ = saved_optimizer(ckpt, tiny.model, tiny.params)
    if planted:
        g = torch.Generator().manual_seed(3)
        v = [10.0 ** (-6 * torch.rand(p.shape, generator=g, dtype=p.dtype)) for p in tiny.params]
        saved = dataclasses.replace(saved, exp_avg_sq=v)
    p_diag = preconditioner(saved, "cpu", torch.float64)
    top = precond_top_eigenvalue(tiny.op, p_diag, steps=len(p_diag), seed=1)
    Hn = tiny.H.numpy()
    s = 1 / np.sqrt(p_diag.numpy())
    symmetric = np.linalg.eigvalsh(s[:, None] * Hn * s[None, :])[-1]
    general = np.linalg.eigvals(Hn / p_diag.numpy()[:, None])
    assert np.abs(general.imag).max() < 1e-8 * np.abs(general).max()
    assert top["value"] == pytest.approx(symmetric, rel=1e-8)
    assert top["value"] == pytest.approx(general.real.max(), rel=1e-8)
    assert top["value"] != pytest.approx(np.linalg.eigvalsh(Hn)[-1] / p_diag.mean().item(),
                                         rel=1e-2)  # not H's top over a mean P
    assert math.isfinite(top["se"]) and top["se"] > 0  # 3 batches


# --- critical sharpness: the fit --------------------------------------------------------------

def test_the_fit_is_exact_on_a_quadratic_loss():
    """phi(t) = L(w + t d) for L(w) = w^T A w / 2 + b^T w (A indefinite), two "batches": the
    fitted slope is g.d and the curvature d^T A d to float rounding, the critical step
    2 (-g.d) / (d^T A d) and the critical sharpness its 2 / eta_c."""
    g = torch.Generator().manual_seed(0)
    n = 10
    A = [(lambda M: (M + M.T) / 2)(torch.randn(n, n, generator=g, dtype=torch.float64))
         for _ in range(2)]
    b = [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(2)]
    w = torch.randn(n, generator=g, dtype=torch.float64)
    grad = sum(Ai @ w + bi for Ai, bi in zip(A, b, strict=True))
    d = -grad + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)  # descends, not -g

    def losses_at(t):
        u = w + t * d
        return np.array([float(u @ Ai @ u / 2 + bi @ u) for Ai, bi in zip(A, b, strict=True)])

    slopes, curvatures = fit_line(losses_at, [-0.02, -0.01, 0.01, 0.02])
    gd, dAd = float(grad @ d), float(d @ (A[0] + A[1]) @ d)
    assert gd < 0 and dAd > 0
    assert slopes.sum() == pytest.approx(gd, rel=1e-9)
    assert curvatures.sum() == pytest.approx(dAd, rel=1e-9)
    out = critical_metrics(slopes, curvatures, np.array([1.0, 1.0]), float(d @ d), lr=0.01)
    # the metrics are means over the 2 inputs: the same ratio
    assert out[CRITICAL_STEP] == pytest.approx(2 * -gd / dAd, rel=1e-9)
    assert out[CRITICAL_SHARPNESS] == pytest.approx(dAd / -gd, rel=1e-9)
    assert out[CRITICAL_SHARPNESS_X_LR] == pytest.approx(0.01 * dAd / -gd, rel=1e-9)
    assert out[UPDATE_CURVATURE] == pytest.approx(dAd / 2 / float(d @ d), rel=1e-9)
    u = w + out[CRITICAL_STEP] * d  # the loss is back at L(w) there
    assert float(sum(u @ Ai @ u / 2 + bi @ u for Ai, bi in zip(A, b, strict=True))) == \
        pytest.approx(losses_at(0.0).sum(), rel=1e-9)


def test_degenerate_fits_are_nan_not_errors(caplog):
    up = critical_metrics(np.array([1.0]), np.array([2.0]), np.array([1.0]), 1.0, lr=0.1)
    assert math.isnan(up[CRITICAL_SHARPNESS]) and math.isnan(up[CRITICAL_STEP])
    assert up[UPDATE_CURVATURE] == 2.0
    concave = critical_metrics(np.array([-1.0]), np.array([-2.0]), np.array([1.0]), 1.0, lr=0.1)
    assert concave[CRITICAL_SHARPNESS] == -2.0 and math.isnan(concave[CRITICAL_STEP])
    assert "does not descend" in caplog.text and "does not rise" in caplog.text


def test_the_fit_on_the_model_is_the_curvature_along_d(tiny, tmp_path):
    """On the BERT, along AdamW's next update d (||d|| ~ 3.8): the forward-pass fit of
    L(w + t d) at t = +-s, +-2s gives d^T H d (the full Hessian) and g.d with errors from the
    Taylor remainder (the quartic term for the curvature, the cubic for the slope), which shrink
    as s^2: measured 2.7e-7 / 2.1e-8 relative at s = 1e-4, 2.7e-5 / 2.1e-6 at 1e-3, 2.8e-3 /
    2.3e-4 at s = lr = 1e-2 (the update's own size). The weights come back exactly."""
    _, ckpt = stepped(tiny, "adamw", 2, tmp_path)
    saved, _ = saved_optimizer(ckpt, tiny.model, tiny.params)
    line = LineLoss(tiny.model, tiny.x, tiny.q, 7, "cpu")
    before = flatten([p.detach().clone() for p in tiny.params])
    with eager_attention(tiny.model):
        grads = line.gradient(tiny.params)
        d = update_direction(saved, grads, tiny.params, weight_decay=True)
        errors = {}
        flat_d = flatten(d)
        dHd, gd = float(flat_d @ tiny.H @ flat_d), float(flatten(grads) @ flat_d)
        for s in (1e-4, 1e-3, LR):
            with displaced(tiny.params, d) as move:
                slopes, curvatures = fit_line(lambda t: (move(t), line.batch_sums())[1],
                                              [-2 * s, -s, s, 2 * s])
            n = len(tiny.q)
            errors[s] = (abs(curvatures.sum() / n / dHd - 1), abs(slopes.sum() / n / gd - 1))
    assert torch.equal(flatten([p.detach() for p in tiny.params]), before)
    assert errors[1e-4][0] < 2e-6 and errors[1e-4][1] < 2e-7
    assert errors[LR][0] < 1e-2 and errors[LR][1] < 1e-3
    for which in (0, 1):  # the remainder's s^2, not a wrong coefficient
        assert 50 < errors[LR][which] / errors[1e-3][which] < 200


# --- end to end -------------------------------------------------------------------------------

TRIAL = {"source": "dyck:4", "model": "d16-h1-l1-i32", "train.steps": 2, "train.batch_size": 4,
         "train.checkpoint_steps": [0, 2], "train.warmup_steps": 1, "measure.n_eval": 16,
         "measure.n_downstream": 20, "measure.what": ["precond", "critical"],
         "measure.precond.n_inputs": 16, "measure.precond.batch_size": 8,
         "measure.precond.lanczos_steps": 6, "measure.critical.n_inputs": 16,
         "measure.critical.batch_size": 8}


def test_an_adamw_trial_measures_both_at_every_checkpoint(tmp_path, caplog):
    """A real 2-step AdamW run: at step 2 every key is finite, lambda eta and the ratio to 38 /
    eta follow from lambda and the saved lr; at step 0 (no update yet) precond is NaN with the
    reason logged and critical follows Adam's first update."""
    rows = run_trial(apply_overrides(TrialConfig(), TRIAL), tmp_path)
    last, first = rows[2], rows[0]
    for key in PRECOND_KEYS + CRITICAL_KEYS:
        assert math.isfinite(last[key]), key
    lr = 1e-3  # the last update's (warmup 1: at the peak)
    assert last[PRECOND_SHARPNESS] > 0 and last[se_key(PRECOND_SHARPNESS)] > 0
    assert last[PRECOND_SHARPNESS_X_LR] == pytest.approx(last[PRECOND_SHARPNESS] * lr)
    assert last[PRECOND_SHARPNESS_RATIO] == pytest.approx(last[PRECOND_SHARPNESS] * lr / 38)
    assert last[CRITICAL_STEP] == pytest.approx(2 / last[CRITICAL_SHARPNESS])
    assert all(math.isnan(first[key]) for key in PRECOND_KEYS)
    assert "no Adam moments yet" in caplog.text
    assert all(math.isfinite(first[key]) for key in CRITICAL_KEYS)
    assert last["time/precond_s"] >= 0 and last["time/critical_s"] >= 0


def test_flatlm_measure_with_out_elsewhere_reads_the_checkpoint_s_optimizer_state(tmp_path):
    """``--out`` moves the JSON only: precond and critical still read the Adam state saved in
    the checkpoint's directory, and give what the trial measured there."""
    rows = run_trial(apply_overrides(TrialConfig(), {**TRIAL, "train.checkpoint_steps": [2]}),
                     tmp_path / "run")
    out = tmp_path / "elsewhere" / "m.json"
    sets = [a for k in ("n_eval", "n_downstream", "precond.n_inputs", "precond.batch_size",
                        "precond.lanczos_steps", "critical.n_inputs", "critical.batch_size")
            for a in ("--set", f"measure.{k}={TRIAL['measure.' + k]}")]
    assert flatlm_main(["measure", str(tmp_path / "run" / "checkpoints" / "step-2"), "--what",
                        "precond,critical", "--out", str(out), "--json", "--no-progress",
                        *sets]) == 0
    measured = json.loads(out.read_text())
    for key in (PRECOND_SHARPNESS, CRITICAL_SHARPNESS):
        assert measured[key] == pytest.approx(rows[2][key], rel=1e-9), key


def test_an_sgd_checkpoint_gives_nan_precond_and_a_critical_sharpness(tmp_path, caplog):
    rows = run_trial(apply_overrides(TrialConfig(), {**TRIAL, "train.algorithm": "sgd",
                                                     "train.checkpoint_steps": [2]}), tmp_path)
    assert all(math.isnan(rows[2][key]) for key in PRECOND_KEYS)
    assert "the optimizer is sgd" in caplog.text
    assert all(math.isfinite(rows[2][key]) for key in CRITICAL_KEYS)


@pytest.mark.parametrize(("override", "match"), [
    ({"precond.lanczos_steps": 0}, r"measure\.precond\.lanczos_steps=0: use an integer >= 1"),
    ({"precond.n_inputs": 0}, r"measure\.precond\.n_inputs=0"),
    ({"critical.multiples": [1.0]}, r"measure\.critical\.multiples=.*two distinct nonzero"),
    ({"critical.multiples": [0.0, 1.0, 2.0]}, r"measure\.critical\.multiples"),
    ({"critical.step_scale": 0.0}, r"measure\.critical\.step_scale=0.0: use a number > 0"),
    ({"critical.lr": -1.0}, r"measure\.critical\.lr=-1.0"),
    ({"critical.batch_size": 0}, r"measure\.critical\.batch_size=0"),
])
def test_a_bad_setting_names_its_field(override, match):
    with pytest.raises(ValueError, match=match):
        apply_overrides(MeasureConfig(), override)
