"""Means and standard errors shared by the sources and the measurements.

>>> mean_se(torch.tensor([1.0, 3.0]))
(2.0, 1.0)
>>> ratio_mean_se(np.array([2.0, 6.0]), np.array([1.0, 3.0]))[0]
2.0
"""

from __future__ import annotations

import math

import numpy as np
import torch


def mean_se(values: torch.Tensor) -> tuple[float, float]:
    """Mean of i.i.d. values and its standard error std(ddof=1) / sqrt(n) (nan for n < 2)."""
    n = len(values)
    se = float(values.std() / math.sqrt(n)) if n > 1 else float("nan")
    return float(values.mean()), se


def ratio_mean_se(sums: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """Mean of per-token values pooled over sentences, with a sentence-clustered standard error.

    Every token weighs the same: mean = sum(sums) / sum(counts). Tokens of one sentence are not
    independent, so the standard error treats sentences as the sampling unit (delta method for a
    ratio estimator): se^2 = sum_i (s_i - mean n_i)^2 / (n (n - 1) nbar^2).
    """
    sums = np.asarray(sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    n = len(sums)
    mean = sums.sum() / counts.sum()
    if n < 2:
        return float(mean), float("nan")
    resid = sums - mean * counts
    se = math.sqrt((resid**2).sum() / (n * (n - 1) * counts.mean() ** 2))
    return float(mean), se
