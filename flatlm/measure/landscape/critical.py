r"""Critical sharpness: the curvature along the optimizer's next update, from a few forward passes
(Kalra et al., *A Scalable Measure of Loss Landscape Curvature for Analyzing the Training
Dynamics of LLMs*, 2026, arXiv:2601.16979: the critical learning rate eta_c is the smallest at
which the next update raises the loss, and the critical sharpness lambda_c = 2 / eta_c; for
gradient descent on a quadratic, along -g, it is the Rayleigh quotient g^T H g / g^T g <=
lambda_max(H)). They find eta_c by a line search along the update; here the line search is a
fixed set of steps and a quadratic fit, so eta_c is the fit's (exact on a quadratic loss).

**Direction.** d is the optimizer's next update per unit learning rate, so that the update is
eta d, taken from the checkpoint's saved state (``measure.optimizer_state``) with the gradient g
of the measured loss in place of the next mini-batch's, folded in exactly as torch's AdamW does:

.. math::
    m' = \beta_1 m + (1 - \beta_1) g, \quad v' = \beta_2 v + (1 - \beta_2) g^2, \quad
    d = -\Big(\frac{m' / (1 - \beta_1^{t+1})}{\sqrt{v' / (1 - \beta_2^{t+1})} + \epsilon}
            + \lambda_{wd} w\Big)

(Adam without decoupled decay: lambda_wd w added to g before the moments instead; SGD without
momentum: d = -(g + lambda_wd w); a checkpoint without a training state: d = -g). eta is the
last update's rate (``critical.lr`` overrides it). Folding g in, not the saved m alone, is what
the next update does, and it is defined at step 0 (Adam's first update, ~ -sign(g)), where
there are no moments yet. The decay term (``critical.weight_decay``) is part of the update the
line search follows; L itself has no decay term.

**Line search.** phi(t) = L(w + t d), L the population masked-LM loss (labels = the true
conditionals) over the first ``critical.n_inputs`` validation sentences, one masked word each,
over the parameters ``FlatnessConfig.exclude`` keeps (the others stay put). phi is evaluated at
t = 0 and t_j = m_j s, s = ``critical.step_scale`` eta, m_j = ``critical.multiples`` (default
-2, -1, 1, 2: 5 forward passes over the inputs), and phi(t) - phi(0) = a t + c t^2 / 2 is fitted
by least squares: a ~ g.d (the slope), c ~ d^T H d (the curvature along d); both are exact for a
quadratic loss, and the symmetric steps cancel the cubic term from c. Then:

- ``flat/critical_sharpness`` lambda_c = c / (-a) = 2 / eta_c (same units as 2 / eta), and its
  s.e. over batches: the fit is linear in phi, so every batch has its own a_b, c_b, and lambda_c
  is a ratio of their sums (delta method; given d, which the same inputs' gradient made);
- ``flat/critical_step`` eta_c = -2 a / c, the step t > 0 at which the fitted phi returns to
  phi(0): the largest learning rate at which the next update does not raise the loss;
- ``flat/critical_sharpness_x_lr`` lambda_c eta (the next update raises the loss above 2);
- ``flat/update_curvature`` c / ||d||^2, the curvature along the update's direction (for
  gradient descent equal to lambda_c).

If a >= 0 (d does not descend L; possible with momentum) lambda_c and eta_c are NaN; if c <= 0
(no loss increase along d within the quadratic model) eta_c is NaN and lambda_c <= 0 is kept.
The reason is logged in both cases. The measured model's weights are restored exactly.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flatlm.core.stats import ratio_mean_se
from flatlm.measure import (
    CRITICAL_KEYS,
    CRITICAL_SHARPNESS,
    CRITICAL_SHARPNESS_X_LR,
    CRITICAL_STEP,
    UPDATE_CURVATURE,
    se_key,
)
from flatlm.measure.curvature.common import eval_mode, masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hessian_trace import eager_attention, second_order_logits
from flatlm.measure.landscape.optimizer_state import SavedOptimizer, saved_optimizer
from flatlm.sources.base import Source

log = logging.getLogger(__name__)

KEYS = CRITICAL_KEYS
PAPER_LR = 1e-3  # the paper's peak rate (A.5): eta for a checkpoint without a training state


@dataclass(frozen=True, kw_only=True)
class CriticalConfig:
    """The line search of the critical sharpness (``measure.critical``)."""

    n_inputs: int = 512  # masked inputs, the first n validation sentences
    batch_size: int = 64  # inputs per forward pass; also the unit of the s.e.
    # probe steps t = m * step_scale * eta besides t = 0: at least two distinct nonzero m (the
    # fit has two unknowns); symmetric ones cancel the cubic term from the curvature
    multiples: tuple[float, ...] = (-2.0, -1.0, 1.0, 2.0)
    step_scale: float = 1.0  # s / eta: 1 probes at the next update's own size and twice it
    weight_decay: bool = True  # d includes the optimizer's weight decay, as its update does
    # eta: None = the last update's (the saved optimizer's), or PAPER_LR without a training state
    lr: float | None = None
    seed: int = 0  # masked positions

    def __post_init__(self):
        for name in ("n_inputs", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"measure.critical.{name}={value!r}: use an integer >= 1")
        numbers = not isinstance(self.multiples, str) and all(
            isinstance(m, int | float) and math.isfinite(m) for m in self.multiples)
        if not numbers or 0 in self.multiples or len(set(self.multiples)) < 2:
            raise ValueError(f"measure.critical.multiples={self.multiples!r}: use a list of at "
                             "least two distinct nonzero numbers (t = 0 is always measured)")
        if not self.step_scale > 0:
            raise ValueError(f"measure.critical.step_scale={self.step_scale}: use a number > 0")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"measure.critical.lr={self.lr}: use a number > 0, or None for the "
                             "checkpoint's")


# --- the direction --------------------------------------------------------------------------

def update_direction(saved: SavedOptimizer | None, grads: list[torch.Tensor],
                     params: list[nn.Parameter], *, weight_decay: bool) -> list[torch.Tensor]:
    """d per parameter (module docstring): the next update / eta, ``grads`` folded in."""
    weights = [p.detach() for p in params]
    if saved is None:
        return [-g for g in grads]
    decay = saved.weight_decay if weight_decay else (0.0,) * len(params)
    if saved.kind == "sgd":
        return [-(g + wd * w) for g, w, wd in zip(grads, weights, decay, strict=True)]
    (b1, b2), out = saved.betas, []
    for i, (g, w, wd) in enumerate(zip(grads, weights, decay, strict=True)):
        if not saved.decoupled:  # Adam's L2 decay enters the moments; AdamW's does not
            g, wd = g + wd * w, 0.0
        t = saved.steps[i] + 1
        m = b1 * saved.exp_avg[i].to(g) + (1 - b1) * g
        v = b2 * saved.exp_avg_sq[i].to(g) + (1 - b2) * g.square()
        step = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + saved.eps)
        out.append(-(step + wd * w))
    return out


# --- the loss along the line ----------------------------------------------------------------

class LineLoss:
    """The population loss over masked inputs ``x`` with soft labels ``q``: per-batch sums at
    the current weights (float64), and its mean gradient over ``params``."""

    def __init__(self, model: nn.Module, x, q: torch.Tensor, batch_size: int, device):
        self.model, self.x, self.q, self.device = model, x, q, device
        self.spans = [(a, min(a + batch_size, len(x))) for a in range(0, len(x), batch_size)]
        self.logits = second_order_logits(model)  # the BiLSTM unrolled: cuDNN's has no
        #   backward in eval mode

    def counts(self) -> np.ndarray:
        return np.array([b - a for a, b in self.spans], dtype=np.float64)

    def _batch_sum(self, a: int, b: int) -> torch.Tensor:
        batch = self.x.batch(a, b, self.device)
        z = self.logits(self.model, batch.input_ids, batch.attention_mask, batch.positions)
        return -(self.q[a:b].to(self.device, z.dtype) * z.log_softmax(-1)).sum()

    def batch_sums(self) -> np.ndarray:
        with torch.no_grad():
            return np.array([float(self._batch_sum(a, b).double()) for a, b in self.spans])

    def gradient(self, params: list[nn.Parameter]) -> list[torch.Tensor]:
        total = [torch.zeros_like(p) for p in params]
        for a, b in self.spans:
            grads = torch.autograd.grad(self._batch_sum(a, b), params, allow_unused=True,
                                        materialize_grads=True)  # 0 for an unused one
            for acc, g in zip(total, grads, strict=True):
                acc += g
        return [g / len(self.x) for g in total]


@contextlib.contextmanager
def displaced(params: list[nn.Parameter], direction: list[torch.Tensor]):
    """Yields ``move(t)``, which sets the weights to w + t d; w is put back exactly after."""
    weights = [p.detach().clone() for p in params]

    def move(t: float) -> None:
        with torch.no_grad():
            for p, w, d in zip(params, weights, direction, strict=True):
                p.copy_(w + t * d)

    try:
        yield move
    finally:
        with torch.no_grad():
            for p, w in zip(params, weights, strict=True):
                p.copy_(w)


# --- the fit --------------------------------------------------------------------------------

def fit_line(losses_at: Callable[[float], np.ndarray],
             steps: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Per-batch (slope a_b, curvature c_b) of the least-squares fit of losses_at(t) -
    losses_at(0) = a t + c t^2 / 2 over ``steps``; ``losses_at`` gives each batch's value.

    >>> a, c = fit_line(lambda t: np.array([1 - 3 * t + 2 * t * t]), [-1.0, 1.0, 2.0])
    >>> round(float(a[0]), 12), round(float(c[0]), 12)
    (-3.0, 4.0)
    """
    t = np.asarray(steps, dtype=np.float64)
    design = np.stack([t, t * t / 2], axis=1)  # (k, 2)
    base = losses_at(0.0)
    rises = np.stack([losses_at(float(tj)) - base for tj in t])  # (k, batches)
    coef = np.linalg.lstsq(design, rises, rcond=None)[0]  # (2, batches)
    return coef[0], coef[1]


