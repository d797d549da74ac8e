"""Flatness of a pre-trained masked LM on a synthetic source: Tr(F), Tr(H) and their gap.

``measure_flatness`` gives the ``flat/*`` metrics of ``flatlm.measure`` on one set of masked
inputs x_{-t} (the first ``cfg.n_inputs`` sentences given, one uniformly random word masked each):

- ``flat/trace_fisher``: Tr(F), the paper's B.1 quantity, from per-example squared gradient norms
  of one batched backward (``measure.fisher``);
- ``flat/trace_hessian``: Tr of the Hessian of the population loss, whose labels are the source's
  true conditionals Pr(. | x_{-t}), by Hutchinson (``measure.hessian_trace``);
- ``flat/hessian_fisher_gap``: Tr(H) - Tr(F), estimated directly (Hutchinson on the residual
  sum_k (p_k - q_k) grad^2 z_k), so its noise shrinks as the KL does;
- ``flat/trace_hessian_data`` (``data_labels=True``): the Hessian with one-hot data labels, which
  the paper's released code and PyHessian measure.

Every value comes with its standard error (``<key>_se``, ``curvature.grouped_mean_se``). Which
parameters count is ``cfg.exclude`` (default: the paper's, without the pooler and the MLM output
bias).

>>> import torch
>>> from flatlm.models import build_model, parse_model
>>> from flatlm.sources import load
>>> src = load("dyck:4")
>>> model = build_model(parse_model("d16-h2-l1-i32"), src.V, src.max_length, seed=0)
>>> tokens, lengths = src.sample(64, seed=0)
>>> cfg = FlatnessConfig(n_inputs=64, batch_size=32, hutchinson_batch_size=16)
>>> out = measure_flatness(model, src, tokens, lengths, cfg)
>>> sorted(out)  # doctest: +NORMALIZE_WHITESPACE
['flat/hessian_fisher_gap', 'flat/hessian_fisher_gap_se', 'flat/trace_fisher',
 'flat/trace_fisher_se', 'flat/trace_hessian', 'flat/trace_hessian_se']
"""

from __future__ import annotations

import torch
from torch import nn

from flatlm.measure import (
    HESSIAN_FISHER_GAP,
    TRACE_FISHER,
    TRACE_HESSIAN,
    TRACE_HESSIAN_DATA,
    se_key,
)
from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs, model_device_dtype
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.hessian_trace import trace_hessian
from flatlm.sources.base import Source

__all__ = ["FlatnessConfig", "data_hessian", "measure_flatness", "soft_labels", "trace_fisher",
           "trace_hessian"]


def soft_labels(
    source: Source, tokens: torch.Tensor, lengths: torch.Tensor, positions: torch.Tensor,
    *, batch_size: int = 1024, device: str | torch.device | None = None,
) -> torch.Tensor:
    """(n, V) float64 on the CPU: the true conditional Pr(x_t = . | x_{-t}) at each sentence's
    position, computed on ``device`` in chunks of ``batch_size`` sentences."""
    out = []
    for i in range(0, len(tokens), batch_size):
        probs = source.conditionals(tokens[i : i + batch_size], lengths[i : i + batch_size],
                                    dtype=torch.float64, device=device)  # (b, T, V)
        pos = positions[i : i + batch_size].to(probs.device)
        out.append(probs[torch.arange(len(pos), device=probs.device), pos].cpu())
    return torch.cat(out) if out else torch.zeros(0, source.V, dtype=torch.float64)


def measure_flatness(
    model: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: FlatnessConfig,
    device: str | torch.device | None = None,
    *,
    data_labels: bool = False,
    labels: torch.Tensor | None = None,
) -> dict[str, float]:
    """The ``flat/*`` metrics (and their ``_se``) of ``model`` on sentences from ``source``.

    ``device``: where to compute (default: the model's; the model must already be there).
    ``data_labels`` adds ``flat/trace_hessian_data`` (one more Hutchinson pass). ``labels``:
    ``soft_labels`` at these masked inputs, if computed already (``measure.truth_cache``: once a
    trial); None computes them.
    """
    device = device or model_device_dtype(model)[0]
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs)
    n = len(x)
    fisher = trace_fisher(model, tokens, lengths, cfg, device=device)
    q = labels if labels is not None else soft_labels(source, tokens[:n], lengths[:n],
                                                       x.positions, device=device)
    hessian = trace_hessian(model, tokens, lengths, cfg, soft_labels=q, positions=x.positions,
                            device=device, with_gap=True)
    out = {
        TRACE_FISHER: fisher["mean"], se_key(TRACE_FISHER): fisher["se"],
        TRACE_HESSIAN: hessian["mean"], se_key(TRACE_HESSIAN): hessian["se"],
        HESSIAN_FISHER_GAP: hessian["gap_mean"], se_key(HESSIAN_FISHER_GAP): hessian["gap_se"],
    }
    if data_labels:
        out.update(data_hessian(model, tokens, lengths, cfg, device))
    return out


def data_hessian(model: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor,
                 cfg: FlatnessConfig, device: str | torch.device | None = None) -> dict:
    """``flat/trace_hessian_data`` and its ``_se``: the Hessian of the loss with one-hot data
    labels (the only Hessian a source without a truth, real text, has), on the masked inputs
    ``measure_flatness`` uses."""
    device = device or model_device_dtype(model)[0]
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs)
    data = trace_hessian(model, tokens, lengths, cfg, positions=x.positions, device=device)
    return {TRACE_HESSIAN_DATA: data["mean"], se_key(TRACE_HESSIAN_DATA): data["se"]}
