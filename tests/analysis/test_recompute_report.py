"""The committed testbed report, recomputed from the committed trials by a second implementation
of its rule (issue 55). Nothing here imports ``analysis`` or ``flatlm``: the code follows the
rule's text (the docstrings of ``analysis/claims.py``, ``analysis/room.py``,
``analysis/uncertainty.py`` and ``analysis/fig1.py``, and the "Rule" section of
``replication.md``), one short function per step of it.

What a row of ``claims.csv`` gives: which claim it is (protocol, experiment, metric with its
arms, the paper's sign and effect); nothing computed. What is recomputed from the trials'
``config.json`` / ``metrics.jsonl`` and compared, floats to 1e-9 relative:

- every row but Fig. 1's: ``effect``, ``ci_low``, ``ci_high``, ``n``, ``p_value``, ``room``,
  ``bound``, ``verdict``, ``p_holm``, ``verdict_holm``, and what decided them (``ci_seed_half``,
  ``se_meas``, ``kl_max``, ``kl_spread``, ``saturated``, ``same_loss``);
- Fig. 1's rows: the partial correlation (``effect``), ``n`` (runs), ``checkpoints``, ``bound``,
  ``verdict``, ``p_holm``, ``verdict_holm`` exactly; its bootstrap loosely: a second cluster
  bootstrap (its own random stream) must give ``ci_low``, ``ci_high`` and ``p_value`` within
  ``FIG1_ATOL`` of the committed ones. Holm's family takes Fig. 1's committed p-values (the
  bootstrap's), so that ``p_holm`` of every row compares exactly.

Where the rule's text was not enough to reproduce a number, the function that settles it says so
in a paragraph beginning "Not in the text"; each was found by a mismatch and settled by which
reading reproduces the committed numbers.
"""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

ROOT = Path(__file__).parents[2]
TESTBED = ROOT / "bench" / "results" / "replication_testbed"
TRIALS = TESTBED / "trials"
CLAIMS = TESTBED / "room" / "claims.csv"

# the rule's settings (analysis/claims.py, analysis/fig1.py; each row records the values it used)
SATURATION, TOL, MIN_SEEDS, LEVEL = 0.02, 0.02, 3, 0.95
ROOM_FACTOR, BOUND_SE = 2.0, 2.0
MIN_RUNS, N_BOOT, MAX_CONSTANT_SHARE = 5, 1000, 0.05
ALPHA = 1 - LEVEL
KL, FIG1_ACC = "pretrain/kl", "probe/B/acc_mean"
FIG1 = "Fig. 1 (1, 4)"
RTOL, FIG1_ATOL = 1e-9, 0.15  # FIG1_ATOL: 1000 resamples of 5-15 runs; seen <= 0.09

REPRODUCES, CONTRADICTS = "reproduces", "contradicts"
NOT_SATURATED, LOSSES_DIFFER = "inconclusive (not saturated)", "inconclusive (losses differ)"
FEW_SEEDS, FEW_RUNS = f"inconclusive (n < {MIN_SEEDS})", f"inconclusive (runs < {MIN_RUNS})"
NO_EFFECT = "inconclusive (no effect as large as the paper's)"
UNDERPOWERED, NO_SIZE = "inconclusive (underpowered)", "inconclusive (paper states no size)"
NOT_SIGNIFICANT = "inconclusive (not significant after Holm)"


# --- the trials --------------------------------------------------------------------------------


def load_trials() -> pd.DataFrame:
    """One row per checkpoint of every committed trial, with the trial's identity."""
    rows = []
    for path in sorted(TRIALS.glob("*/*/*/config.json")):
        protocol, experiment, trial = path.parts[-4:-1]
        config = json.loads(path.read_text())
        identity = {"protocol": protocol, "experiment": experiment, "trial": trial,
                    "trial_path": f"{protocol}/{experiment}/{trial}", "model": config["model"],
                    "algorithm": config["train"]["algorithm"], "seed": config["train"]["seed"]}
        for line in (path.parent / "metrics.jsonl").read_text().splitlines():
            rows.append({**identity, **json.loads(line)})
    return pd.DataFrame(rows)


# --- one claim's arms --------------------------------------------------------------------------


def is_accuracy(key: str) -> bool:
    return key.endswith("/acc_mean")