def critical_metrics(slopes: np.ndarray, curvatures: np.ndarray, counts: np.ndarray,
                     direction_sq: float, lr: float) -> dict[str, float]:
    """The keys from per-batch fitted sums a_b, c_b over ``counts`` inputs each, ||d||^2 and
    eta (module docstring)."""
    descent, curvature = -float(slopes.sum()), float(curvatures.sum())
    out = dict.fromkeys(KEYS, math.nan)
    out[UPDATE_CURVATURE] = curvature / float(counts.sum()) / direction_sq
    if not descent > 0:
        log.warning("flat/critical_sharpness not measured: the update direction does not "
                    "descend the measured loss (slope %.3g >= 0)", -descent / counts.sum())
        return out
    sharpness, se = ratio_mean_se(curvatures, -slopes)
    out[CRITICAL_SHARPNESS], out[se_key(CRITICAL_SHARPNESS)] = sharpness, se
    out[CRITICAL_SHARPNESS_X_LR] = sharpness * lr
    if sharpness > 0:
        out[CRITICAL_STEP] = 2 / sharpness
    else:
        log.warning("flat/critical_step not measured: the fitted loss does not rise along the "
                    "update (curvature %.3g <= 0)", curvature / counts.sum())
    return out


def _learning_rate(cfg: CriticalConfig, saved: SavedOptimizer | None) -> float:
    if cfg.lr is not None:
        return cfg.lr
    return saved.lr if saved is not None else PAPER_LR


