"""Does flatness explain downstream accuracy once the pre-training loss has saturated?

1. **Saturation regime**, by a stated rule on each checkpoint (row):
   ``pretrain/kl < kl_threshold`` (the model is within ``kl_threshold`` nats of the true
   conditionals), or ``pretrain/loss - pretrain/entropy <= loss_tolerance`` (the same in terms of
   the loss; ``loss = entropy + KL`` on an exact source).
2. **Correlations** of a downstream accuracy (``probe/<task>/acc_mean``) with
   ``flat/trace_fisher``, ``flat/trace_hessian`` and ``pretrain/loss``: Pearson, Spearman and
   Kendall (scipy.stats), each with a seeded percentile-bootstrap confidence interval that
   resamples rows.
3. **Partial correlation** of accuracy with each flatness measure controlling for the loss:
   regress both on the loss (least squares with intercept), correlate the residuals. The Pearson
   version uses the values, the Spearman version their ranks. Its p-value uses n - 3 degrees of
   freedom.

Rows are checkpoints, so several rows come from one run; the row bootstrap treats them as
independent, which narrows the intervals when runs contribute several saturated checkpoints.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from flatlm.measure import ENTROPY, KL, LOSS, TRACE_FISHER, TRACE_HESSIAN

X_KEYS = (TRACE_FISHER, TRACE_HESSIAN, LOSS)
METHODS = ("pearson", "spearman", "kendall")
PARTIAL_METHODS = ("partial_pearson", "partial_spearman")
TABLE_COLUMNS = ("y", "x", "method", "control", "n", "r", "p", "ci_low", "ci_high")


def saturation_rule(*, kl_threshold: float | None = None,
                    loss_tolerance: float | None = None) -> str:
    """The rule in words (for tables and figure captions)."""
    _check_rule(kl_threshold, loss_tolerance)
    if kl_threshold is not None:
        return f"{KL} < {kl_threshold:g}"
    if loss_tolerance is not None:
        return f"{LOSS} - {ENTROPY} <= {loss_tolerance:g}"
    return "all checkpoints (no saturation rule)"


def saturated(df: pd.DataFrame, *, kl_threshold: float | None = None,
              loss_tolerance: float | None = None) -> pd.Series:
    """Boolean mask of the rows in the saturation regime (all rows when no rule is given)."""
    _check_rule(kl_threshold, loss_tolerance)
    if kl_threshold is not None:
        return (df[KL] < kl_threshold).fillna(False).astype(bool)
    if loss_tolerance is not None:
        return ((df[LOSS] - df[ENTROPY]) <= loss_tolerance).fillna(False).astype(bool)
    return pd.Series(True, index=df.index)


def correlation_table(df: pd.DataFrame, acc_key: str, *, x_keys=X_KEYS, control: str = LOSS,
                      kl_threshold: float | None = None, loss_tolerance: float | None = None,
                      n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Tidy table of correlations of ``acc_key`` with each of ``x_keys`` in the saturated rows.

    One row per (x, method): columns ``y, x, method, control, n, r, p, ci_low, ci_high``;
    methods ``pearson, spearman, kendall`` and, for x other than ``control``,
    ``partial_pearson, partial_spearman`` (controlling for ``control``). Keys missing from
    ``df`` are skipped. ``table.attrs["rule"]`` states the saturation rule.
    """
    rows = df[saturated(df, kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)]
    rng = np.random.default_rng(seed)
    out = []
    for x in x_keys:
        if x not in rows or acc_key not in rows:
            continue
        pair = rows[[acc_key, x]].dropna()
        y_, x_ = pair[acc_key].to_numpy(float), pair[x].to_numpy(float)
        for method in METHODS:
            r, p = _corr(method, x_, y_)
            lo, hi = _bootstrap_ci(method, x_, y_, None, n_boot, level, rng)
            out.append((acc_key, x, method, "", len(y_), r, p, lo, hi))
        if x == control or control not in rows:
            continue
        trio = rows[[acc_key, x, control]].dropna()
        y_, x_, z_ = (trio[c].to_numpy(float) for c in (acc_key, x, control))
        for method in PARTIAL_METHODS:
            r, p = partial_corr(x_, y_, z_, method=method.removeprefix("partial_"))
            lo, hi = _bootstrap_ci(method, x_, y_, z_, n_boot, level, rng)
            out.append((acc_key, x, method, control, len(y_), r, p, lo, hi))
    table = pd.DataFrame(out, columns=list(TABLE_COLUMNS))
    table["n"] = table["n"].astype("int64")
    table.attrs["rule"] = saturation_rule(kl_threshold=kl_threshold,
                                          loss_tolerance=loss_tolerance)
    table.attrs["level"] = level
    return table