def parse_metric(metric: str) -> tuple[str, str | None, str | None]:
    """(column, treatment, control) of a row's metric: ``lookup:B (lookup - adamw)`` is
    ``lookup/B/acc_mean`` (measured in the adamw trials) against adamw's ``probe/B/acc_mean``."""
    key, _, arms = metric.partition(" (")
    if key.startswith("lookup:"):
        key = f"lookup/{key.split(':')[1]}/acc_mean"
    if not arms:
        return key, None, None
    treatment, control = arms.rstrip(")").split(" - ")
    return key, treatment, control


def accuracy_se(p, se, n):
    """An accuracy's s.e.: the recorded one, at least the binomial s.e. at the Laplace-smoothed
    accuracy p~ = (p n + 1) / (n + 2) (analysis/room.py).

    Not in the text of claims.py / uncertainty.py / replication.md: that this floored s.e., not
    the recorded ``acc_se``, is the se_a, se_b of the interval's se_meas (room.py states it for
    the bounds only). With the recorded s.e. 41 intervals and 3 bounds differ."""
    smoothed = (p * n + 1) / (n + 2)
    return np.fmax(se, np.sqrt(smoothed * (1 - smoothed) / n))


def arm(rows: pd.DataFrame, key: str, kl=None) -> pd.DataFrame:
    """One arm per seed: its value, its s.e. (floored for an accuracy), the task's majority share
    and ceiling (1 where no Bayes ceiling is recorded), its KL."""
    rows = rows.set_index("seed")
    base = key.rsplit("/", 1)[0]
    value = rows[key].astype(float)
    if is_accuracy(key):
        se = accuracy_se(value, rows[f"{base}/acc_se"], rows[f"{base}/n_test"])
        majority = rows[f"{base}/majority_acc"]
        ceiling = rows.get(f"{base}/bayes_ceiling", pd.Series(1.0, index=rows.index)).fillna(1.0)
    else:
        se = rows[f"{key}_se"].fillna(0.0)
        majority = ceiling = pd.Series(np.nan, index=rows.index)
    return pd.DataFrame({"value": value, "se": se, "majority": majority, "ceiling": ceiling,
                         "kl": rows[KL] if kl is None else kl})


def paired(treated: pd.DataFrame, control: pd.DataFrame) -> pd.DataFrame:
    """The two arms on the seeds that have both."""
    both = treated.index.intersection(control.index)
    return pd.concat({"treated": treated.loc[both], "control": control.loc[both]}, axis=1)


# --- the compared checkpoints: saturated window, saturated models, final checkpoints -------------


def saturated_window(run: pd.DataFrame) -> pd.DataFrame:
    """A run's final stretch of checkpoints all at KL <= saturation, in step order."""
    run = run.sort_values("step")
    above = np.flatnonzero(run[KL].to_numpy() > SATURATION)
    return run.iloc[above[-1] + 1:] if len(above) else run


def window_arms(trials: pd.DataFrame, key: str):
    """steps / sgd: per run, the last against the first checkpoint of its saturated window; a run
    without a window of >= 2 checkpoints gives its whole curve's change, unsaturated. Returns
    (pairs, in the regime, largest KL, KL spread).

    Not in the text: which KLs "lie within tol of each other". Here it is each run's window on
    its own (max - min over all its checkpoints, not only the two compared, and not across
    runs); only kl_spread and same_loss depend on it in this report, no verdict."""
    last, first, in_window, kls, spreads = [], [], True, [], []
    for _, run in trials.groupby("trial"):
        window = saturated_window(run)
        if len(window) < 2:
            window, in_window = run.sort_values("step"), False
        last.append(window.iloc[[-1]])
        first.append(window.iloc[[0]])
        kls.append(window[KL].max())
        spreads.append(np.ptp(window[KL]))
    pairs = paired(arm(pd.concat(last), key), arm(pd.concat(first), key))
    return pairs, in_window, max(kls), max(spreads)


def across_arms(pairs: pd.DataFrame) -> tuple[float, float]:
    """(largest KL, KL spread) of sizes / algorithms.

    Not in the text: the spread is max - min over every compared checkpoint, all seeds and both
    arms together (not per seed pair, which gives 32 other kl_spread values)."""
    kls = pairs[[("treated", "kl"), ("control", "kl")]].to_numpy(float)
    return float(kls.max()), float(kls.max() - kls.min())


def final_rows(trials: pd.DataFrame) -> pd.DataFrame:
    return trials.sort_values("step").groupby("trial").tail(1)