def measure_critical(model: nn.Module, source: Source, tokens, lengths, cfg: CriticalConfig,
                     exclude: tuple[str, ...], device, checkpoint_dir) -> dict[str, float]:
    """The ``flat/critical_*`` metrics of ``model`` along its optimizer's next update (the state
    saved in ``checkpoint_dir``; without one, along -g)."""
    params = list(selected_parameters(model, exclude).values())
    saved, why = saved_optimizer(checkpoint_dir, model, params)
    if saved is None:
        log.info("flat/critical_sharpness along -g: %s", why)
    n = min(cfg.n_inputs, len(tokens))
    x = masked_inputs(tokens, lengths, cfg.seed, n=n)
    q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
    line = LineLoss(model, x, q, cfg.batch_size, device)
    lr = _learning_rate(cfg, saved)
    with eval_mode(model), eager_attention(model):
        d = update_direction(saved, line.gradient(params), params,
                             weight_decay=cfg.weight_decay)
        with displaced(params, d) as move:
            def losses_at(t: float) -> np.ndarray:
                move(t)
                return line.batch_sums()

            slopes, curvatures = fit_line(losses_at, [m * cfg.step_scale * lr
                                                      for m in cfg.multiples])
    direction_sq = float(sum(di.double().square().sum() for di in d))
    return critical_metrics(slopes, curvatures, line.counts(), direction_sq, lr)
