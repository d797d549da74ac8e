"""What a sweep's checkpoints can and cannot say about flatness and accuracy at equal loss, in
words: how many runs and checkpoints, whether any reached the saturation regime, how close their
losses are there, and the flatness-accuracy correlation with its interval read against the
paper's direction (flatter -> better). The sweep's closing summary and the report print it.

Runs, not checkpoints, are the independent units: several checkpoints of one run share its
initialisation and data, so the counts that decide what can be concluded are runs (the
intervals come from ``analysis.correlate``'s cluster bootstrap over runs).
"""

from __future__ import annotations

import pandas as pd

from analysis.correlate import MIN_RUNS, RUN, saturated, saturation_rule
from flatlm.measure import KL, LOSS, TRACE_FISHER

# The correlation the conclusion reads, in order of preference: flatness with accuracy,
# controlling for the loss that is left (the paper's question), else without the control.
PREFERRED = (("partial_spearman", LOSS), ("spearman", ""))


def conclusion(df: pd.DataFrame, table: pd.DataFrame, acc_key: str, *,
               kl_threshold: float | None = None, loss_tolerance: float | None = None,
               x: str = TRACE_FISHER, min_runs: int = MIN_RUNS) -> str:
    """A paragraph on ``df`` (the tidy table) and ``table`` (its ``correlation_table`` under the
    same rule): what it can conclude, what it cannot and what would change that."""
    rule = saturation_rule(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance, df=df)
    inside = df[saturated(df, kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)]
    runs_in = inside[RUN].nunique() if RUN in inside else 0
    words = [f"{df[RUN].nunique()} runs, {len(df)} checkpoints; {len(inside)} checkpoints of "
             f"{runs_in} runs in the saturation regime ({rule})."]
    if inside.empty:
        return " ".join([*words, _no_regime(df)])
    if KL in inside:
        words.append(f"Their KL to the truth spans {inside[KL].min():.3g} to "
                     f"{inside[KL].max():.3g} nats: that is how equal 'equal loss' is here.")
    if runs_in < min_runs:
        words.append(f"Only {runs_in} run(s) there, fewer than {min_runs}: checkpoints of one run "
                     "are not independent, so the intervals below rest on too few runs to "
                     "conclude anything; read the numbers as descriptive, and add runs (seeds).")
        return " ".join(words)
    words.append(_reading(table, acc_key, x))
    return " ".join(words)


def _no_regime(df: pd.DataFrame) -> str:
    if KL not in df or df[KL].isna().all():
        return ("No KL was measured (a source without a truth, e.g. real text), so a KL rule "
                "selects nothing; use --loss-tolerance (within it of the lowest loss reached).")
    final = df.sort_values("step").groupby(RUN).tail(1)[KL]
    return (f"No checkpoint reached it (smallest KL seen {df[KL].min():.3g} nats; final KL per "
            f"run {final.min():.3g} to {final.max():.3g}), so nothing can be concluded about "
            "accuracy at equal loss: train longer (--set train.steps=...) or loosen the rule.")


def _reading(table: pd.DataFrame, acc_key: str, x: str) -> str:
    """The preferred correlation of ``x`` with accuracy, read against the paper's sign."""
    found = [(m, c, table[(table["x"] == x) & (table["method"] == m)]) for m, c in PREFERRED]
    found = [f for f in found if not f[2].empty]
    if not found:
        return f"No {x} was measured in the regime: no reading of flatness."
    method, control, row = found[0]
    r, lo, hi = (float(row.iloc[0][k]) for k in ("r", "ci_low", "ci_high"))
    level = table.attrs.get("level", 0.95)
    what = f"{method} r({x}, {acc_key}{' | ' + control if control else ''}) = {r:+.2f}, " \
           f"{level:.0%} interval [{lo:+.2f}, {hi:+.2f}] over {int(row.iloc[0]['runs'])} runs"
    if hi < 0:
        return f"{what}: flatter checkpoints probe better at equal loss, as the paper claims."
    if lo > 0:
        return f"{what}: sharper checkpoints probe better, the opposite of the paper's claim."
    return (f"{what}: the interval (width {hi - lo:.2f}) includes 0, so this sweep cannot tell "
            "whether flatness goes with accuracy; about 4x the runs would halve the width.")