def size_arms(trials: pd.DataFrame, key: str):
    """sizes: per seed, the largest against the smallest of the models whose final checkpoint is
    saturated in every seed; with fewer than two of them, of all models, unsaturated."""
    final = final_rows(trials)
    sizes = final.groupby("model")["n_params"].first().sort_values()
    saturated = final.groupby("model")[KL].max().le(SATURATION)
    models = [m for m in sizes.index if saturated[m]]
    in_regime = len(models) >= 2
    if not in_regime:
        models = list(sizes.index)
    largest, smallest = (final[final["model"] == m] for m in (models[-1], models[0]))
    pairs = paired(arm(largest, key), arm(smallest, key))
    return pairs, in_regime, *across_arms(pairs)


def algorithm_arms(trials: pd.DataFrame, key: str, treatment: str, control: str):
    """algorithms: per seed, the treatment against the control at the final checkpoint; the
    lookup table is measured in the control's trials, at KL 0."""
    final = final_rows(trials)
    control_rows = final[final["algorithm"] == control]
    if treatment == "lookup":
        treated = arm(control_rows, key, kl=0.0)
        key = key.replace("lookup/", "probe/")
    else:
        treated = arm(final[final["algorithm"] == treatment], key)
    pairs = paired(treated, arm(control_rows, key))
    return pairs, True, *across_arms(pairs)


def compared_arms(trials: pd.DataFrame, claim: pd.Series):
    key, treatment, control = parse_metric(claim["metric"])
    part = trials[(trials["protocol"] == claim["protocol"])
                  & (trials["experiment"] == claim["experiment"])]
    if claim["experiment"] in ("steps", "sgd"):
        return window_arms(part, key)
    if claim["experiment"] == "sizes":
        return size_arms(part, key)
    return algorithm_arms(part, key, treatment, control)


# --- effects per seed and the measured interval --------------------------------------------------


def effects_per_seed(pairs: pd.DataFrame, key: str) -> tuple[pd.Series, pd.Series]:
    """(effect, its measurement s.e.) per seed: a difference of accuracies with
    sqrt(se_a^2 + se_b^2); a relative effect a / b - 1 with (a / b) sqrt((se_a/a)^2 +
    (se_b/b)^2). The lookup table's s.e. enters every seed's, undivided: a fixed arm."""
    a, b = pairs[("treated", "value")], pairs[("control", "value")]
    se_a, se_b = pairs[("treated", "se")], pairs[("control", "se")]
    if is_accuracy(key):
        return a - b, np.sqrt(se_a**2 + se_b**2)
    return a / b - 1, (a / b) * np.sqrt((se_a / a) ** 2 + (se_b / b) ** 2)


def measured_interval(effects: pd.Series, se_meas: float) -> dict:
    """Student's t over seeds widened by the shared measurement s.e.:
    half = sqrt(t_half^2 + (z se_meas)^2); p from T = mean / (half / t_crit) on n - 1 d.f."""
    values = effects.dropna().to_numpy(float)
    n, mean = len(values), float(values.mean())
    if n < 2:
        return {"effect": mean, "ci_low": np.nan, "ci_high": np.nan, "n": n,
                "ci_seed_half": np.nan, "se_meas": se_meas, "p_value": np.nan}
    t_crit = stats.t.ppf((1 + LEVEL) / 2, n - 1)
    t_half = t_crit * values.std(ddof=1) / math.sqrt(n)
    half = math.hypot(t_half, stats.norm.ppf((1 + LEVEL) / 2) * se_meas)
    p = 2 * stats.t.sf(abs(mean) / (half / t_crit), n - 1) if half > 0 else float(mean == 0)
    return {"effect": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n,
            "ci_seed_half": t_half, "se_meas": se_meas, "p_value": p}


# --- room and bounds -----------------------------------------------------------------------------


def room(pairs: pd.DataFrame, sign: int) -> float:
    """ceiling - control for "better", control - majority share for "worse" (means over seeds;
    the ceiling and the majority share are the control's)."""
    control = pairs[("control", "value")].mean()
    if sign > 0:
        return pairs[("control", "ceiling")].mean() - control
    return control - pairs[("control", "majority")].mean()


def arm_mean_se(values: pd.Series, se: pd.Series) -> tuple[float, float]:
    """An arm's mean and s.e. over seeds: sqrt(sd^2 / n + mean measurement s.e.^2)."""
    sd = values.std(ddof=1) if len(values) > 1 else 0.0
    return values.mean(), math.sqrt(sd**2 / len(values) + se.mean() ** 2)


