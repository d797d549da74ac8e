"""The curvature measurements beyond the trace, as one metrics dict for ``measure.run``:

- ``eigen``: flat/top_eig_hessian, flat/top_eig_fisher (``measure.spectrum``);
- ``density``: flat/slq_trace_hessian, flat/slq_negative_trace, and the spectral density written
  to ``artifact_dir`` (the checkpoint's directory) as ``spectral_density.json`` / ``.png``;
- ``blocks``: flat/blocks/<block>/trace_hessian (``measure.blocks``; on flatness's inputs);
- ``sharpness``: flat/sharpness_worst_<p>, flat/sharpness_avg (``measure.sharpness``).

All are of the population loss (labels = the source's true conditionals) over the parameters
``FlatnessConfig.exclude`` keeps, each with its ``_se``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from flatlm.measure.curvature.blocks import block_metrics, block_traces
from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hvp import CurvatureOperator
from flatlm.measure.curvature.spectrum import (
    SpectrumConfig,
    eigen_metrics,
    slq,
    slq_metrics,
    write_density,
)
from flatlm.measure.landscape.sharpness import SharpnessConfig, measure_sharpness
from flatlm.sources.base import Source


def measure_beyond_trace(model: nn.Module, source: Source, tokens: torch.Tensor,
                         lengths: torch.Tensor, what, device, *, flatness: FlatnessConfig,
                         spectrum: SpectrumConfig, sharpness: SharpnessConfig,
                         artifact_dir: str | Path | None = None) -> dict[str, float]:
    """The metrics of the measurements in ``what`` (any of eigen, density, blocks, sharpness;
    other names are not this function's)."""
    out: dict[str, float] = {}
    if {"eigen", "density"} & set(what):
        out.update(_spectrum(model, source, tokens, lengths, what, device, flatness, spectrum,
                             artifact_dir))
    if "blocks" in what:
        x = masked_inputs(tokens, lengths, flatness.seed, n=flatness.n_inputs)
        n = len(x)
        q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
        out.update(block_metrics(block_traces(model, tokens, lengths, flatness, q,
                                              device=device)))
    if "sharpness" in what:
        out.update(measure_sharpness(model, source, tokens, lengths, sharpness,
                                     flatness.exclude, device))
    return out


def _spectrum(model, source, tokens, lengths, what, device, flatness: FlatnessConfig,
              cfg: SpectrumConfig, artifact_dir) -> dict[str, float]:
    n = min(cfg.n_inputs, len(tokens))
    x = masked_inputs(tokens, lengths, cfg.seed, n=n)
    q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
    params = list(selected_parameters(model, flatness.exclude).values())
    hessian = CurvatureOperator(model, params, x, q, cfg.batch_size, device)
    out = {}
    if "eigen" in what:
        fisher = CurvatureOperator(model, params, x, None, cfg.batch_size, device, fisher=True)
        out.update(eigen_metrics(hessian, fisher, cfg))
    if "density" in what:
        sketch = slq(hessian, min(cfg.slq_probes, n), cfg.slq_steps, cfg.seed + 4)
        out.update(slq_metrics(sketch))
        if artifact_dir is not None:
            write_density(sketch, cfg, Path(artifact_dir), {"n_inputs": n})
    return out
