"""The paper's claims as effects with confidence intervals, and a verdict for each by one rule.

An effect is a difference the paper reports with a sign, computed per training seed and then
averaged; its 95% interval is Student's t over seeds (the seeds are the independent units; with
one seed, a normal interval from the two measurements' own standard errors). Each claim also
has a **precondition**, the "same pre-training loss" the paper's statement is about:

- steps / sgd: the run's *plateau* is its checkpoints from the first whose KL lies within
  ``tol`` of the run's final KL; the effect is last minus first plateau checkpoint, and needs a
  plateau of >= 2 checkpoints, in every run, whose KL moved by <= ``tol`` on average;
- sizes: only the models whose final KL lies within ``tol`` of the best model's count as
  saturated (Fig. 3's dashed line); the effect is largest minus smallest saturated model, and
  needs two of them;
- algorithms: each algorithm against AdamW (SAM against noreg, as in Table 2's "-dropout-WD+SAM"),
  at the final checkpoint, when their KLs differ by <= ``tol``; the lookup table has KL 0, so
  AdamW must be within ``tol`` of the truth.

**Verdict**: precondition unmet -> ``inconclusive (precondition)``; the interval entirely on the
paper's side of 0 -> ``reproduces``; entirely on the other side -> ``contradicts``; else
``inconclusive``.

>>> verdict(+1, (0.01, 0.03), True), verdict(+1, (-0.03, -0.01), True), verdict(-1, (-1, 1), True)
('reproduces', 'contradicts', 'inconclusive')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN, probe_keys
from flatlm.models.presets import parameter_count, parse_model

LEVEL = 0.95
TOL = 0.02  # nats: "the same pre-training loss" (the paper's Fig. 1 models span 0.004)
RUN = "run_id"


@dataclass(frozen=True)
class Claim:
    """One row of the replication table."""

    experiment: str  # the trials it is read from
    figure: str  # where the paper shows it
    statement: str
    metric: str  # the column whose difference is the effect
    sign: int  # +1: the paper says it goes up; -1: down
    paper: str  # the paper's number, as it reports it
    compare: tuple[str, str] | None = None  # algorithms: (treatment, control)


def acc(task: str) -> str:
    return probe_keys(task)[0]


def lookup(task: str) -> str:
    return f"lookup/{task}/acc_mean"


CLAIMS: tuple[Claim, ...] = (
    Claim("steps", "Fig. 2a/4", "after the loss converges, accuracy keeps rising", acc("C"), +1,
          "+1.6 pts (task C, 41M)"),
    Claim("steps", "Fig. 4", "after the loss converges, Tr(H) keeps falling", TRACE_FISHER, -1,
          "falls (PCFG)"),
    Claim("steps", "Fig. 10", "... and on task B", acc("B"), +1, "rises"),
    Claim("sgd", "B.2/Fig. 10", "under SGD, accuracy rises after convergence", acc("C"), +1,
          "rises (task C)"),
    Claim("sgd", "B.2/Fig. 10", "under SGD, Tr(H) falls after convergence", TRACE_FISHER, -1,
          "falls"),
    Claim("sizes", "Fig. 3a", "a larger model probes better at the same loss", acc("B"), +1,
          "+6.9 pts (task B)"),
    Claim("sizes", "Fig. 5", "a larger model is flatter, grown to one shape",
          TRACE_FISHER_GROWN, -1, "19.8 -> 12.6"),
    Claim("sizes", "Fig. 5", "... and probes better on task C", acc("C"), +1, "40.4 -> 50.5%"),
    Claim("algorithms", "Table 1", "adversarial pre-training probes worse than AdamW", acc("B"),
          -1, "-6.9 pts (B; 42.3 vs 49.2)", ("adversarial", "adamw")),
    Claim("algorithms", "Table 1", "... on task A", acc("A"), -1, "-6.8 pts (83.1 vs 89.9)",
          ("adversarial", "adamw")),
    Claim("algorithms", "Table 2", "... on task C", acc("C"), -1, "-5.5 pts (50.2 vs 55.7)",
          ("adversarial", "adamw")),
    Claim("algorithms", "Table 2", "adversarial pre-training is sharper", TRACE_FISHER, +1,
          "+11.3 (19.34 vs 8.01)", ("adversarial", "adamw")),
    Claim("algorithms", "Table 1", "the lookup table probes worse than AdamW", "lookup:B", -1,
          "-9.5 pts (B; 39.7 vs 49.2)", ("lookup", "adamw")),
    Claim("algorithms", "Table 1/2", "no dropout / weight decay probes worse", acc("B"), -1,
          "-1.3 to -2.7 pts (BookCorpus)", ("noreg", "adamw")),
    Claim("algorithms", "Table 2", "no dropout / weight decay is sharper", TRACE_FISHER, +1,
          "+40% (BookCorpus)", ("noreg", "adamw")),
    Claim("algorithms", "Table 1/2", "SAM recovers the accuracy noreg loses", acc("B"), +1,
          "+1.4 pts (BookCorpus)", ("sam", "noreg")),
    Claim("algorithms", "Table 2", "SAM is flatter than noreg", TRACE_FISHER, -1,
          "-12.8 (BookCorpus)", ("sam", "noreg")),
)


def verdict(sign: int, ci: tuple[float, float], precondition: bool) -> str:
    """The stated rule (module docstring)."""
    if not precondition:
        return "inconclusive (precondition)"
    low, high = sign * ci[0], sign * ci[1]
    low, high = min(low, high), max(low, high)
    if low > 0:
        return "reproduces"
    if high < 0:
        return "contradicts"
    return "inconclusive"


def mean_ci(values, ses=None, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of per-seed effects: Student's t over them; one value: a normal
    interval from its measurement s.e. ``ses[0]`` (NaN when that is unknown)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return np.nan, np.nan, np.nan, 0
    mean = float(v.mean())
    if n == 1:
        se = float(ses[0]) if ses is not None and len(ses) else np.nan
        half = stats.norm.ppf(0.5 + level / 2) * se
    else:
        half = stats.t.ppf(0.5 + level / 2, n - 1) * v.std(ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half, n


def seeds_to_resolve(values, level: float = LEVEL, most: int = 1000) -> float:
    """The fewest seeds at which, with the observed mean and spread, the t interval would
    exclude 0 (NaN: fewer than 2 values, or not within ``most``)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if len(v) < 2 or v.mean() == 0:
        return np.nan
    sd, mean = v.std(ddof=1), abs(v.mean())
    if sd == 0:
        return float(len(v))
    for n in range(2, most + 1):
        if stats.t.ppf(0.5 + level / 2, n - 1) * sd / np.sqrt(n) < mean:
            return float(n)
    return np.nan


