r"""The Hessian's and the Fisher's spectrum beyond the trace: the top eigenvalue, and a spectral
density sketch by stochastic Lanczos quadrature (SLQ). Both act on ``hvp.CurvatureOperator``.

**Top eigenvalue** (``flat/top_eig_hessian``, ``flat/top_eig_fisher``): lambda_max of the mean
curvature over n masked inputs, the largest Ritz value of ``SpectrumConfig.lanczos_steps`` Lanczos
steps from a Rademacher start (``measure.lanczos``; it approaches lambda_max from below). Its
standard error is the delta method's: for a simple top eigenvalue with unit eigenvector u,
lambda_max(H_n) = u^T H_n u = mean over batches of u^T H_b u to first order in the sampling noise,
so the s.e. is that of the mean of the per-batch Rayleigh quotients u^T H_b u (batches of i.i.d.
inputs are i.i.d.; ``curvature.grouped_mean_se`` with the batch sizes). It ignores the O(1/n)
upward bias of lambda_max of a sample mean, and it understates when the top two eigenvalues are
close to each other relative to the noise (then u itself is unstable).

**Spectral density** (``density``): phi(t) = (1/P) sum_i delta(t - lambda_i) of the Hessian,
sketched by ``slq_probes`` Rademacher probes, each with ``slq_steps`` Lanczos steps (Ghorbani,
Krishnan and Xiao, ICML 2019): phi(t) ~ mean over probes of sum_j tau_j N(t; theta_j, sigma^2),
sigma = ``kernel_width`` times the span of the nodes. Probe l acts on its own disjoint share of
the inputs (n / probes each), so per-probe values are i.i.d. draws of data and probe together and
their spread is an honest standard error: the scalar summaries are ``flat/slq_trace_hessian``
= P sum_j tau_j theta_j per probe (= v^T H_l v, Hutchinson's estimate, exact in the quadrature:
it must agree with ``flat/trace_hessian`` within the standard errors) and
``flat/slq_negative_trace`` = P sum_j tau_j min(theta_j, 0), the quadrature's sum of the
negative eigenvalues (continuous in the nodes, unlike the fraction of mass below zero, which the
many nodes of the bulk near zero make a coin toss). The sketch is the spectrum of the Hessian
over n / probes inputs, which is broader than the population's. The density is written as
``spectral_density.json`` (grid, density, every probe's nodes and weights) and
``spectral_density.png`` (when matplotlib is installed: the ``sweep`` extra).
"""

from __future__ import annotations

import io
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from flatlm.core.safe_io import write_atomic
from flatlm.measure import (
    SLQ_NEGATIVE_TRACE,
    SLQ_TRACE_HESSIAN,
    TOP_EIG_FISHER,
    TOP_EIG_HESSIAN,
    se_key,
)
from flatlm.measure.curvature.common import grouped_mean_se
from flatlm.measure.curvature.hvp import CurvatureOperator
from flatlm.measure.curvature.lanczos import lanczos, quadrature, top_ritz_pair

log = logging.getLogger(__name__)

DENSITY_FILE = "spectral_density"  # .json and .png in the artifact directory


