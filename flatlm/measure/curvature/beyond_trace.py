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

from torch import nn

from flatlm.measure.curvature.blocks import block_metrics, block_traces
from flatlm.measure.curvature.common import masked_inputs, selected_parameters
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.curvature.hvp import CurvatureOperator
from flatlm.measure.curvature.spectrum import (
    SpectrumConfig,
    eigen_metrics,
    slq,
    slq_metrics,
    write_density,
)
from flatlm.measure.landscape.sharpness import measure_sharpness
from flatlm.sources.base import Source


def measure_beyond_trace(model: nn.Module, source: Source, data, cfg,
                         device, artifact_dir: str | Path | None = None) -> dict[str, float]:
    """The metrics of the measurements in ``cfg.what`` (any of eigen, density, blocks,
    sharpness; other names are not this function's), on ``data.tokens`` / ``data.lengths``
    (a ``measure.run.EvalData``) under ``cfg`` (a ``MeasureConfig``: its flatness, spectrum
    and sharpness settings)."""
    what, tokens, lengths, flatness = set(cfg.what), data.tokens, data.lengths, cfg.flatness
    out: dict[str, float] = {}
    if {"eigen", "density"} & what:
        out.update(_spectrum(model, source, data, cfg, device, artifact_dir))
    if "blocks" in what:
        x = masked_inputs(tokens, lengths, flatness.seed, n=flatness.n_inputs)
        n = len(x)
        q = soft_labels(source, tokens[:n], lengths[:n], x.positions, device=device)
        out.update(block_metrics(block_traces(model, tokens, lengths, flatness, q,
                                              device=device)))
    if "sharpness" in what:
        out.update(measure_sharpness(model, source, tokens, lengths, cfg.sharpness,
                                     flatness.exclude, device))
    return out


def _spectrum(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    spectrum: SpectrumConfig = cfg.spectrum
    n = min(spectrum.n_inputs, len(data.tokens))
    x = masked_inputs(data.tokens, data.lengths, spectrum.seed, n=n)
    q = soft_labels(source, data.tokens[:n], data.lengths[:n], x.positions, device=device)
    params = list(selected_parameters(model, cfg.flatness.exclude).values())
    hessian = CurvatureOperator(model, params, x, q, spectrum.batch_size, device)
    out = {}
    if "eigen" in cfg.what:
        fisher = CurvatureOperator(model, params, x, None, spectrum.batch_size, device,
                                   fisher=True)
        out.update(eigen_metrics(hessian, fisher, spectrum))
    if "density" in cfg.what:
        sketch = slq(hessian, min(spectrum.slq_probes, n), spectrum.slq_steps, spectrum.seed + 4)
        out.update(slq_metrics(sketch))
        if artifact_dir is not None:
            write_density(sketch, spectrum, Path(artifact_dir), {"n_inputs": n})
    return out
