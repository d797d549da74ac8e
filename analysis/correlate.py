"""Does flatness explain downstream accuracy once the pre-training loss has saturated?

1. **Saturation regime**, by a stated rule on each checkpoint (row), which is required:
   ``pretrain/kl < kl_threshold`` (the model is within ``kl_threshold`` nats of the true
   conditionals), or ``pretrain/loss - pretrain/entropy <= loss_tolerance`` (the same in terms of
   the loss; ``loss = entropy + KL`` on an exact source). A source without a truth (real text)
   has neither KL nor entropy: there the tolerance is to the lowest loss any checkpoint reached,
   ``pretrain/loss - min pretrain/loss <= loss_tolerance``, and a KL rule selects nothing. Early
   checkpoints tie accuracy to the loss and would swamp the result. When no row qualifies the
   table is empty and a warning names the rule and the smallest KL seen.
2. **Correlations** of a downstream accuracy (``probe/<task>/acc_mean``) with
   ``flat/trace_fisher``, ``flat/trace_hessian`` (and their ``_grown`` twins, measured in one
   common shape across model sizes, when present) and ``pretrain/loss``: Pearson, Spearman and
   Kendall (scipy.stats).
3. **Partial correlation** of accuracy with each flatness measure controlling for the loss:
   regress both on the loss (least squares with intercept), correlate the residuals. The Pearson
   version uses the values, the Spearman version their ranks. Its p-value uses n - 3 degrees of
   freedom.

Rows are checkpoints and several come from one run, so they are not independent: the confidence
interval and the p-value come from a **cluster bootstrap** that resamples runs (``run_id``) with
all their saturated checkpoints. The interval is the percentile interval; the two-sided p-value
is 2 min(P*(r <= 0), P*(r >= 0)) over the resamples (+1 smoothed), the test that inverts it (p <
1 - level exactly when the interval excludes 0). **Ties**: a resample whose correlation is 0 up to
rounding (|r| <= ``TIE_TOL`` = 1e-12: least squares leaves +-1e-16 where the residuals' true
correlation is exactly 0) counts as exactly 0, so on both sides of the count, whatever the sign
its rounding took. Below ``min_runs`` runs a warning says so and
no p-value is given (NaN): n runs have only C(2n - 1, n) distinct resamples (10 for 3 runs), too
few for a test.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from flatlm.measure import (
    ENTROPY,
    KL,
    LOSS,
    TRACE_FISHER,
    TRACE_FISHER_GROWN,
    TRACE_HESSIAN,
    TRACE_HESSIAN_GROWN,
)

X_KEYS = (TRACE_FISHER, TRACE_HESSIAN, TRACE_FISHER_GROWN, TRACE_HESSIAN_GROWN, LOSS)
METHODS = ("pearson", "spearman", "kendall")
PARTIAL_METHODS = ("partial_pearson", "partial_spearman")
TABLE_COLUMNS = ("y", "x", "method", "control", "n", "runs", "r", "p", "ci_low", "ci_high")
N_BOOT = 1000  # the cluster bootstrap's resamples (correlation_table's default)
MIN_RUNS = 5  # fewer runs in the regime than this: a warning (cluster bootstrap on few clusters)
RUN = "run_id"


def saturation_rule(*, kl_threshold: float | None = None, loss_tolerance: float | None = None,
                    df: pd.DataFrame | None = None) -> str:
    """The rule in words (for tables and figure captions); with ``df``, the loss rule says
    whether it is to the entropy or (no truth) to the lowest loss."""
    _check_rule(kl_threshold, loss_tolerance)
    if kl_threshold is not None:
        return f"{KL} < {kl_threshold:g}"
    if loss_tolerance is not None:
        floor = ENTROPY if df is None or has_truth_columns(df) else f"min {LOSS} (no truth)"
        return f"{LOSS} - {floor} <= {loss_tolerance:g}"
    return "all checkpoints (no saturation rule)"  # for figures; correlations need a rule


def saturated(df: pd.DataFrame, *, kl_threshold: float | None = None,
              loss_tolerance: float | None = None) -> pd.Series:
    """Boolean mask of the rows in the saturation regime (all rows when no rule is given)."""
    _check_rule(kl_threshold, loss_tolerance)
    if kl_threshold is not None:
        if KL not in df:  # a source without a truth: no row is known to be near it
            return pd.Series(False, index=df.index)
        return (df[KL] < kl_threshold).fillna(False).astype(bool)
    if loss_tolerance is not None:
        floor = df[ENTROPY] if has_truth_columns(df) else df[LOSS].min()
        return ((df[LOSS] - floor) <= loss_tolerance).fillna(False).astype(bool)
    return pd.Series(True, index=df.index)


@dataclass(frozen=True)
class Bootstrap:
    """The cluster bootstrap's settings, which travel together: ``n`` resamples of the runs,
    the percentile interval's ``level``, the generator's ``seed``."""

    n: int = N_BOOT
    level: float = 0.95
    seed: int = 0


DEFAULT_BOOTSTRAP = Bootstrap()


def has_truth_columns(df: pd.DataFrame) -> bool:
    """Whether the runs measured the entropy of a known truth (a synthetic source)."""
    return ENTROPY in df and not df[ENTROPY].isna().all()


def correlation_table(df: pd.DataFrame, acc_key: str, *, x_keys=X_KEYS, control: str = LOSS,
                      kl_threshold: float | None = None, loss_tolerance: float | None = None,
                      boot: Bootstrap = DEFAULT_BOOTSTRAP,
                      min_runs: int = MIN_RUNS) -> pd.DataFrame:
    """Tidy table of correlations of ``acc_key`` with each of ``x_keys`` in the saturated rows.

    A saturation rule (``kl_threshold`` or ``loss_tolerance``) is required. One row per
    (x, method): columns ``y, x, method, control, n, runs, r, p, ci_low, ci_high``; methods
    ``pearson, spearman, kendall`` and, for x other than ``control``, ``partial_pearson,
    partial_spearman`` (controlling for ``control``). ``p`` and the interval come from the
    cluster bootstrap over ``df["run_id"]`` (module docstring; ``boot`` its settings). Keys
    missing from ``df`` are skipped. ``table.attrs``: ``rule``, ``level``, and ``note`` when the
    regime is empty or has fewer than ``min_runs`` runs (also issued as a warning).
    """
    if kl_threshold is None and loss_tolerance is None:
        raise ValueError("correlation_table needs a saturation rule: pass kl_threshold (e.g. "
                         "0.01: pretrain/kl < 0.01) or loss_tolerance; correlating every "
                         "checkpoint lets the early ones, where the loss decides, swamp the rest")
    if RUN not in df:
        raise ValueError(f"df has no {RUN!r} column: the bootstrap resamples runs; build df "
                         "with analysis.runs.load_runs")
    rule = saturation_rule(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance, df=df)
    rows = df[saturated(df, kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)]
    note = _regime_note(df, rows, rule, min_runs)
    rng, n_boot, level = np.random.default_rng(boot.seed), boot.n, boot.level
    out = []
    for x in x_keys if len(rows) else ():
        if x not in rows or acc_key not in rows:
            continue
        pair = rows[[acc_key, x, RUN]].dropna()
        y_, x_, runs = pair[acc_key].to_numpy(float), pair[x].to_numpy(float), pair[RUN]
        for method in METHODS:
            r = _stat(method, x_, y_, None)
            p, lo, hi = _cluster_bootstrap(method, x_, y_, None, runs, n_boot, level, rng)
            out.append((acc_key, x, method, "", len(y_), runs.nunique(), r, p, lo, hi))
        if x == control or control not in rows:
            continue
        trio = rows[[acc_key, x, control, RUN]].dropna()
        y_, x_, z_ = (trio[c].to_numpy(float) for c in (acc_key, x, control))
        for method in PARTIAL_METHODS:
            r = _stat(method, x_, y_, z_)
            p, lo, hi = _cluster_bootstrap(method, x_, y_, z_, trio[RUN], n_boot, level, rng)
            out.append((acc_key, x, method, control, len(y_), trio[RUN].nunique(), r, p, lo, hi))
    table = pd.DataFrame(out, columns=list(TABLE_COLUMNS))
    table[["n", "runs"]] = table[["n", "runs"]].astype("int64")
    table["p"] = table["p"].where(table["runs"] >= min_runs)  # too few runs for a test
    table.attrs.update(rule=rule, level=level, min_runs=min_runs)
    if note:
        table.attrs["note"] = note
        warnings.warn(note, stacklevel=2)
    return table


def _regime_note(df: pd.DataFrame, rows: pd.DataFrame, rule: str, min_runs: int) -> str:
    """Why the table is empty or thin ("" when neither)."""
    if rows.empty and KL not in df:
        return (f"no checkpoint satisfies the saturation rule {rule}: the runs measured no {KL} "
                "(a source without a truth, e.g. real text); use loss_tolerance "
                "(--loss-tolerance), to the lowest loss reached")
    if rows.empty:
        smallest = df[KL].min() if KL in df else math.nan
        return (f"no checkpoint satisfies the saturation rule {rule} (smallest {KL} seen: "
                f"{smallest:.3g}, over {len(df)} checkpoints): no correlations. Train longer or "
                f"loosen the rule")
    n_runs = rows[RUN].nunique()
    if n_runs < min_runs:
        return (f"only {n_runs} run(s) in the regime {rule} (fewer than {min_runs}): with so "
                f"few clusters the bootstrap intervals are unreliable and no p-value is given")
    return ""


def distinct_resamples(n_runs: int) -> int:
    """How many different resamples a cluster bootstrap over ``n_runs`` runs can draw (multisets
    of n_runs of them): C(2n - 1, n).

    >>> [distinct_resamples(n) for n in (1, 2, 3, 5)]
    [1, 3, 10, 126]
    """
    return math.comb(2 * n_runs - 1, n_runs) if n_runs > 0 else 0


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


def partial_correlation_ci(x, y, z, clusters, *, method: str = "spearman",
                           boot: Bootstrap = DEFAULT_BOOTSTRAP,
                           constant_as: float | None = None) -> dict:
    """The partial correlation of x and y given z (``partial_corr``) with a cluster-bootstrap
    percentile interval: each of ``boot.n`` resamples draws as many clusters (runs) as there are,
    with replacement, and keeps all their rows. Returns ``r, ci_low, ci_high, n`` (rows), ``runs``
    (clusters), ``resamples`` (finite resampled statistics), ``distinct`` (distinct multisets
    of clusters drawn: with k clusters there are at most C(2k-1, k), 10 for k = 3, so few runs
    give an interval from few distinct values), ``constant`` (resamples whose y is constant, where
    the correlation is 0/0) and ``p`` (2 min(P*(r <= 0), P*(r >= 0)), +1 smoothed). A constant
    resample is dropped when ``constant_as`` is None, else it counts as that value. NaN interval
    below 2 clusters."""
    x, y, z = (np.asarray(a, float) for a in (x, y, z))
    codes, _ = pd.factorize(pd.Series(clusters).to_numpy())
    members = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)] if len(codes) else []
    r = partial_corr(x, y, z, method=method)[0] if len(x) >= 4 else math.nan
    out = {"r": r, "ci_low": math.nan, "ci_high": math.nan, "n": len(x), "runs": len(members),
           "resamples": 0, "distinct": 0, "constant": 0, "p": math.nan}
    if len(members) < 2 or boot.n <= 0:
        return out
    picks = np.random.default_rng(boot.seed).integers(0, len(members),
                                                      size=(boot.n, len(members)))
    rows = [np.concatenate([members[c] for c in pick]) for pick in picks]
    resampled = np.array([_partial_or_nan(x, y, z, rows_b, method) for rows_b in rows])
    constant = np.array([len(rows_b) >= 4 and np.ptp(y[rows_b]) == 0 for rows_b in rows])
    if constant_as is not None:
        resampled[constant] = constant_as
    finite = _untied(resampled[np.isfinite(resampled)])
    out["distinct"] = len({tuple(sorted(pick)) for pick in picks.tolist()})
    out["resamples"], out["constant"] = int(finite.size), int(constant.sum())
    if finite.size:
        alpha = (1 - boot.level) / 2
        out["ci_low"], out["ci_high"] = (float(q) for q in np.quantile(finite, [alpha, 1 - alpha]))
        tail = min((finite <= 0).sum(), (finite >= 0).sum())
        out["p"] = min(1.0, 2 * (tail + 1) / (finite.size + 1))
    return out


def _partial_or_nan(x, y, z, rows: np.ndarray, method: str) -> float:
    if len(rows) < 4:
        return math.nan
    return partial_corr(x[rows], y[rows], z[rows], method=method)[0]


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


def too_few_runs(table: pd.DataFrame) -> str:
    """Why ``table``'s correlations mean nothing, in one line: fewer runs in the regime than its
    ``min_runs`` (its ``attrs``; ``MIN_RUNS`` by default); "" when they are enough (or there
    is no row: the table's ``note`` says why)."""
    need = table.attrs.get("min_runs", MIN_RUNS)
    runs = int(table["runs"].max()) if len(table) else 0
    if not len(table) or runs >= need:
        return ""
    return (f"Correlations left out: {runs} run(s) in the saturation regime "
            f"({table.attrs.get('rule', '')}), fewer than {need}: a cluster bootstrap over "
            f"{runs} run(s) has {distinct_resamples(runs)} distinct resamples, too few for an "
            "interval or a test (each would span most of [-1, 1]).")


def correlation_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """The correlation table with its rule and interval level stated above it; below
    ``min_runs`` runs in the regime, one line saying why there is none (``too_few_runs``)."""
    if why := too_few_runs(table):
        return why
    level = table.attrs.get("level", 0.95)
    rule = table.attrs.get("rule", "")
    note = (f"Saturation regime: {rule}. r with {level:.0%} CI and (from {MIN_RUNS} runs) p "
            f"from a cluster bootstrap "
            f"(runs resampled with all their checkpoints; n = checkpoints, runs = clusters); "
            f"partial_*: controlling for the column `control`.")
    if table.attrs.get("note"):
        note += f"\n\n**Note:** {table.attrs['note']}."
    if len(table) and table["p"].isna().all():
        runs = int(table["runs"].max())
        note += (f"\n\nNo p-value: {runs} run(s), whose cluster bootstrap has "
                 f"{distinct_resamples(runs)} distinct resamples; read r and the interval as "
                 "descriptive.")
    shown = table.drop(columns="p") if len(table) and table["p"].isna().all() else table
    return note + "\n\n" + to_markdown(shown, digits, formats={"p": ".2g"})


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


def _stat(method: str, x: np.ndarray, y: np.ndarray, z: np.ndarray | None) -> float:
    """The correlation ``method`` of x and y (controlling for z for the partial ones)."""
    if method in METHODS:
        return _corr(method, x, y)[0]
    if method in PARTIAL_METHODS:
        if len(x) < 4:
            return math.nan
        return partial_corr(x, y, z, method=method.removeprefix("partial_"))[0]
    raise ValueError(method)


TIE_TOL = 1e-12  # a resampled correlation this close to 0 is a tie (module docstring)


def _untied(boot: np.ndarray) -> np.ndarray:
    """``boot`` with the rounding of exact zeros undone (module docstring: ties)."""
    return np.where(np.abs(boot) <= TIE_TOL, 0.0, boot)


def _cluster_bootstrap(method: str, x, y, z, clusters, n_boot: int, level: float,
                       rng: np.random.Generator) -> tuple[float, float, float]:
    """(p, ci_low, ci_high) of the statistic over ``n_boot`` resamples of whole clusters (runs):
    each resample draws as many clusters as there are, with replacement, and keeps all their
    rows. Percentile interval; p = 2 min(P*(r <= 0), P*(r >= 0)), +1 smoothed, at most 1."""
    codes, _ = pd.factorize(pd.Series(clusters).to_numpy())
    members = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)] if len(codes) else []
    if len(members) < 2 or n_boot <= 0:
        return math.nan, math.nan, math.nan
    idx = rng.integers(0, len(members), size=(n_boot, len(members)))  # (B, clusters)
    boot = np.empty(n_boot)
    for b, pick in enumerate(idx):
        rows = np.concatenate([members[c] for c in pick])
        boot[b] = _stat(method, x[rows], y[rows], None if z is None else z[rows])
    boot = _untied(boot[np.isfinite(boot)])
    if boot.size == 0:
        return math.nan, math.nan, math.nan
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    tail = min((boot <= 0).sum(), (boot >= 0).sum())
    p = min(1.0, 2 * (tail + 1) / (boot.size + 1))
    return float(p), float(lo), float(hi)


def _check_rule(kl_threshold: float | None, loss_tolerance: float | None) -> None:
    if kl_threshold is not None and loss_tolerance is not None:
        raise ValueError("give kl_threshold or loss_tolerance, not both")
