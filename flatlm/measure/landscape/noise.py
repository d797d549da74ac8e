r"""Sensitivity to weight noise (after Springer et al., *Overtrained Language Models Are Harder to
Fine-Tune*, 2025): how much the population MLM loss rises when Gaussian noise is added to the
weights.

Convention (per-tensor relative Gaussian noise): every selected parameter tensor W gets

.. math::
    W \leftarrow W + s \, \frac{\|W\|_F}{\sqrt{numel(W)}} \, Z, \qquad Z \sim N(0, I),

the noise's standard deviation a fraction s of the tensor's RMS, taken at the unperturbed
weights; tensors are perturbed independently. Springer et al. scale their noise differently (to
the parameters' initialisation, as we read them); the relative scale used here makes the value
invariant to rescaling a tensor, and is the scale ``flat/sharpness_avg`` would use per tensor
rather than per weight. For each s of ``NoiseConfig.scales``,

.. math::
    noise/loss\_delta\_s = E_Z\, L(w + \delta_s(Z)) - L(w),

L the per-token population loss ``pretrain/loss`` (cross-entropy against the true conditionals:
its rise is the rise of KL to the truth; the one-hot validation loss on a source without a truth)
on the first ``n_inputs`` validation sentences, computed by ``measure.loss`` with the trial's
``measure.loss`` settings. The mean is over ``draws`` draws of Z; the draws are shared by the
scales (common random numbers: the curve over s is smoother than its points' errors), seeded by
``NoiseConfig.seed`` and the draw's index. The s.e. is that over draws, given the sentences: the
sentences' own sampling error is not in it (they are the same for every checkpoint of a trial).
For a loss that is quadratic in the weights the expectation is s^2 / 2 tr(H Sigma), Sigma the
diagonal of the per-tensor variances RMS(W)^2 (tests/measure/test_noise_cka_barrier.py).

Not measured: the probe's change under noise (a probe trained per draw and scale: the cost of
``draws * len(scales)`` probes per checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flatlm.core.seeds import derive_seed
from flatlm.core.stats import mean_se
from flatlm.measure import se_key
from flatlm.measure.curvature.common import FlatnessConfig, selected_parameters
from flatlm.measure.loss import pair_truth, per_token_loss
from flatlm.measure.timing import timer

# the parameters flatness counts (FlatnessConfig.exclude), so the measures compare on one set
DEFAULT_EXCLUDE = FlatnessConfig.__dataclass_fields__["exclude"].default


def noise_key(scale: float) -> str:
    """``noise/loss_delta_<s>``, s written by ``format(s, "g")`` (stable: 0.03 -> "0.03").

    >>> noise_key(0.03), noise_key(1e-5)
    ('noise/loss_delta_0.03', 'noise/loss_delta_1e-05')
    """
    return f"noise/loss_delta_{scale:g}"


@dataclass(frozen=True, kw_only=True)
class NoiseConfig:
    """Scales, draws and inputs of the weight-noise sensitivity (``measure.noise``)."""

    scales: tuple[float, ...] = (0.01, 0.03, 0.1)  # noise sd / the tensor's RMS; each > 0
    draws: int = 8  # noise draws per scale (shared by the scales); >= 2 for an s.e.
    n_inputs: int | None = None  # the first n validation sentences; None = all (measure.n_eval)
    # fnmatch patterns of parameters left unperturbed; default: those flatness leaves out
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    seed: int = 0  # seeds the draws

    def __post_init__(self):
        scales = self.scales
        if isinstance(scales, (str, int, float)) or not scales or not all(
                isinstance(s, (int, float)) and math.isfinite(s) and s > 0 for s in scales):
            raise ValueError(f"noise.scales={scales!r}: use a list of numbers > 0, e.g. "
                             "[0.01, 0.03, 0.1]")
        if len({noise_key(s) for s in scales}) < len(scales):
            raise ValueError(f"noise.scales={list(scales)}: name each scale once (their keys, "
                             f"{[noise_key(s) for s in scales]}, must differ)")
        if self.draws < 2:
            raise ValueError(f"noise.draws={self.draws}: use an integer >= 2 (the s.e. is over "
                             "draws)")
        if self.n_inputs is not None and self.n_inputs < 1:
            raise ValueError(f"noise.n_inputs={self.n_inputs}: use an integer >= 1, or None for "
                             "every validation sentence")
        if isinstance(self.exclude, str):
            raise ValueError("noise.exclude must be a list of patterns, not one string")


def _rms(w: torch.Tensor) -> torch.Tensor:
    """||W||_F / sqrt(numel), computed in float64, as a scalar of W's dtype."""
    return (w.double().norm() / math.sqrt(w.numel())).to(w.dtype)


def noise_deltas(loss: Callable[[], float], params: list[nn.Parameter], scales, draws: int,
                 seed: int) -> dict[float, np.ndarray]:
    """scale -> [draws] values loss(w + s RMS(W) Z_d) - loss(w) (module docstring); the draw
    Z_d from ``derive_seed(seed, "noise", d)`` on the parameters' device, one tensor after the
    other. The parameters are put back bit for bit, also when ``loss`` raises."""
    if not params:
        raise ValueError("noise: no parameter to perturb; noise.exclude leaves every parameter "
                         "out: narrow its patterns")
    w = [p.detach().clone() for p in params]
    rms = [_rms(x) for x in w]
    out = {s: np.empty(draws) for s in scales}
    try:
        with torch.no_grad():
            base = loss()
            for d in range(draws):
                g = torch.Generator(device=w[0].device).manual_seed(derive_seed(seed, "noise", d))
                z = [torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype) for x in w]
                for s in scales:
                    for p, x, r, zi in zip(params, w, rms, z, strict=True):
                        p.copy_(x + (s * r) * zi)
                    out[s][d] = loss() - base
    finally:
        with torch.no_grad():
            for p, x in zip(params, w, strict=True):
                p.copy_(x)
    return out


def weight_noise(model: nn.Module, source, tokens, lengths, cfg: NoiseConfig, loss_cfg,
                 device) -> dict[str, float]:
    """``noise/loss_delta_<s>`` and its ``_se`` for every scale of ``cfg`` (module docstring),
    on the first ``cfg.n_inputs`` of the sentences; the model is put back bit for bit."""
    n = len(tokens) if cfg.n_inputs is None else min(cfg.n_inputs, len(tokens))
    tokens, lengths = tokens[:n], lengths[:n]
    # the truth does not change with the weights: inferred once, not once per draw
    truth = pair_truth(source, tokens, lengths, loss_cfg, device=device) \
        if source.has_truth else None
    params = list(selected_parameters(model, cfg.exclude).values())
    deltas = noise_deltas(
        lambda: per_token_loss(model, source, tokens, lengths, loss_cfg, device=device,
                               truth=truth),
        params, cfg.scales, cfg.draws, cfg.seed)
    out = {}
    for s, values in deltas.items():
        out[noise_key(s)], out[se_key(noise_key(s))] = mean_se(torch.from_numpy(values))
    return out


def run_noise(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """The registered measurement ``noise`` (``measure.registry``) on the trial's validation
    sentences (``EvalData.tokens``), with ``cfg.noise`` and the trial's ``cfg.loss``."""
    out = {}
    with timer(out, "noise"):
        out.update(weight_noise(model, source, data.tokens, data.lengths, cfg.noise, cfg.loss,
                                device))
    return out
