r"""Adaptive sharpness, worst-case and average (Andriushchenko, Croce, Mueller, Hein, Flammarion,
*A Modern Look at the Relationship between Sharpness and Generalization*, ICML 2023, section 2;
after Kwon et al., ASAM, ICML 2021):

.. math::
    S^\rho_{max}(w, c) = E_{S \sim P_m} \max_{\|\delta \odot c^{-1}\|_p \le \rho}
                         L_S(w + \delta) - L_S(w), \qquad
    S^\rho_{avg}(w, c) = E_{S \sim P_m, \delta \sim N(0, \rho^2 diag(c^2))}
                         L_S(w + \delta) - L_S(w)

with c = |w| elementwise ("adaptive": invariant to rescaling a layer's weights by a positive
factor that the network undoes), S a batch of m = ``batch_size`` inputs, p = inf or 2. Here L_S is
the mean over the batch's masked inputs of the loss against the true conditionals (the population
loss whose Hessian ``flat/trace_hessian`` traces), over the parameters ``FlatnessConfig.exclude``
keeps.

Worst case: plain projected gradient ascent (not the paper's Auto-PGD) in u = delta / c for
``steps`` steps of size ``step_size * rho``: l_inf: u <- clip(u + eta sign(grad_u), -rho, rho) from
u ~ U[-rho, rho]^P; l_2: u <- Proj_{||u|| <= rho}(u + eta grad_u / ||grad_u||) from a uniformly
random point of the sphere ||u|| = rho (at a minimum the gradient at u = 0 is zero). The value is
the largest increase over the iterates: a lower bound on the inner maximum. It reaches the
maximum of a linear loss (l_inf: a corner within a few steps; l_2: geometrically) and of a
quadratic at its minimum with l_2 (ascent there is a power iteration: rho^2 / 2 lambda_max(C H C),
C = diag(c)) or with l_inf and diagonal H >= 0 (tests/measure/test_sharpness.py). Average case:
``samples`` Gaussian draws per batch. Both: per-batch values, batches i.i.d., the plain s.e. The
default radii are not the paper's (which vary by setting): choose them per study; they are logged
with the trial's params.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.measure import SHARPNESS_AVG, se_key, sharpness_worst_key
from flatlm.measure.curvature.common import (
    eval_mode,
    grouped_mean_se,
    masked_inputs,
    selected_parameters,
)
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hessian_trace import second_order_logits
from flatlm.sources.base import Source

NORMS = ("linf", "l2")


@dataclass(frozen=True, kw_only=True)
class SharpnessConfig:
    """Radii and budget of adaptive sharpness (``measure.sharpness``)."""

    norms: tuple[str, ...] = NORMS  # worst case in these norms, from NORMS
    rho_linf: float = 0.002  # radius of the l_inf worst case (relative change per weight)
    rho_l2: float = 0.1  # radius of the l_2 worst case, in ||delta / |w| ||_2
    rho_avg: float = 0.01  # sd of the average case's relative Gaussian noise
    steps: int = 20  # projected gradient ascent steps (worst case)
    step_size: float = 0.5  # ascent step, as a fraction of rho
    samples: int = 8  # Gaussian draws per batch (average case)
    n_inputs: int = 512  # masked inputs, the first n validation sentences
    batch_size: int = 64  # m: the inputs of one L_S (part of the definition)
    seed: int = 0

    def __post_init__(self):
        if isinstance(self.norms, str) or set(self.norms) - set(NORMS):
            raise ValueError(f"sharpness.norms={self.norms!r}: use a list from {NORMS}")
        for name in ("rho_linf", "rho_l2", "rho_avg", "step_size"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sharpness.{name}={getattr(self, name)}: use a number > 0")
        for name in ("steps", "samples", "n_inputs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"sharpness.{name}={getattr(self, name)}: use an integer >= 1")

    def rho(self, norm: str) -> float:
        return {"linf": self.rho_linf, "l2": self.rho_l2}[norm]


class Perturbed:
    """Sets ``params`` to w + c * u for a list u (c = |w| at entry); puts w back exactly."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params
        self.w = [p.detach().clone() for p in params]
        self.c = [w.abs() for w in self.w]

    def __call__(self, u: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, w, c, ui in zip(self.params, self.w, self.c, u, strict=True):
                p.copy_(w + c * ui)

    def restore(self) -> None:
        with torch.no_grad():
            for p, w in zip(self.params, self.w, strict=True):
                p.copy_(w)


def _norm(u: list[torch.Tensor]) -> torch.Tensor:
    return torch.sqrt(sum(x.double().square().sum() for x in u))


def _start(params, norm: str, rho: float, g: torch.Generator) -> list[torch.Tensor]:
    if norm == "linf":
        return [(torch.rand(p.shape, generator=g, device=p.device, dtype=p.dtype) * 2 - 1) * rho
                for p in params]
    u = [torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype) for p in params]
    scale = rho / _norm(u)
    return [x * scale.to(x.dtype) for x in u]