def _value(df: pd.DataFrame, metric: str) -> pd.Series:
    if metric.startswith("lookup:"):
        return df[lookup(metric.split(":")[1])]
    return df[metric] if metric in df else pd.Series(np.nan, index=df.index)


def _se(df: pd.DataFrame, metric: str) -> pd.Series:
    key = metric.replace("acc_mean", "acc_se") if "acc_mean" in metric else f"{metric}_se"
    if metric.startswith("lookup:"):
        key = lookup(metric.split(":")[1]).replace("acc_mean", "acc_se")
    return df[key] if key in df else pd.Series(np.nan, index=df.index)


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's last checkpoint."""
    return df.sort_values("step").groupby(RUN, sort=False).tail(1)


def plateau_effects(df: pd.DataFrame, metric: str, tol: float = TOL) -> dict:
    """Per run: metric(last) - metric(first plateau checkpoint); see the module docstring."""
    effects, ses, moved, ok = [], [], [], True
    for _, run in df.sort_values("step").groupby(RUN):
        final_kl = run[KL].iloc[-1]
        plateau = run[run[KL] <= final_kl + tol]
        plateau = run[run["step"] >= plateau["step"].min()]
        if len(plateau) < 2:
            ok = False
            continue
        first, last = plateau.iloc[0], plateau.iloc[-1]
        values = _value(plateau, metric)
        effects.append(values.iloc[-1] - values.iloc[0])
        s = _se(plateau, metric)
        ses.append(float(np.hypot(s.iloc[0], s.iloc[-1])))
        moved.append(last[KL] - first[KL])
    ok = ok and bool(effects) and abs(float(np.mean(moved))) <= tol
    note = (f"plateau KL moved {np.mean(moved):+.3f} (tol {tol})" if moved
            else "no run has a plateau of >= 2 checkpoints")
    return {"effects": effects, "ses": ses, "precondition": ok, "note": note}