def bound(pairs: pd.DataFrame, sign: int, paper_effect: float, room_: float) -> str:
    """``ceiling`` ("better") / ``floor`` ("worse") when room < room_factor x |paper's effect|
    (a direction only: not checked); else ``ceiling`` when an arm's mean is within bound_se of
    its s.e. of the ceiling, ``floor`` when within bound_se s.e. of the majority share."""
    if np.isfinite(paper_effect) and room_ < ROOM_FACTOR * abs(paper_effect):
        return "ceiling" if sign > 0 else "floor"
    ceiling = pairs[("control", "ceiling")].mean()
    majority = pairs[("control", "majority")].mean()
    arms = [arm_mean_se(pairs[(a, "value")], pairs[(a, "se")]) for a in ("treated", "control")]
    if any(ceiling - mean <= BOUND_SE * se for mean, se in arms):
        return "ceiling"
    if any(mean - majority <= BOUND_SE * se for mean, se in arms):
        return "floor"
    return ""


# --- the verdict, the first that applies ---------------------------------------------------------


def regime_verdict(saturated: bool, same_loss: bool, n: int) -> str:
    """Steps 1-2: the saturation regime and the seeds ("" when both hold)."""
    if not saturated:
        return NOT_SATURATED
    if not same_loss:
        return LOSSES_DIFFER
    return FEW_SEEDS if n < MIN_SEEDS else ""


def interval_verdict(sign: int, low: float, high: float, paper_effect: float,
                     bound_: str) -> str:
    """Steps 3-5: the interval against 0, then the bound, then the paper's effect."""
    if min(sign * low, sign * high) > 0:
        return REPRODUCES
    if max(sign * low, sign * high) < 0:
        return CONTRADICTS
    if bound_:
        return f"inconclusive ({bound_})"
    if not np.isfinite(paper_effect):
        return NO_SIZE
    return UNDERPOWERED if low <= paper_effect <= high else NO_EFFECT


def claim_numbers(trials: pd.DataFrame, claim: pd.Series) -> dict:
    """Every compared column of one row (not Fig. 1's), from the trials."""
    key = parse_metric(claim["metric"])[0]
    sign, paper_effect = int(claim["sign"]), float(claim["paper_effect"])
    pairs, in_regime, kl_max, kl_spread = compared_arms(trials, claim)
    effects, se = effects_per_seed(pairs, key)
    out = measured_interval(effects, float(se.mean()) if se.notna().any() else 0.0)
    out |= {"kl_max": kl_max, "kl_spread": kl_spread, "saturated": in_regime and
            kl_max <= SATURATION, "same_loss": kl_spread <= TOL, "room": np.nan, "bound": ""}
    if is_accuracy(key):
        out["room"] = room(pairs, sign)
        out["bound"] = bound(pairs, sign, paper_effect, out["room"])
    out["verdict"] = regime_verdict(out["saturated"], out["same_loss"], out["n"])
    out["tested"] = not out["verdict"]
    if out["tested"]:
        out["verdict"] = interval_verdict(sign, out["ci_low"], out["ci_high"], paper_effect,
                                          out["bound"])
    return out


# --- Fig. 1: the partial correlation over saturated checkpoints, and its cluster bootstrap ------


def partial_spearman(x, y, z) -> float:
    """Spearman's partial correlation of x and y given z: the ranks of x and y regressed on the
    rank of z (least squares with intercept), the residuals correlated. NaN (0/0) where a
    residual vanishes (rounding leaves ~1e-16 there, not 0)."""
    rx, ry, rz = (stats.rankdata(v) for v in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])
    ex, ey = (r - design @ np.linalg.lstsq(design, r, rcond=None)[0] for r in (rx, ry))
    if min(ex @ ex / (rx @ rx), ey @ ey / (ry @ ry)) < 1e-20:
        return np.nan
    return float(np.corrcoef(ex, ey)[0, 1])


def one_training(trials: pd.DataFrame) -> pd.Series:
    """Per row, its training: trials that share a measured checkpoint (step > 0, the same loss
    and KL) trained one model.

    Not in the text of fig1.py: that its runs are trainings, not trials (the steps, sizes and
    adamw trials of one seed are one run, with the union of their checkpoints); it is in
    analysis/same_training.py's docstring. Counting trials gives other n and checkpoints."""
    label = {t: t for t in trials["trial_path"].unique()}

    def root(t):
        while label[t] != t:
            t = label[t]
        return t

    shared = trials[trials["step"] > 0].groupby(["step", "pretrain/loss", KL])["trial_path"]
    for members in shared.unique():
        for other in members[1:]:
            label[root(other)] = root(members[0])
    return trials["trial_path"].map(root)


