"""Do the raw traces' verdicts survive the invariant measures? (issue 54, item 3)

A post-LN BERT's query-key, value-output and LayerNorm rescalings keep every prediction and move
raw Tr(F) and Tr(H) by up to three orders of magnitude (``bench/results/invariance.md``), so a
claim read on a raw trace ("the adversary is sharper", "soft targets are flatter") could be the
parameterisation an algorithm drifts into rather than the flatness of the function it learned.
Each claim of the paper's table and of the beyond table that compares two algorithms by a raw
trace is read again here, by the same matched-loss rule (``analysis.claims.claim_rows``), with
every measure that the committed invariance test finds invariant under all three rescalings
(``analysis.leaderboard.invariance_of``; the CKA with the truth, a property of the features and
not a flatness, is left out), in the trace's direction (lower = flatter), as a relative effect.

A re-reading states no size (the paper reports traces only), so its verdict is a direction:
"reproduces" when its interval lies on the claim's side of 0, "contradicts" on the other.
*Survives* says whether the invariant measures agree with the raw trace's verdict: **yes** when
every one that decides agrees with it, **no** when one decides the other way, **undecided**
when none decides. Holm's family is this table.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from analysis.beyond import ALGORITHM, BEYOND_CLAIMS, arms_frame
from analysis.claims import VerdictRule, claim_rows, with_holm
from analysis.leaderboard import RESCALINGS, invariance_of, measure_keys
from analysis.paper_claims import CLAIMS, Claim
from flatlm.measure import CKA_TRUTH, TRACE_FISHER, TRACE_HESSIAN

RAW_TRACES = (TRACE_FISHER, TRACE_HESSIAN)
DECIDED = ("reproduces", "contradicts")
COLUMNS = ("figure", "claim", "compare", "raw_metric", "raw_effect", "raw_verdict", "metric",
           "effect", "ci_low", "ci_high", "n", "verdict", "verdict_holm")


def invariant_measures(columns) -> list[str]:
    """The measure keys among ``columns`` that the invariance test found invariant under every
    rescaling (``RESCALINGS``), the CKA left out."""
    kept = invariance_of(measure_keys(columns))
    return [m for m, cases in kept.items()
            if cases is not None and set(RESCALINGS) <= set(cases)
            and not m.startswith(CKA_TRUTH)]


def trace_claims() -> list[Claim]:
    """The claims that compare two algorithms by a raw trace (the paper's, the beyond table's)."""
    return [c for c in (*CLAIMS, *BEYOND_CLAIMS)
            if c.metric in RAW_TRACES and c.compare is not None and c.experiment == "algorithms"]


def rereading(claim: Claim, metric: str) -> Claim:
    """``claim`` read on ``metric``: a direction only, relative, as the trace was."""
    return replace(claim, metric=metric, effect_size=None, relative=True, analogue="",
                   paper=f"{claim.paper} (by the raw trace)")


def invariant_verdicts(df: pd.DataFrame, rule: VerdictRule) -> pd.DataFrame:
    """One row per (raw-trace claim, invariant measure) with trials in ``df`` (one base
    protocol's checkpoints and its ablated arms, merged with their selection trials:
    ``analysis.same_training.merge_same_training``), ``COLUMNS``. A re-reading with an arm that
    never measured the measure reads "not measured on <arm>" and is not one of Holm's tests."""
    arms = arms_frame(df)
    measures = invariant_measures(df.columns)
    claims = trace_claims()
    raw = claim_rows(arms, rule, claims=tuple(claims))
    readings = [(c, m, unmeasured_arms(arms, c, m)) for c in claims for m in measures]
    again = claim_rows(arms, rule, claims=tuple(rereading(c, m) for c, m, missing in readings
                                                    if not missing))
    if raw.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    if not again.empty:
        again = with_holm(again.drop(columns="protocol", errors="ignore"), rule.level)
    raw = raw.set_index(["figure", "claim"])
    rows = [_row(raw.loc[(r.figure, r.claim)], r._asdict()) for r in again.itertuples(index=False)]
    rows += [_row(raw.loc[(c.figure, c.statement)], _not_measured(c, m, missing))
             for c, m, missing in readings if missing and (c.figure, c.statement) in raw.index]
    order = {(c.figure, c.statement): i for i, c in enumerate(claims)}
    rows.sort(key=lambda r: order[(r["figure"], r["claim"])])  # stable: measures in order
    return pd.DataFrame(rows, columns=list(COLUMNS))