def size_effects(df: pd.DataFrame, metric: str, tol: float = TOL) -> dict:
    """Per seed: metric(largest saturated model) - metric(smallest saturated model)."""
    final = final_rows(df)
    size = final["model"].map(model_size)
    by_model = final.assign(_size=size).groupby("model")
    kl = by_model[KL].mean()
    sizes = by_model["_size"].first()
    saturated = sorted(kl[kl <= kl.min() + tol].index, key=lambda m: sizes[m])
    ok = len(saturated) >= 2
    if not ok:  # the effect is still shown, across every size, with the precondition unmet
        saturated = sorted(kl.index, key=lambda m: sizes[m])
    small, large = saturated[0], saturated[-1]
    effects, ses = _paired(final, "model", large, small, metric)
    note = f"{large} vs {small} (KL {kl[large]:.3f} vs {kl[small]:.3f})"
    if not ok:
        note += f"; fewer than 2 models within {tol} nats of the best KL"
    return {"effects": effects, "ses": ses, "precondition": ok and bool(effects), "note": note}


def algorithm_effects(df: pd.DataFrame, metric: str, treatment: str, control: str,
                      tol: float = TOL) -> dict:
    """Per seed: metric(treatment) - metric(control) at the final checkpoint; ``lookup`` is the
    lookup table measured in the control's trials (KL 0)."""
    final = final_rows(df)
    if control not in set(final["train.algorithm"]):
        return {"effects": [], "ses": [], "precondition": False, "note": f"no {control} runs"}
    ctrl = final[final["train.algorithm"] == control]
    if treatment == "lookup":
        effects = list(_value(ctrl, metric) - ctrl[acc(metric.split(":")[1])])
        ses = list(np.hypot(_se(ctrl, metric), _se(ctrl, acc(metric.split(":")[1]))))
        gap = float(ctrl[KL].mean())
        return {"effects": effects, "ses": ses, "precondition": gap <= tol,
                "note": f"{control} KL {gap:.3f} vs the lookup table's 0 (tol {tol})"}
    effects, ses = _paired(final, "train.algorithm", treatment, control, metric)
    treat = final[final["train.algorithm"] == treatment]
    gap = float(treat[KL].mean() - ctrl[KL].mean())
    return {"effects": effects, "ses": ses, "precondition": bool(effects) and abs(gap) <= tol,
            "note": f"KL {treatment} - {control} = {gap:+.3f} (tol {tol})"}


def _paired(final: pd.DataFrame, column: str, a, b, metric: str):
    """Per training seed: metric(column == a) - metric(column == b)."""
    if metric.startswith("lookup:"):
        raise ValueError("the lookup table is compared through algorithm_effects")
    rows = final.assign(_v=_value(final, metric), _s=_se(final, metric))
    by_seed = rows.groupby(["train.seed", column])[["_v", "_s"]].mean()
    values, ses = by_seed["_v"].unstack(column), by_seed["_s"].unstack(column)
    if a not in values or b not in values:
        return [], []
    diff = (values[a] - values[b]).dropna()
    se = np.hypot(ses[a], ses[b]).reindex(diff.index)
    return list(diff), list(se)


def model_size(model: str) -> float:
    """Parameter count of a model name (orders the sizes)."""
    return float(parameter_count(parse_model(model), vocab_size=100, max_length=32))


def claim_rows(df: pd.DataFrame, tol: float = TOL) -> pd.DataFrame:
    """One row per claim with data in ``df`` (one protocol's trials): the effect, its interval,
    the precondition and the verdict."""
    rows = []
    for claim in CLAIMS:
        part = df[df["experiment"] == claim.experiment]
        if part.empty or not _measured(part, claim.metric):
            continue
        if claim.experiment in ("steps", "sgd"):
            res = plateau_effects(part, claim.metric, tol)
        elif claim.experiment == "sizes":
            res = size_effects(part, claim.metric, tol)
        else:
            res = algorithm_effects(part, claim.metric, *claim.compare, tol)
        mean, low, high, n = mean_ci(res["effects"], res["ses"])
        finite = bool(np.isfinite(low) and np.isfinite(high))
        rows.append({
            "experiment": claim.experiment, "figure": claim.figure, "claim": claim.statement,
            "metric": claim.metric if claim.compare is None
            else f"{claim.metric} ({claim.compare[0]} - {claim.compare[1]})",
            "paper": claim.paper, "sign": claim.sign, "effect": mean, "ci_low": low,
            "ci_high": high, "n": n, "precondition": res["precondition"], "note": res["note"],
            "verdict": verdict(claim.sign, (low, high), res["precondition"] and finite),
            "seeds_to_resolve": seeds_to_resolve(res["effects"]),
        })
    return pd.DataFrame(rows)


def _measured(df: pd.DataFrame, metric: str) -> bool:
    key = lookup(metric.split(":")[1]) if metric.startswith("lookup:") else metric
    return key in df and df[key].notna().any()