def _ascent(u, grads, norm: str, rho: float, eta: float) -> list[torch.Tensor]:
    if norm == "linf":
        return [(x + eta * gr.sign()).clamp(-rho, rho) for x, gr in zip(u, grads, strict=True)]
    step = eta / _norm(grads).clamp_min(1e-300)
    u = [x + gr * step.to(x.dtype) for x, gr in zip(u, grads, strict=True)]
    shrink = (rho / _norm(u)).clamp(max=1.0)
    return [x * shrink.to(x.dtype) for x in u]


def worst_case_increase(loss: Callable[[], torch.Tensor], params: list[nn.Parameter],
                        norm: str, rho: float, steps: int, step_size: float,
                        g: torch.Generator) -> float:
    """max over ``steps`` PGD iterates of loss(w + c u) - loss(w), ||u||_p <= rho; w restored."""
    pert = Perturbed(params)
    try:
        with torch.no_grad():
            base = float(loss())
        u, best = _start(params, norm, rho, g), -float("inf")
        for _ in range(steps + 1):
            pert(u)
            value = loss()
            best = max(best, float(value.detach()))
            grads = torch.autograd.grad(value, params)
            grads = [gr * c for gr, c in zip(grads, pert.c, strict=True)]  # d/du = c * d/dw
            u = _ascent(u, grads, norm, rho, step_size * rho)
    finally:
        pert.restore()
    return best - base


def average_increase(loss: Callable[[], torch.Tensor], params: list[nn.Parameter], rho: float,
                     samples: int, g: torch.Generator) -> float:
    """mean over ``samples`` draws u ~ N(0, rho^2 I) of loss(w + c u) - loss(w); w restored."""
    pert = Perturbed(params)
    total = 0.0
    try:
        with torch.no_grad():
            base = float(loss())
            for _ in range(samples):
                pert([rho * torch.randn(p.shape, generator=g, device=p.device, dtype=p.dtype)
                      for p in params])
                total += float(loss()) - base
    finally:
        pert.restore()
    return total / samples


def adaptive_sharpness(losses: list[Callable[[], torch.Tensor]], params: list[nn.Parameter],
                       cfg: SharpnessConfig) -> dict[str, dict]:
    """"worst_<norm>" and "avg" -> ``{"mean", "se"}`` over the batch losses ``losses``."""
    g = torch.Generator(device=params[0].device).manual_seed(cfg.seed)
    values = {f"worst_{norm}": [worst_case_increase(loss, params, norm, cfg.rho(norm), cfg.steps,
                                                    cfg.step_size, g) for loss in losses]
              for norm in cfg.norms}
    values["avg"] = [average_increase(loss, params, cfg.rho_avg, cfg.samples, g)
                     for loss in losses]
    return {k: dict(zip(("mean", "se"), grouped_mean_se(v), strict=True))
            for k, v in values.items()}


def batch_losses(model: nn.Module, x, soft_labels: torch.Tensor, batch_size: int,
                 device) -> list[Callable[[], torch.Tensor]]:
    """One closure per batch of ``x``: the mean loss against ``soft_labels`` at the current
    parameters. The BiLSTM runs unrolled: cuDNN's LSTM has no backward in eval mode."""
    logits = second_order_logits(model)

    def make(a: int, b: int):
        batch, q = x.batch(a, b, device), soft_labels[a:b].to(device)

        def loss() -> torch.Tensor:
            z = logits(model, batch.input_ids, batch.attention_mask, batch.positions)
            return -(q.to(z.dtype) * z.log_softmax(-1)).sum(-1).mean()
        return loss

    return [make(a, min(a + batch_size, len(x))) for a in range(0, len(x), batch_size)]


def measure_sharpness(model: nn.Module, source: Source, tokens, lengths, cfg: SharpnessConfig,
                      exclude: tuple[str, ...], device) -> dict[str, float]:
    """The ``flat/sharpness_*`` metrics (+ ``_se``) on the first ``cfg.n_inputs`` sentences."""
    n = min(cfg.n_inputs, len(tokens))
    x = masked_inputs(tokens, lengths, cfg.seed, n=n)
    q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
    params = list(selected_parameters(model, exclude).values())
    losses = batch_losses(model, x, q, cfg.batch_size, device)
    with eval_mode(model):
        result = adaptive_sharpness(losses, params, cfg)
    out = {}
    for name, est in result.items():
        key = SHARPNESS_AVG if name == "avg" else sharpness_worst_key(name.split("_", 1)[1])
        out[key], out[se_key(key)] = est["mean"], est["se"]
    return out