def fig1_checkpoints(trials: pd.DataFrame, claim: pd.Series) -> tuple[pd.DataFrame, str]:
    """The row's saturated checkpoints: the adamw trainings of its protocol (one row per
    training and step), of its parameterisation (one model, or one growth setting).

    Not in the text: "the checkpoints in the saturated window" (fig1.py) is every checkpoint
    at KL <= saturation, not a run's final stretch: paper-code's d64-h4-l4-i256-pre seed 1
    counts its step-6666 checkpoint though its last one is above the bound."""
    measure = claim["metric"].split("(")[1].split(",")[0]
    part = trials[trials["protocol"] == claim["protocol"]]
    part = part.assign(run=one_training(part))
    part = part[part["algorithm"] == "adamw"].groupby(["run", "step"], as_index=False).first()
    group = claim["metric"].rsplit("), ", 1)[1]
    if group.startswith("model "):
        part = part[part["model"] == group.removeprefix("model ")]
    part = part[part[measure].notna()] if measure in part else part.iloc[:0]
    return part[part[KL] <= SATURATION], measure


def cluster_bootstrap(x, y, z, runs) -> tuple[float, float, float, float]:
    """(low, high, p, share of constant resamples): N_BOOT resamples of whole runs with
    replacement; one whose accuracy is constant counts as r = 0.

    Not in the text of fig1.py: the interval is the percentile one and p = 2 min(P*(r <= 0),
    P*(r >= 0)), +1 smoothed (both in analysis/correlate.py's docstring)."""
    codes = pd.factorize(runs)[0]
    members = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)]
    picks = np.random.default_rng(55).integers(0, len(members), (N_BOOT, len(members)))
    boot, constant = np.empty(N_BOOT), 0
    for b, pick in enumerate(picks):
        rows = np.concatenate([members[c] for c in pick])
        if np.ptp(y[rows]) == 0:
            boot[b], constant = 0.0, constant + 1
        else:
            boot[b] = partial_spearman(x[rows], y[rows], z[rows])
    boot = boot[np.isfinite(boot)]
    low, high = np.quantile(boot, [ALPHA / 2, 1 - ALPHA / 2])
    p = min(1.0, 2 * (min((boot <= 0).sum(), (boot >= 0).sum()) + 1) / (boot.size + 1))
    return float(low), float(high), p, constant / N_BOOT


def fig1_numbers(trials: pd.DataFrame, claim: pd.Series) -> dict:
    """r, its runs and checkpoints; with >= MIN_RUNS runs the bootstrap's interval and p, the
    ceiling (more than 5% of resamples at constant accuracy) and the interval's verdict."""
    inside, measure = fig1_checkpoints(trials, claim)
    x, y, z = (inside[c].to_numpy(float) for c in (measure, FIG1_ACC, KL))
    out = {"effect": partial_spearman(x, y, z), "n": inside["run"].nunique(),
           "checkpoints": len(inside), "ci_low": np.nan, "ci_high": np.nan,
           "p_value": np.nan, "bound": "", "verdict": FEW_RUNS, "tested": False}
    if out["n"] >= MIN_RUNS:
        low, high, p, constant = cluster_bootstrap(x, y, z, inside["run"].to_numpy())
        out |= {"ci_low": low, "ci_high": high, "p_value": p, "tested": True,
                "bound": "ceiling" if constant > MAX_CONSTANT_SHARE else ""}
        out["verdict"] = interval_verdict(int(claim["sign"]), low, high, np.nan, out["bound"])
    return out


# --- Holm over the whole report ------------------------------------------------------------------


def holm(p: pd.Series) -> pd.Series:
    """The i-th smallest of m p-values -> max_{j <= i} min(1, (m - j + 1) p_(j)); NaN stays."""
    tested = p.dropna().sort_values()
    m = len(tested)
    adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * tested.to_numpy()))
    return pd.Series(adjusted, index=tested.index).reindex(p.index)


