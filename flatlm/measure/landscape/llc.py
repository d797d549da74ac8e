r"""The local learning coefficient (LLC) of a checkpoint, estimated by SGLD (Lau, Furman, Wang,
Murfet, Wei, *Quantifying degeneracy in singular models via the learning coefficient*, 2023/2024;
Hoogland et al. 2025; the ``devinterp`` library):

.. math::
    \hat\lambda(w^*) = n\beta \, (E_w[L_n(w)] - L_n(w^*)), \qquad
    p(w) \propto \exp(-n\beta L_n(w) - \tfrac{\gamma}{2} \|w - w^*\|^2)

with beta = 1 / log n by default (Watanabe's WBIC temperature), w* the checkpoint's parameters and
the expectation over SGLD draws from the localised tempered posterior p:

.. math::
    w \leftarrow w - \tfrac{\epsilon}{2} (n\beta \nabla L_b(w) + \gamma (w - w^*)) + N(0, \epsilon)

where L_b is the mean loss of one batch b of the n inputs, drawn with probability |b| / n at
every step (so E_b[L_b] = L_n and E_b[grad L_b] = grad L_n exactly, whatever the batch sizes).
As in any SGLD, the batch gradients' noise and the finite step make the chain's law differ from
p by O(eps): a step small enough that halving it leaves the estimate within its s.e. is part of
the calibration.

L_n is the population loss on the masked inputs x_{-t} of the first ``n_inputs`` validation
sentences (one uniformly random word masked each, ``curvature.masked_inputs``): the mean over
inputs of the cross-entropy against the source's true conditionals Pr(. | x_{-t})
(``flatness.soft_labels``), the loss whose Hessian ``flat/trace_hessian`` traces and which
adaptive sharpness perturbs. The true conditionals, not the one-hot data words: L(w*) is then the
population loss at w* itself, not a noisy sample of it, so the draws' increase is the posterior's
and not the label noise's; the measurement needs the source's truth.

Each draw's increase is taken on its own batch, L_b(w_t) - L_b(w*), with L_b(w*) computed once
per batch: its expectation is E[L_n(w)] - L_n(w*), and the w*-term cancels the batch-to-batch
spread of the loss. The parameters sampled are those flatness counts (``FlatnessConfig.exclude``);
the others stay at w*. Every chain is seeded by ``derive_seed(seed, "llc", chain)``.

The core (``sgld_chains``, ``llc_metrics``) samples any loss closure ``loss(w, b)`` over a flat
parameter vector, which is how ``tests/measure/test_llc.py`` checks it against closed forms: a
quadratic loss (the SGLD chain's exact stationary expectation), a minimally singular one
(rank / 2) and (w1 w2)^2 (lambda = 1/2 < d/2 = 1).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.core.seeds import derive_seed
from flatlm.measure import (
    LLC,
    LLC_CHAIN_MEAN_STD,
    LLC_DISTANCE,
    LLC_DIVERGED,
    LLC_INIT_LOSS,
    LLC_LOSS_BELOW_INIT_FRAC,
    LLC_N_BETA,
    se_key,
)
from flatlm.measure.curvature.common import eval_mode, masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hessian_trace import second_order_logits
from flatlm.sources.base import Source

log = logging.getLogger(__name__)

# loss(w, b): batch b's mean loss at the flat parameter vector w, differentiable in w
LossClosure = Callable[[torch.Tensor, int], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class LLCConfig:
    """SGLD's calibration and budget for the LLC (``measure.llc``); all of it is logged with the
    trial's params. The estimate depends on gamma (the neighbourhood) and, through the
    discretisation, on the step: calibrate both per study, by the diagnostics (the chains' means
    agreeing, the same estimate at half the step and at four times the draws, few draws below
    w*'s loss, no divergence).

    The defaults are cheap on the CPU scales: 4 chains x (20 + 100) steps, devinterp's usual
    budget; n = 512 inputs in batches of 64 take 0.8 s (2.8k parameters) and 1.5 s (14.8k) per
    checkpoint on one CPU thread. devinterp's usual gamma = 100 does not settle in 120 steps: the
    chain's spread in the weakly curved directions grows for ~1 / (eps gamma) steps. Measured
    (n = 512, the estimate +- its s.e.) on a d16-h1-l1-i32 after 1000 steps on a 6-word PCFG (KL
    0.019 nats): eps = 1e-4, gamma = 100 gave 5.5 +- 0.7 at 100 draws and 6.8 +- 0.5 at 400; with
    gamma = 1000 (eps gamma = 0.1) 1.95 +- 0.13 at 100 draws, 1.94 +- 0.10 at 400, 1.82 +- 0.15
    at eps = 5e-5, while eps = 2e-4 and 4e-4 drift up (2.15 +- 0.10, 2.60 +- 0.07: the
    discretisation's bias). On the sweep scale's d32-h2-l1-i128 after 1500 steps (KL 0.032) at
    gamma = 1000: 0.91 +- 0.20 (eps = 1e-4), 0.87 +- 0.25 (5e-5), 0.95 +- 0.14 (2e-4), 1.00 +-
    0.09 (1e-4, 400 draws); at gamma = 100, 4.8 +- 0.7. Hence eps = 1e-4, gamma = 1000. On the
    testbed's d64-h4-l2-i256 (113k parameters) after 10000 steps (KL 0.014; ``flatlm measure
    CKPT --what llc --set measure.llc.step_size=.. --set measure.llc.gamma=..``, n = 512):
    5.63 +- 0.13 (eps = 5e-5), 6.02 +- 0.08 (1e-4), 6.28 +- 0.06 (2e-4) at gamma = 1000, and
    32.4 +- 1.2 at gamma = 100 (chains 28 units from w* against 11): there the discretisation
    still adds ~0.3 per doubling of eps, so compare estimates made at one setting only."""

    chains: int = 4  # independent chains from w*; llc/mean_se is their spread / sqrt(chains)
    draws: int = 100  # draws per chain after the burn-in, one per SGLD step
    burn_in: int = 20  # steps per chain before the draws, discarded
    step_size: float = 1e-4  # epsilon: the drift is eps / 2 times the force, the noise N(0, eps)
    # localisation: the pull gamma (w - w*) that keeps the chain near w*; the neighbourhood's
    # radius per coordinate is ~1 / sqrt(gamma)
    gamma: float = 1000.0
    # n beta, the inverse temperature times n; None: n / log n (beta = 1 / log n, Lau et al.'s
    # and Watanabe's WBIC choice, n = the inputs sampled; devinterp defaults to the batch size
    # in place of n)
    n_beta: float | None = None
    n_inputs: int = 512  # n: masked inputs, the first n validation sentences (fewer if fewer)
    batch_size: int = 64  # inputs per SGLD gradient
    # a chain diverged when a loss or gradient is not finite, or when its estimate exceeds this
    # many times d/2 (d the parameters sampled): the learning coefficient of an analytic model
    # is at most d/2, so only a chain that ran off gives more. Then llc/mean is NaN.
    divergence_ratio: float = 2.0
    seed: int = 0  # the masked positions, the batches and the noise

    def __post_init__(self):
        for name in ("chains", "draws", "n_inputs", "batch_size"):
            _check(name, getattr(self, name), minimum=1, integer=True)
        _check("burn_in", self.burn_in, minimum=0, integer=True)
        for name in ("step_size", "gamma", "divergence_ratio"):
            _check(name, getattr(self, name))
        if self.n_beta is not None:
            _check("n_beta", self.n_beta)

    def resolved_n_beta(self, n: int) -> float:
        """n beta for ``n`` inputs: ``n_beta``, or n / log n."""
        if self.n_beta is not None:
            return float(self.n_beta)
        if n < 2:
            raise ValueError(f"measure.llc: n / log n needs n >= 2 inputs, got {n}; give "
                             "measure.llc.n_beta")
        return n / math.log(n)


def _check(name: str, value, *, minimum: float | None = None, integer: bool = False) -> None:
    if integer:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"measure.llc.{name}={value!r}: use an integer >= {minimum}")
    elif isinstance(value, bool) or not isinstance(value, int | float) or \
            not (math.isfinite(value) and value > 0):
        raise ValueError(f"measure.llc.{name}={value!r}: use a value > 0")


@dataclass(frozen=True)
class Chains:
    """What the SGLD chains drew."""

    increases: torch.Tensor  # (chains, draws) float64: L_b(w_t) - L_b(w*); NaN where not drawn
    distance: torch.Tensor  # (chains,) float64: ||w - w*|| at the chain's last step
    diverged: torch.Tensor  # (chains,) bool: a loss or gradient was not finite
    init_loss: float  # L_n(w*)


def batch_losses_at(loss: LossClosure, w_star: torch.Tensor, n_batches: int) -> list[float]:
    """Every batch's loss at w*."""
    with torch.no_grad():
        return [float(loss(w_star, b)) for b in range(n_batches)]


def sgld_chains(loss: LossClosure, w_star: torch.Tensor, n_beta: float, cfg: LLCConfig,
                weights: Sequence[float] = (1.0,)) -> Chains:
    """``cfg.chains`` SGLD chains from ``w_star`` on ``loss``; batch b is drawn with probability
    ``weights[b]`` (its share of the n inputs). A chain stops at its first non-finite loss or
    gradient (diverged)."""
    weights = torch.as_tensor(weights, dtype=torch.float64)
    w_star = w_star.detach()
    base = batch_losses_at(loss, w_star, len(weights))
    increases = torch.full((cfg.chains, cfg.draws), math.nan, dtype=torch.float64)
    distance = torch.full((cfg.chains,), math.nan, dtype=torch.float64)
    diverged = torch.zeros(cfg.chains, dtype=torch.bool)
    for chain in range(cfg.chains):
        g = torch.Generator(device=w_star.device).manual_seed(derive_seed(cfg.seed, "llc", chain))
        batches = torch.multinomial(weights, cfg.burn_in + cfg.draws, replacement=True,
                                    generator=torch.Generator().manual_seed(
                                        derive_seed(cfg.seed, "llc-batches", chain)))
        w, ok = _chain(loss, w_star, n_beta, cfg, batches.tolist(), base, increases[chain], g)
        diverged[chain] = not ok
        distance[chain] = float((w - w_star).double().norm())
    init = float(torch.tensor(base, dtype=torch.float64) @ (weights / weights.sum()))
    return Chains(increases, distance, diverged, init)


def _chain(loss: LossClosure, w_star: torch.Tensor, n_beta: float, cfg: LLCConfig,
           batches: list[int], base: list[float], out: torch.Tensor,
           g: torch.Generator) -> tuple[torch.Tensor, bool]:
    """One chain; writes its draws' increases into ``out``. (last w, not diverged)."""
    w, eps = w_star.clone(), cfg.step_size
    for step, b in enumerate(batches):
        w.requires_grad_(True)
        value = loss(w, b)
        (grad,) = torch.autograd.grad(value, w)
        value = float(value.detach())
        if not (math.isfinite(value) and bool(torch.isfinite(grad).all())):
            return w.detach(), False
        if step >= cfg.burn_in:
            out[step - cfg.burn_in] = value - base[b]
        with torch.no_grad():
            drift = n_beta * grad + cfg.gamma * (w - w_star)
            noise = torch.randn(w.shape, generator=g, device=w.device, dtype=w.dtype)
            w = w - (eps / 2) * drift + math.sqrt(eps) * noise
    return w.detach(), True


def llc_metrics(chains: Chains, n_beta: float, d: int, cfg: LLCConfig) -> dict[str, float]:
    """The ``llc/*`` metrics of the chains (``flatlm.measure``); llc/mean and its s.e. NaN, with
    a warning, when a chain diverged (``cfg.divergence_ratio``)."""
    per_chain = n_beta * chains.increases.mean(1)  # NaN for a chain that stopped early
    diverged = chains.diverged | ~torch.isfinite(per_chain) | \
        (per_chain > cfg.divergence_ratio * d / 2)
    drawn = chains.increases[torch.isfinite(chains.increases)]
    spread = float(per_chain.std()) if cfg.chains > 1 else math.nan
    out = {LLC: float(per_chain.mean()), se_key(LLC): spread / math.sqrt(cfg.chains),
           LLC_CHAIN_MEAN_STD: spread,
           LLC_LOSS_BELOW_INIT_FRAC: float((drawn < 0).double().mean()) if len(drawn) else
           math.nan,
           LLC_DISTANCE: float(chains.distance.mean()), LLC_DIVERGED: float(diverged.sum()),
           LLC_INIT_LOSS: chains.init_loss, LLC_N_BETA: n_beta}
    if diverged.any():
        log.warning("llc: %d of %d SGLD chains diverged (a non-finite loss, or an estimate above "
                    "%g d/2): llc/mean is NaN; lower measure.llc.step_size or raise "
                    "measure.llc.gamma", int(diverged.sum()), cfg.chains, cfg.divergence_ratio)
        out[LLC] = out[se_key(LLC)] = out[LLC_CHAIN_MEAN_STD] = math.nan
    return out


def estimate_llc(loss: LossClosure, w_star: torch.Tensor, n_beta: float, cfg: LLCConfig,
                 weights: Sequence[float] = (1.0,)) -> dict[str, float]:
    """The ``llc/*`` metrics of ``loss`` around ``w_star`` (``sgld_chains``, ``llc_metrics``)."""
    chains = sgld_chains(loss, w_star, n_beta, cfg, weights)
    return llc_metrics(chains, n_beta, w_star.numel(), cfg)


class _Logits(nn.Module):
    """The model's word logits as a module's forward, for ``torch.func.functional_call``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        # the unrolled BiLSTM: cuDNN's LSTM has no backward in eval mode
        self.logits = second_order_logits(model)

    def forward(self, input_ids, attention_mask, positions):
        return self.logits(self.model, input_ids, attention_mask, positions)


def model_loss(model: nn.Module, params: dict[str, nn.Parameter], x, q: torch.Tensor,
               batch_size: int, device) -> tuple[LossClosure, torch.Tensor, list[float]]:
    """(loss(w, b), w*, batch weights) of ``model`` over ``params`` flattened into one vector:
    batch b is inputs [b m, (b + 1) m) of ``x`` and its loss the mean cross-entropy against
    ``q``, the true conditionals; tied parameters follow their first name."""
    names, shapes = list(params), [p.shape for p in params.values()]
    sizes = [p.numel() for p in params.values()]
    w_star = torch.cat([p.detach().reshape(-1) for p in params.values()])
    logits = _Logits(model)
    starts = range(0, len(x), batch_size)
    batches = [(x.batch(a, a + batch_size, device), q[a : a + batch_size].to(device))
               for a in starts]

    def loss(w: torch.Tensor, b: int) -> torch.Tensor:
        batch, qb = batches[b]
        values = {f"model.{name}": v.view(shape) for name, v, shape in
                  zip(names, w.split(sizes), shapes, strict=True)}
        z = torch.func.functional_call(
            logits, values, (batch.input_ids, batch.attention_mask, batch.positions))
        return -(qb.to(z.dtype) * z.log_softmax(-1)).sum(-1).mean()

    weights = [len(qb) / len(x) for _, qb in batches]
    return loss, w_star, weights


def measure_llc(model: nn.Module, source: Source, tokens, lengths, cfg: LLCConfig,
                exclude: tuple[str, ...], device) -> dict[str, float]:
    """The ``llc/*`` metrics of ``model`` on the first ``cfg.n_inputs`` sentences, over the
    parameters ``exclude`` keeps; the model's parameters are not changed."""
    n = min(cfg.n_inputs, len(tokens))
    x = masked_inputs(tokens, lengths, cfg.seed, n=n)
    q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
    params = selected_parameters(model, exclude)
    loss, w_star, weights = model_loss(model, params, x, q, cfg.batch_size, device)
    with eval_mode(model):
        return estimate_llc(loss, w_star, cfg.resolved_n_beta(n), cfg, weights)