@dataclass(frozen=True, kw_only=True)
class SpectrumConfig:
    """Budget of the top eigenvalues and the spectral density (``measure.spectrum``)."""

    # masked inputs (the first n validation sentences, one word masked each); each Lanczos step
    # is one Hessian-vector product over all of them (forward + double backward)
    n_inputs: int = 512
    batch_size: int = 64  # inputs per product; also the unit of the eigenvalue's s.e.
    # Lanczos steps for the top eigenvalue (memory: this many parameter-sized vectors)
    lanczos_steps: int = 20
    slq_probes: int = 8  # spectral density: probes, each on n_inputs / slq_probes inputs
    slq_steps: int = 16  # Lanczos steps (quadrature nodes) per probe
    grid_points: int = 256  # the density's grid
    kernel_width: float = 0.01  # Gaussian kernel sd, as a fraction of the nodes' span
    seed: int = 0  # masked positions and start vectors

    def __post_init__(self):
        for name in ("n_inputs", "batch_size", "lanczos_steps", "slq_probes", "slq_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"spectrum.{name}={getattr(self, name)}: use an integer >= 1")
        if self.grid_points < 2:
            raise ValueError(f"spectrum.grid_points={self.grid_points}: use >= 2")
        if not self.kernel_width > 0:
            raise ValueError(f"spectrum.kernel_width={self.kernel_width}: use a number > 0")
        if self.slq_probes > self.n_inputs:
            raise ValueError(f"spectrum.slq_probes={self.slq_probes} > spectrum.n_inputs="
                             f"{self.n_inputs}: each probe needs its own inputs; lower the probes"
                             " or raise n_inputs")


def rademacher(n: int, dtype, device, g: torch.Generator) -> torch.Tensor:
    return (torch.randint(0, 2, (n,), generator=g, device=device) * 2 - 1).to(dtype)


def top_eigenvalue(op: CurvatureOperator, steps: int, seed: int) -> dict:
    """lambda_max of ``op`` (Lanczos) and its delta-method s.e. over batches:
    ``{"value", "se", "vector", "n_batches"}``."""
    g = torch.Generator(device=op.device).manual_seed(seed)
    with op.ready():
        start = rademacher(op.n_params, op.dtype, op.device, g)
        value, u = top_ritz_pair(lanczos(op.matvec, start, steps))
        values, counts = op.per_batch_quadratic(u)
    _, se = grouped_mean_se(values, counts=counts)
    return {"value": value, "se": se, "vector": u, "n_batches": len(counts)}


@dataclass
class Sketch:
    """Per probe: Gauss nodes and weights (k, m) float64, NaN-padded where a Krylov space closed
    early; the parameter count P."""

    nodes: torch.Tensor
    weights: torch.Tensor
    n_params: int

    def per_probe(self, f) -> torch.Tensor:
        """(k,) sum_j tau_j f(theta_j) per probe."""
        return torch.nan_to_num(self.weights * f(self.nodes)).sum(1)

    def density(self, grid_points: int, kernel_width: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(grid, phi): the Gaussian-smoothed density, mean over probes; integrates to ~1."""
        finite = self.nodes[~self.nodes.isnan()]
        lo, hi = float(finite.min()), float(finite.max())
        sigma = kernel_width * max(hi - lo, abs(hi), 1e-12)
        grid = torch.linspace(lo - 4 * sigma, hi + 4 * sigma, grid_points, dtype=torch.float64)
        z = (grid[:, None, None] - self.nodes) / sigma  # (G, k, m)
        kernel = torch.exp(-0.5 * z.square()) / (sigma * math.sqrt(2 * math.pi))
        return grid, torch.nan_to_num(kernel * self.weights).sum(-1).mean(-1)


def slq(op: CurvatureOperator, probes: int, steps: int, seed: int) -> Sketch:
    """Stochastic Lanczos quadrature: probe l runs on inputs [l n/k, (l+1) n/k)."""
    g = torch.Generator(device=op.device).manual_seed(seed)
    n = len(op.x)
    cuts = [round(i * n / probes) for i in range(probes + 1)]
    nodes = torch.full((probes, steps), float("nan"), dtype=torch.float64)
    weights = torch.full_like(nodes, float("nan"))
    with op.ready():
        for i in range(probes):
            start = rademacher(op.n_params, op.dtype, op.device, g)
            t = lanczos(lambda v, a=cuts[i], b=cuts[i + 1]: op.matvec(v, a, b), start, steps)
            theta, tau = quadrature(t)
            nodes[i, :len(theta)], weights[i, :len(tau)] = theta, tau
    return Sketch(nodes, weights, op.n_params)


def slq_metrics(sketch: Sketch) -> dict[str, float]:
    trace = sketch.n_params * sketch.per_probe(lambda t: t)
    negative = sketch.n_params * sketch.per_probe(lambda t: t.clamp(max=0.0))
    out = {}
    for key, values in ((SLQ_TRACE_HESSIAN, trace), (SLQ_NEGATIVE_TRACE, negative)):
        out[key], out[se_key(key)] = grouped_mean_se(values)
    return out


def write_density(sketch: Sketch, cfg: SpectrumConfig, directory: Path, meta: dict) -> Path:
    """``spectral_density.json`` (and ``.png`` with matplotlib) in ``directory``."""
    grid, phi = sketch.density(cfg.grid_points, cfg.kernel_width)
    path = Path(directory) / f"{DENSITY_FILE}.json"
    write_atomic(path, json.dumps({
        "quantity": "hessian of the population loss", "n_params": sketch.n_params,
        "probes": cfg.slq_probes, "steps": cfg.slq_steps, "kernel_width": cfg.kernel_width,
        **meta, "grid": grid.tolist(), "density": phi.tolist(),
        "nodes": [[x for x in row if x == x] for row in sketch.nodes.tolist()],
        "weights": [[x for x in row if x == x] for row in sketch.weights.tolist()]}) + "\n")
    _plot(grid, phi, path.with_suffix(".png"))
    return path


def _plot(grid: torch.Tensor, phi: torch.Tensor, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: %s not drawn (the JSON has the density)", path)
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.semilogy(grid.numpy(), phi.clamp_min(1e-12).numpy())
    ax.set_xlabel("eigenvalue")
    ax.set_ylabel("density (SLQ)")
    ax.set_title("Hessian spectral density")
    fig.tight_layout()
    png = io.BytesIO()  # drawn in memory, written by the safe writer (never through a link)
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, png.getvalue())


def eigen_metrics(hessian_op: CurvatureOperator, fisher_op: CurvatureOperator,
                  cfg: SpectrumConfig) -> dict[str, float]:
    out = {}
    for key, op in ((TOP_EIG_HESSIAN, hessian_op), (TOP_EIG_FISHER, fisher_op)):
        top = top_eigenvalue(op, cfg.lanczos_steps, cfg.seed + 3)
        out[key], out[se_key(key)] = top["value"], top["se"]
    return out
