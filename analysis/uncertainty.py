"""The interval of an effect over seeds, widened by the measurement error that every seed
shares, its p-value against 0, and Holm's adjustment over a report's tests.

**Measurement error.** Every run is probed on one test set with the same probe seeds, so the
test set's sampling error is a term common to all seeds, which averaging over seeds does not
shrink. The interval of an effect's mean is

    half-width = sqrt(t_half^2 + (z se_meas)^2),
    t_half = t_{n-1, (1+level)/2} sd / sqrt(n),   z = Phi^{-1}((1 + level) / 2),

sd the spread of the n per-seed effects and se_meas the mean over seeds of the effect's
measurement s.e.: for a paired difference of two measurements sqrt(se_a^2 + se_b^2)
(conservative for two accuracies on one test set: it ignores their positive correlation), for
a relative effect a / b - 1 the delta method, (a / b) sqrt((se_a / a)^2 + (se_b / b)^2). An s.e.
the runs do not record counts as 0. With ``measurement_error=False`` se_meas = 0 (the seed
interval alone), except for a fixed arm:

**A fixed arm** (the lookup table: its probe does not depend on the training seed, so each
trial repeats one number) has no seed spread; its only uncertainty is its measurement s.e.,
which enters se_meas (not divided by sqrt(n)) whether or not ``measurement_error`` is set. The
seed spread of its effect is the other arm's alone, so repeating it narrows nothing.

**p-value** of the mean against 0, from the same statistic: T = mean / (half-width /
t_{n-1, (1+level)/2}) on n - 1 degrees of freedom, so p < 1 - level exactly when the interval
excludes 0.

**Holm** (step-down, family-wise level alpha): the i-th smallest of m p-values is adjusted to
max_{j <= i} min(1, (m - j + 1) p_(j)); a test is significant when its adjusted p <= alpha.

>>> iv = measured_ci([0.01, 0.02, 0.03], se_meas=0.0)
>>> round(iv.low, 4), round(iv.high, 4), iv.n
(-0.0048, 0.0448, 3)
>>> wider = measured_ci([0.01, 0.02, 0.03], se_meas=0.01)
>>> wider.low < iv.low and wider.high > iv.high and wider.p > iv.p
True
>>> [round(float(p), 2) for p in holm([0.01, 0.04, 0.03, float("nan")])]
[0.03, 0.06, 0.06, nan]
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats


class Interval(NamedTuple):
    """An effect's mean over seeds with its interval (module docstring)."""

    mean: float
    low: float
    high: float
    n: int  # seeds
    p: float  # two-sided, against 0
    seed_half: float  # t_half alone: the interval without measurement error
    se_meas: float


def measured_ci(values, se_meas: float = 0.0, level: float = 0.95) -> Interval:
    """The interval of the mean of per-seed ``values`` widened by ``se_meas`` (module
    docstring); fewer than 2 finite values: no interval (NaN bounds and p)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    se_meas = float(se_meas) if np.isfinite(se_meas) else 0.0
    if n < 2:
        mean = float(v.mean()) if n else np.nan
        return Interval(mean, np.nan, np.nan, n, np.nan, np.nan, se_meas)
    mean, q = float(v.mean()), stats.t.ppf(0.5 + level / 2, n - 1)
    seed_half = q * v.std(ddof=1) / np.sqrt(n)
    half = float(np.hypot(seed_half, stats.norm.ppf(0.5 + level / 2) * se_meas))
    return Interval(mean, mean - half, mean + half, n, t_p_value(mean, half / q, n),
                    float(seed_half), se_meas)


def t_p_value(mean: float, se: float, n: int) -> float:
    """Two-sided p of ``mean`` against 0 with standard error ``se`` on n - 1 d.f.; a zero s.e.
    gives 0 (or 1 for a zero mean)."""
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return float(2 * stats.t.sf(abs(mean / se), n - 1))


def effect_se(pairs: pd.DataFrame, *, relative: bool, measurement_error: bool = True,
              fixed_treated: bool = False) -> pd.Series:
    """Per seed, the measurement s.e. of treated vs control (columns ``treated``,
    ``treated_se``, ``control``, ``control_se``; module docstring). A fixed treated arm's s.e.
    always counts; the others only with ``measurement_error``."""
    keep_t = measurement_error or fixed_treated
    se_t = pairs["treated_se"].fillna(0.0) if keep_t else 0.0 * pairs["treated"]
    se_c = pairs["control_se"].fillna(0.0) if measurement_error else 0.0 * pairs["control"]
    if not relative:
        return np.hypot(se_t, se_c)
    ratio = pairs["treated"] / pairs["control"]
    return ratio.abs() * np.hypot(se_t / pairs["treated"], se_c / pairs["control"])


def mean_se(per_seed: pd.Series) -> float:
    """The mean over seeds of a per-seed s.e. (0 where none is finite)."""
    finite = per_seed[np.isfinite(per_seed)]
    return float(finite.mean()) if len(finite) else 0.0


def holm(p) -> np.ndarray:
    """Holm-adjusted p-values (module docstring); NaN entries are no tests and stay NaN."""
    p = np.asarray(p, dtype=float)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(np.isfinite(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[i]))
        out[i] = running
    return out


def seeds_to_resolve(values, level: float = 0.95, most: int = 1000,
                     se_meas: float = 0.0) -> float:
    """The fewest seeds at which, with the observed mean and spread (and the shared measurement
    s.e. ``se_meas``, which more seeds do not shrink), the interval would exclude 0 (NaN: fewer
    than 2 values, or not within ``most``)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2 or v.mean() == 0:
        return np.nan
    sd, mean = v.std(ddof=1), abs(v.mean())
    shared = stats.norm.ppf(0.5 + level / 2) * se_meas
    if sd == 0 and shared < mean:
        return float(len(v))
    n = np.arange(2, most + 1)  # every candidate at once: the first that resolves
    resolved = np.hypot(stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n), shared) < mean
    return float(n[np.argmax(resolved)]) if resolved.any() else np.nan