def unmeasured_arms(arms: pd.DataFrame, claim: Claim, metric: str) -> list[str]:
    """The arms of ``claim`` with no value of ``metric`` at any checkpoint."""
    return [a for a in claim.compare
            if metric not in arms or not arms.loc[arms[ALGORITHM] == a, metric].notna().any()]


def _not_measured(claim: Claim, metric: str, missing: list[str]) -> dict:
    words = f"not measured on {', '.join(missing)}"
    treated, control = claim.compare
    return {"figure": claim.figure, "claim": claim.statement,
            "metric": f"{metric} ({treated} - {control})", "effect": float("nan"),
            "ci_low": float("nan"), "ci_high": float("nan"), "n": 0, "verdict": words,
            "verdict_holm": words}


def _row(base: pd.Series, reading: dict) -> dict:
    return {"figure": reading["figure"], "claim": reading["claim"],
            "compare": _compare_of(reading["metric"]), "raw_metric": base["metric"],
            "raw_effect": base["effect"], "raw_verdict": base["verdict"],
            **{k: reading[k] for k in ("metric", "effect", "ci_low", "ci_high", "n", "verdict",
                                        "verdict_holm")}}


def _compare_of(metric: str) -> str:
    # claim_rows names an algorithms claim's metric "<key> (<treated> - <control>)"
    return metric.split(" (", 1)[1].rstrip(")") if " (" in metric else ""


def survives(rows: pd.DataFrame) -> str:
    """yes / no / undecided for one claim's re-readings (module docstring)."""
    raw = rows["raw_verdict"].iloc[0]
    decided = [v for v in rows["verdict"] if v in DECIDED]
    if rows["verdict"].str.startswith("not measured").all():
        return "not measured"
    if not decided:
        return "undecided"
    if raw not in DECIDED:
        return "undecided (the raw trace decides nothing)"
    return "yes" if all(v == raw for v in decided) else "no"


def _pct(effect: float, low: float, high: float) -> str:
    if effect != effect:  # NaN: no reading
        return "n/a"
    return f"{100 * effect:+.1f}% [{100 * low:+.1f}%, {100 * high:+.1f}%]"


def invariant_markdown(rows: pd.DataFrame, rule: VerdictRule) -> str:
    """The table per claim, with its *survives* line, and the rule."""
    out = ["# Do the raw traces' verdicts survive the invariant measures?", "",
           __doc__.split("\n\n")[1].replace("\n", " ").replace("``", "`"), "",
           f"Rule: the report's, each arm read at KL {rule.target_kl:g} "
           f"(`analysis/matched.py`); {rule.level:.0%} intervals over seeds with the "
           "measurement error and the confound bound folded in. Measures: "
           + ", ".join(f"`{m}`" for m in dict.fromkeys(
               rows["metric"].str.split(" (", regex=False).str[0])) + ".", ""]
    if rows.empty:
        return "\n".join(out + ["No claim has both arms measured by an invariant measure."])
    out += ["| claim | raw trace | its verdict | invariant measure | effect | verdict | "
            "verdict (Holm) |", "|---|---|---|---|---|---|---|"]
    for (figure, claim), part in rows.groupby(["figure", "claim"], sort=False):
        first = part.iloc[0]
        raw = f"`{first['raw_metric']}` {100 * first['raw_effect']:+.1f}%"
        for i, r in enumerate(part.itertuples(index=False)):
            head = (f"{figure}: {claim} (**survives: {survives(part)}**) | {raw} | "
                    f"{first['raw_verdict']}") if i == 0 else " | | "
            out.append(f"| {head} | `{r.metric.split(' (')[0]}` | "
                       f"{_pct(r.effect, r.ci_low, r.ci_high)} (n={r.n}) | {r.verdict} | "
                       f"{r.verdict_holm} |")
    return "\n".join(out) + "\n"