def partial_corr(x, y, z, *, method: str = "pearson") -> tuple[float, float]:
    """(r, p) of x and y controlling for z: the correlation of their residuals after least
    squares on z (with intercept). ``method="spearman"`` ranks x, y and z first."""
    x, y, z = (np.asarray(a, float) for a in (x, y, z))
    if method == "spearman":
        x, y, z = (stats.rankdata(a) for a in (x, y, z))
    elif method != "pearson":
        raise ValueError(f"method must be pearson or spearman, not {method!r}")
    r = float(_partial_r(x[None], y[None], z[None])[0])
    n = len(x)
    if n <= 3 or not math.isfinite(r):
        return r, math.nan
    if abs(r) >= 1:
        return r, 0.0
    t = r * math.sqrt((n - 3) / (1 - r * r))
    return r, float(2 * stats.t.sf(abs(t), n - 3))


def to_markdown(table: pd.DataFrame, digits: int = 3, formats: dict | None = None) -> str:
    """A DataFrame as a GitHub Markdown table: floats to ``digits`` decimals, or by
    ``formats[column]`` (a format spec such as ``".2g"``)."""
    formats = formats or {}

    def cell(v, col) -> str:
        if isinstance(v, float | np.floating):
            return "" if math.isnan(v) else format(v, formats.get(col, f".{digits}f"))
        return str(v)

    cols = list(table.columns)
    header = "| " + " | ".join(map(str, cols)) + " |"
    sep = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(cell(v, c) for v, c in zip(row, cols, strict=True)) + " |"
            for row in table.itertuples(index=False)]
    return "\n".join([header, sep, *body])


def correlation_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """The correlation table with its rule and interval level stated above it."""
    level = table.attrs.get("level", 0.95)
    rule = table.attrs.get("rule", "")
    note = (f"Saturation regime: {rule}. r with {level:.0%} bootstrap CI (rows resampled); "
            f"partial_*: controlling for the column `control`.")
    return note + "\n\n" + to_markdown(table, digits, formats={"p": ".2g"})


# -- estimators -------------------------------------------------------------------------------

def _corr(method: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan, math.nan
    res = {"pearson": stats.pearsonr, "spearman": stats.spearmanr,
           "kendall": stats.kendalltau}[method](x, y)
    return float(res.statistic), float(res.pvalue)


def _pearson_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row pair of (B, n) arrays; NaN where a row is constant."""
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean(axis=1, keepdims=True)
    den = np.sqrt((xc * xc).sum(axis=1) * (yc * yc).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (xc * yc).sum(axis=1) / den, np.nan)


def _residuals(a: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Rows of a (B, n) minus their least-squares fit on the rows of z (with intercept)."""
    ac = a - a.mean(axis=1, keepdims=True)
    zc = z - z.mean(axis=1, keepdims=True)
    zz = (zc * zc).sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        beta = np.where(zz > 0, (ac * zc).sum(axis=1, keepdims=True) / zz, 0.0)
    return ac - beta * zc


def _partial_r(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    return _pearson_rows(_residuals(x, z), _residuals(y, z))


def _bootstrap_ci(method: str, x, y, z, n_boot: int, level: float,
                  rng: np.random.Generator) -> tuple[float, float]:
    """Percentile interval of the statistic over ``n_boot`` row resamples."""
    n = len(x)
    if n < 3 or n_boot <= 0:
        return math.nan, math.nan
    idx = rng.integers(0, n, size=(n_boot, n))  # (B, n)
    xb, yb = x[idx], y[idx]
    if method == "pearson":
        boot = _pearson_rows(xb, yb)
    elif method == "spearman":
        boot = _pearson_rows(stats.rankdata(xb, axis=1), stats.rankdata(yb, axis=1))
    elif method == "kendall":
        boot = np.array([_corr("kendall", a, b)[0] for a, b in zip(xb, yb, strict=True)])
    elif method == "partial_pearson":
        boot = _partial_r(xb, yb, z[idx])
    elif method == "partial_spearman":
        boot = _partial_r(*(stats.rankdata(a, axis=1) for a in (xb, yb, z[idx])))
    else:
        raise ValueError(method)
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _check_rule(kl_threshold: float | None, loss_tolerance: float | None) -> None:
    if kl_threshold is not None and loss_tolerance is not None:
        raise ValueError("give kl_threshold or loss_tolerance, not both")