def with_holm(report: pd.DataFrame, p_values: pd.Series) -> pd.DataFrame:
    """``p_holm`` over every row of the report (all protocols: one family) that reached the
    interval's verdict; a reproduces / contradicts whose adjusted p exceeds alpha reads not
    significant."""
    report = report.assign(p_holm=holm(p_values.where(report["tested"])))
    decided = report["verdict"].isin([REPRODUCES, CONTRADICTS])
    keep = ~decided | (report["p_holm"] <= ALPHA)
    return report.assign(verdict_holm=report["verdict"].where(keep, NOT_SIGNIFICANT))


# --- the comparison ------------------------------------------------------------------------------

EXACT = ["effect", "ci_low", "ci_high", "n", "p_value", "room", "bound", "verdict", "p_holm",
         "verdict_holm", "ci_seed_half", "se_meas", "kl_max", "kl_spread", "saturated",
         "same_loss"]
FIG1_EXACT = ["effect", "n", "checkpoints", "bound", "verdict", "p_holm", "verdict_holm"]
FIG1_LOOSE = ["ci_low", "ci_high", "p_value"]


def recompute(claims: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Every row of the report, recomputed (Holm with Fig. 1's committed p-values)."""
    rows = [fig1_numbers(trials, c) if c["figure"] == FIG1 else claim_numbers(trials, c)
            for _, c in claims.iterrows()]
    ours = pd.DataFrame(rows, index=claims.index)
    is_fig1 = claims["figure"] == FIG1
    return with_holm(ours, ours["p_value"].where(~is_fig1, claims["p_value"]))


def differs(ours, theirs, atol: float = 0.0) -> bool:
    if isinstance(theirs, str) or isinstance(ours, str):
        return str(ours) != str(theirs)
    if pd.isna(theirs) or pd.isna(ours):
        return not (pd.isna(theirs) and pd.isna(ours))
    return not math.isclose(float(ours), float(theirs), rel_tol=RTOL, abs_tol=max(atol, 1e-15))


def compared_cells(claims: pd.DataFrame):
    """(row, column, absolute tolerance) of every compared cell."""
    for i, figure in claims["figure"].items():
        if figure == FIG1:
            yield from ((i, c, 0.0) for c in FIG1_EXACT)
            yield from ((i, c, FIG1_ATOL) for c in FIG1_LOOSE)
        else:
            yield from ((i, c, 0.0) for c in EXACT)


def mismatches(claims: pd.DataFrame, ours: pd.DataFrame) -> list[str]:
    """Each compared cell that differs, named by its row and column."""
    out = []
    for i, column, atol in compared_cells(claims):
        theirs = "" if column == "bound" and pd.isna(claims.at[i, column]) else claims.at[i, column]
        if differs(ours.at[i, column], theirs, atol):
            claim = claims.loc[i]
            out.append(f"row {i} ({claim['protocol']}, {claim['experiment']}, {claim['metric']}):"
                       f" {column} recomputed {ours.at[i, column]!r}, committed {theirs!r}")
    return out


@pytest.fixture(scope="module")
def report():
    claims = pd.read_csv(CLAIMS)
    return claims, recompute(claims, load_trials())


def test_the_report_used_the_rules_settings(report):
    claims, _ = report
    rows = claims[claims["figure"] != FIG1]
    assert (rows["saturation"] == SATURATION).all() and (rows["tol"] == TOL).all()
    assert (rows["min_seeds"] == MIN_SEEDS).all() and (rows["level"] == LEVEL).all()
    assert (rows["room_factor"] == ROOM_FACTOR).all() and (rows["bound_se"] == BOUND_SE).all()
    assert rows["measurement_error"].astype(str).eq("True").all()
    assert (claims.loc[claims["figure"] == FIG1, "min_seeds"] == MIN_RUNS).all()


def test_every_row_recomputes_from_the_trials(report):
    claims, ours = report
    assert len(list(compared_cells(claims))) == 57 * len(EXACT) + 11 * 10
    assert mismatches(claims, ours) == []


def test_a_changed_cell_is_named(report):
    claims, ours = report
    changed = claims.copy()
    changed.loc[14, "ci_high"] *= 1 + 1e-6
    changed.loc[20, "verdict"] = REPRODUCES
    found = mismatches(changed, ours)
    assert len(found) == 2
    assert found[0].startswith("row 14 (paper, algorithms, lookup:B (lookup - adamw)): ci_high")
    assert found[1].startswith("row 20 (paper, all, partial spearman(") and ": verdict " in found[1]
