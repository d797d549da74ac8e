r"""Preconditioned sharpness: lambda_max(P^{-1} H) with Adam's preconditioner from the checkpoint
(Cohen, Ghorbani, Krishnan, Agarwal, Medapati, Badura, Suo, Cardoze, Nado, Dahl and Gilmer,
*Adaptive Gradient Methods at the Edge of Stability*, 2022, arXiv:2207.14484).

.. math::
    P = \mathrm{diag}(\sqrt{\hat v} + \epsilon), \qquad \hat v = v / (1 - \beta_2^t), \qquad
    \lambda_{max}(P^{-1} H) = \lambda_{max}(P^{-1/2} H P^{-1/2})

with v (``exp_avg_sq``), t (``step``), beta2 and epsilon the checkpoint's saved AdamW state
(``measure.optimizer_state``): the preconditioner of the last update taken, the one that
produced these weights. H is the Hessian of the population masked-LM loss (labels = the true
conditionals) over the first ``precond.n_inputs`` validation sentences, one masked word each,
over the parameters ``FlatnessConfig.exclude`` keeps (``hvp.CurvatureOperator``, as for
``flat/top_eig_hessian``). P^{-1} H is similar to the symmetric P^{-1/2} H P^{-1/2}, so they have
the same eigenvalues; its top one is the largest Ritz value of ``precond.lanczos_steps`` Lanczos
steps on v -> P^{-1/2} H P^{-1/2} v (``measure.lanczos``; from below). Its standard error is the
delta method's, as for the top eigenvalue of H (``measure.spectrum``): lambda = u^T P^{-1/2} H
P^{-1/2} u for the top unit eigenvector u, the mean over batches of (P^{-1/2} u)^T H_b
(P^{-1/2} u), so the s.e. is that of those per-batch values.

The learning rate eta is the last update's (the saved optimizer's). Cohen et al.'s Adam with
momentum beta1 is stable on a quadratic with fixed P while lambda_max(P^{-1} H) <
(2 + 2 beta1) / ((1 - beta1) eta), 38 / eta at beta1 = 0.9 (their "adaptive edge of stability").
Keys (``flatlm.measure``): ``flat/precond_sharpness`` (+ ``_se``), ``flat/precond_sharpness_x_lr``
= lambda eta (compare with 38), ``flat/precond_sharpness_ratio`` = lambda / that threshold (1 at
the edge). Weight decay is left out of H (AdamW's decay is decoupled: not part of the loss).
A checkpoint without Adam moments (SGD, the step-0 checkpoint, no training state) gives NaN,
with the reason logged.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.measure import (
    PRECOND_KEYS,
    PRECOND_SHARPNESS,
    PRECOND_SHARPNESS_RATIO,
    PRECOND_SHARPNESS_X_LR,
    se_key,
)
from flatlm.measure.curvature.common import grouped_mean_se, masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hvp import CurvatureOperator, flatten
from flatlm.measure.curvature.lanczos import lanczos, top_ritz_pair
from flatlm.measure.curvature.spectrum import rademacher
from flatlm.measure.landscape.optimizer_state import SavedOptimizer, saved_optimizer
from flatlm.sources.base import Source

log = logging.getLogger(__name__)

KEYS = PRECOND_KEYS


@dataclass(frozen=True, kw_only=True)
class PrecondConfig:
    """Budget of the preconditioned sharpness (``measure.precond``)."""

    # masked inputs (the first n validation sentences, one word masked each); each Lanczos step
    # is one Hessian-vector product over all of them
    n_inputs: int = 512
    batch_size: int = 64  # inputs per product; also the unit of the s.e.
    lanczos_steps: int = 20  # as spectrum.lanczos_steps (memory: this many parameter vectors)
    seed: int = 0  # masked positions and the start vector

    def __post_init__(self):
        for name in ("n_inputs", "batch_size", "lanczos_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"measure.precond.{name}={value!r}: use an integer >= 1")


def adam_stability_threshold(beta1: float, lr: float) -> float:
    """(2 + 2 beta1) / ((1 - beta1) lr): Cohen et al.'s threshold of lambda_max(P^{-1} H).

    >>> round(adam_stability_threshold(0.9, 1.0), 12)
    38.0
    """
    return (2 + 2 * beta1) / ((1 - beta1) * lr)


def preconditioner(saved: SavedOptimizer, device, dtype) -> torch.Tensor:
    """P's diagonal sqrt(v_hat) + eps, flat over the parameters, on ``device``."""
    return flatten([v.sqrt() + saved.eps for v in saved.v_hat()]).to(device, dtype)


def precond_top_eigenvalue(op: CurvatureOperator, p_diag: torch.Tensor, steps: int,
                           seed: int) -> dict:
    """lambda_max(P^{-1/2} H P^{-1/2}) of ``op``'s H and P = diag(``p_diag``) (Lanczos), and its
    delta-method s.e. over batches: ``{"value", "se", "vector"}`` (the unit eigenvector u)."""
    scale = p_diag.rsqrt()  # P^{-1/2}

    def matvec(v: torch.Tensor) -> torch.Tensor:
        return scale * op.matvec(scale * v)

    g = torch.Generator(device=op.device).manual_seed(seed)
    with op.ready():
        start = rademacher(op.n_params, op.dtype, op.device, g)
        value, u = top_ritz_pair(lanczos(matvec, start, steps))
        values, counts = op.per_batch_quadratic(scale * u)  # (P^{-1/2} u)^T H_b (P^{-1/2} u)
    _, se = grouped_mean_se(values, counts=counts)
    return {"value": value, "se": se, "vector": u}


def measure_precond(model: nn.Module, source: Source, tokens, lengths, cfg: PrecondConfig,
                    exclude: tuple[str, ...], device, checkpoint_dir) -> dict[str, float]:
    """The ``flat/precond_sharpness*`` metrics of ``model`` with the optimizer state saved in
    ``checkpoint_dir``; NaN (the reason logged) where there are no Adam moments."""
    params = list(selected_parameters(model, exclude).values())
    saved, why = saved_optimizer(checkpoint_dir, model, params)
    if saved is not None and saved.kind != "adam":
        why = f"the optimizer is {saved.kind}: no preconditioner"
    elif saved is not None and saved.without_moments():
        why = (f"{saved.without_moments()} of {len(params)} parameters have no Adam moments yet "
               "(a checkpoint before their first update)")
    if why:
        log.warning("flat/precond_sharpness not measured: %s", why)
        return dict.fromkeys(KEYS, math.nan)
    n = min(cfg.n_inputs, len(tokens))
    x = masked_inputs(tokens, lengths, cfg.seed, n=n)
    q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
    op = CurvatureOperator(model, params, x, q, cfg.batch_size, device)
    top = precond_top_eigenvalue(op, preconditioner(saved, device, op.dtype), cfg.lanczos_steps,
                                 cfg.seed + 5)
    value = top["value"]
    return {PRECOND_SHARPNESS: value, se_key(PRECOND_SHARPNESS): top["se"],
            PRECOND_SHARPNESS_X_LR: value * saved.lr,
            PRECOND_SHARPNESS_RATIO: value / adam_stability_threshold(saved.betas[0], saved.lr)}
