"""What a sweep's runs show and what they can conclude, in words with numbers: how many runs and
checkpoints, whether their losses are equal, how accuracy and flatness move along what the sweep
varies (at matched loss, beside the random-init reference), the direction of each of the
paper's claims the sweep bears on, and what would make the result conclusive. The sweep's
closing summary and the report (``conclusion.md``) print it.

Runs, not checkpoints, are the independent units: several checkpoints of one run share its
initialisation and data, so the counts that decide what can be concluded are runs (the
intervals come from ``analysis.correlate``'s cluster bootstrap over runs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from analysis.checkpoints import RUN, final_checkpoints, short_name
from analysis.correlate import MIN_RUNS, distinct_resamples, saturated, saturation_rule
from analysis.effects import CONTROL, design, difference, group_means, mean_change, plateau
from analysis.paper_claims import Claim, sweep_claims
from analysis.reach import (
    DIRECTION_SE,
    Bound,
    accuracy_bound,
    equal_loss,
    gap_is_equal_loss,
    groups_at_equal_loss,
    reach_words,
)
from analysis.room import is_accuracy
from analysis.run_table import left_out, matched_rows, quantities, task_name
from flatlm.measure import KL, LOSS, TRACE_FISHER, se_key

# The correlation the conclusion reads, in order of preference: flatness with accuracy,
# controlling for the loss that is left (the paper's question), else without the control.
PREFERRED = (("partial_spearman", LOSS), ("spearman", ""))


def conclusion(df: pd.DataFrame, table: pd.DataFrame, acc_key: str, *,
               kl_threshold: float | None = None, loss_tolerance: float | None = None,
               x: str = TRACE_FISHER, min_runs: int = MIN_RUNS) -> str:
    """Paragraphs on ``df`` (the tidy table) and ``table`` (its ``correlation_table`` under the
    same rule): what the runs show, against the paper, and what would make it conclusive."""
    rule = dict(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)
    inside = df[saturated(df, **rule)]
    runs_in = inside[RUN].nunique() if RUN in inside else 0
    head = (f"{df[RUN].nunique()} runs, {len(df)} checkpoints; {len(inside)} checkpoints of "
            f"{runs_in} runs in the saturation regime ({saturation_rule(**rule, df=df)}).")
    if inside.empty:
        return " ".join([head, _no_regime(df)])
    facts = Facts.of(df, acc_key, rule)
    words = [facts.reach(),
             " ".join(w for w in (head, _loss_gap(final_checkpoints(df)), _left_out(facts))
                      if w),
             facts.describe(), facts.against_paper(),
             _conclusive(facts, table, acc_key, x, runs_in, min_runs)]
    return "\n\n".join(w for w in words if w)


@dataclass
class Facts:
    """The numbers the words are about: the sweep's kind, its groups at matched loss (or its
    runs' plateaus) and the runs left out."""

    kind: str
    field: str | None
    acc_key: str
    keys: list[str]  # the shown quantities' metric keys
    groups: pd.DataFrame  # group_means at matched loss (sizes, algorithms, other)
    final: pd.DataFrame  # group_means at the final checkpoints, every run
    changes: pd.DataFrame  # plateau (steps)
    target: float  # the matched KL
    matched_kl: tuple[float, float]  # the range of KL of the matched checkpoints
    excluded: pd.DataFrame  # left_out
    bound: Bound  # the sweep's accuracy against 100% and the majority (analysis.reach)

    @classmethod
    def of(cls, df: pd.DataFrame, acc_key: str, rule: dict) -> Facts:
        kind, field = design(df)
        excluded = left_out(df, acc_key, **rule)
        keys = list(quantities(df, acc_key).values())
        refs = [k.replace("probe/", "random_init/", 1) for k in keys if k.startswith("probe/")]
        refs += [k.replace("probe/", "lookup/", 1) for k in keys if k.startswith("probe/")]
        rows, target = matched_rows(df, excluded["run_id"], rule["kl_threshold"])
        groups, final = ((group_means(r, field, [*keys, *refs]) for r in
                          (rows, final_checkpoints(df))) if field
                         else (pd.DataFrame(), pd.DataFrame()))
        inside = saturated(df, **rule) & ~df[RUN].isin(set(excluded["run_id"]))
        changes = plateau(df, inside, keys) if kind == "steps" else pd.DataFrame()
        span = ((float(rows[KL].min()), float(rows[KL].max())) if KL in rows and len(rows)
                else (math.nan, math.nan))
        bound = accuracy_bound(final, df, acc_key, kind)
        return cls(kind, field, acc_key, keys, groups, final, changes, target, span, excluded,
                   bound)

    def reach(self) -> str:
        """What the runs can and cannot conclude, first (``analysis.reach``)."""
        equal, loss_words = self._loss_equal()
        if self.kind == "steps":
            seeds, what = (len(self.changes) or None), None
        else:
            seeds = int(self.groups["runs"].min()) if "runs" in self.groups else None
            what = short_name(self.field) if self.field else None
        return reach_words(equal=equal, loss_words=loss_words, seeds=seeds, what=what,
                           bound=self.bound, task=task_name(self.acc_key), kind=self.kind,
                           measured=self.acc_key in self.final)

    def _loss_equal(self) -> tuple[bool | None, str]:
        """Whether the compared checkpoints are at equal loss, and their KLs in words: the
        groups at matched KL (sizes, algorithms), the plateau's ends (steps)."""
        if self.kind == "steps":
            if self.changes.empty or f"{KL} change" not in self.changes:
                return None, ""
            change, se = mean_change(self.changes, KL)
            moved = math.isfinite(se) and abs(change) > DIRECTION_SE * se
            return not bool(moved), f"the KL moved {_diff(change, se, KL)} over the plateau"
        if self.groups.empty or KL not in self.groups or len(self.groups) < 2:
            return None, ""
        kl = self.groups[KL].astype(float)
        se = self.groups.get(se_key(KL), pd.Series(math.nan, index=kl.index)).astype(float)
        low, high = kl.idxmin(), kl.idxmax()
        equal = equal_loss(kl[low], se[low], kl[high], se[high])
        return equal, (f"KL {_number(kl[low], KL)} ({low}) to {_number(kl[high], KL)} "
                       f"({high}) nats at the compared checkpoints")

    def describe(self) -> str:
        """The values along what varies, in numbers."""
        if self.kind == "steps":
            return self._describe_steps()
        if self.groups.empty or len(self.groups) < 2:
            return ""
        low, high = self.matched_kl
        where = (f"At matched KL (each run's checkpoint nearest {self.target:.3g} nats: KL "
                 f"{low:.3g} to {high:.3g})" if math.isfinite(self.target)
                 else "At the final checkpoints")
        order = " / ".join(self.groups.index)
        values = "; ".join(self._series(k) for k in self.keys if k != KL and k in self.groups)
        return f"{where}, {short_name(self.field)} {order}: {values}.{self._lead()}"

    def _series(self, key: str) -> str:
        text = f"{task_name(key)} " + " / ".join(_number(v, key) for v in self.groups[key])
        ref = key.replace("probe/", "random_init/", 1)
        if key.startswith("probe/") and ref in self.groups and self.groups[ref].notna().any():
            gain = " / ".join(f"{100 * d:+.1f}" for d in self.groups[key] - self.groups[ref])
            text += (" (random-init " + " / ".join(_number(v, key) for v in self.groups[ref])
                     + f": trained {gain} points above it)")
        return text

    def _lead(self) -> str:
        """The accuracy difference that matters for the kind: largest minus smallest model;
        each algorithm minus AdamW."""
        first, last = self.groups.index[0], self.groups.index[-1]
        pairs = ([(last, first)] if self.kind != "algorithms"
                 else [(g, CONTROL) for g in self.groups.index if g != CONTROL])
        text = ", ".join(f"{a} minus {b} {_diff(*difference(self.groups, a, b, self.acc_key))}"
                         for a, b in pairs if b in self.groups.index)
        return f" On {task_name(self.acc_key)}: {text}." if text else ""

    def _describe_steps(self) -> str:
        c = self.changes
        if c.empty:
            return ""
        steps = (f"step {_steps(c['step first'])} to {_steps(c['step last'])}")
        parts = []
        for key in self.keys:
            if f"{key} first" in c:
                change = mean_change(c, key)
                parts.append(f"{task_name(key)} {_number(c[f'{key} first'].mean(), key)} -> "
                             f"{_number(c[f'{key} last'].mean(), key)} ({_diff(*change, key)})")
        return (f"On the plateau (each run's first checkpoint in the regime to its last, "
                f"{steps}; mean over {len(c)} runs): {'; '.join(parts)}.")

    def against_paper(self) -> str:
        """The direction of each claim of the paper the sweep bears on."""
        found = [w for w in (self._claim(c) for c in sweep_claims(self.kind)) if w]
        if not found:
            return ""
        return "Against the paper: " + " ".join(found)

    def _claim(self, claim: Claim) -> str:
        key = self.acc_key if is_accuracy(claim.metric) else claim.metric  # the sweep's task
        value, se = self._effect(claim, key, self.groups)
        caveat = ""
        if not math.isfinite(value) and claim.compare:  # a run left out: read at its end
            value, se = self._effect(claim, key, self.final)
            caveat = (f" at the final checkpoints, where {claim.compare[0]} is not at the "
                      f"same loss ({self._kl_words(claim.compare)}), so this is not the "
                      "paper's comparison")
        if not math.isfinite(value):
            return ""
        caveat += self._still_falling() if self.kind == "steps" else ""
        equal = False if caveat else self._claim_at_equal_loss(claim)
        bound = self.bound.kind if is_accuracy(claim.metric) else ""
        here = f"here {task_name(key)} {_diff(value, se, key)}{caveat}"
        reading = _direction(value, se, claim.sign, equal=equal, bound=bound)
        return f"{claim.where} ({claim.statement}): {here}; {reading}."

    def _claim_at_equal_loss(self, claim: Claim) -> bool | None:
        if self.kind == "steps" or self.groups.empty:
            return None
        a, b = claim.compare or (self.groups.index[-1], self.groups.index[0])
        if a == "lookup":  # the lookup table has no loss of its own to compare
            return None
        return groups_at_equal_loss(self.groups, a, b)

    def _still_falling(self) -> str:
        """The steps claims are about what happens *after* the loss converges: a KL that still
        moved by more than 2 s.e. over the plateau makes the change a training effect too."""
        if self.changes.empty or f"{KL} first" not in self.changes:
            return ""
        change, se = mean_change(self.changes, KL)
        if not (math.isfinite(change) and math.isfinite(se) and abs(change) > 2 * se):
            return ""
        return (f", but the KL itself moved {_diff(change, se, KL)} over the same checkpoints: "
                "the loss has not converged there, so this is not yet the paper's comparison")

    def _effect(self, claim: Claim, key: str, groups: pd.DataFrame) -> tuple[float, float]:
        if self.kind == "steps":
            return mean_change(self.changes, key) if not self.changes.empty else (math.nan,) * 2
        if groups.empty:
            return math.nan, math.nan
        if claim.compare is None:
            return difference(groups, groups.index[-1], groups.index[0], key)
        a, b = claim.compare
        if a == "lookup":
            return _lookup_effect(groups, key, b)
        return difference(groups, a, b, key)

    def _kl_words(self, compare: tuple[str, str]) -> str:
        kl = [self.final.loc[g, KL] if KL in self.final and g in self.final.index else math.nan
              for g in compare]
        return f"KL {_number(kl[0], KL)} vs {_number(kl[1], KL)} nats"


def _lookup_effect(groups: pd.DataFrame, key: str, control: str) -> tuple[float, float]:
    """The lookup table's accuracy minus ``control``'s (both measured in its runs)."""
    ref = key.replace("probe/", "lookup/", 1)
    if ref not in groups or control not in groups.index:
        return math.nan, math.nan
    g = groups.loc[control]
    se = math.hypot(g.get(se_key(ref), math.nan), g.get(se_key(key), math.nan))
    return float(g[ref] - g[key]), se


def _left_out(facts: Facts) -> str:
    if facts.excluded.empty:
        return ""
    named = "; ".join(f"{r.run} ({r.reason})" for r in facts.excluded.itertuples())
    return f"Left out of the regime's reading: {named}."


def _loss_gap(final: pd.DataFrame) -> str:
    """How equal the final losses are: the KL range, as a ratio and in standard errors."""
    if KL not in final or final[KL].notna().sum() < 2:
        return ""
    kl = final[KL]
    low, high = final.loc[kl.idxmin()], final.loc[kl.idxmax()]
    se = math.hypot(*(float(r.get(se_key(KL), math.nan)) for r in (low, high)))
    gap = high[KL] - low[KL]
    ratio = f"{high[KL] / low[KL]:.1f}x apart" if low[KL] > 0 else "apart"
    apart = f", {gap / se:.0f} s.e." if se > 0 else ""
    equal = (f"equal loss (within {DIRECTION_SE:g} s.e.)" if gap_is_equal_loss(gap, se)
             else "not equal loss")
    return (f"Final KL {low[KL]:.3g} to {high[KL]:.3g} nats ({ratio}{apart}): {equal}.")


def _conclusive(facts: Facts, table: pd.DataFrame, acc_key: str, x: str, runs_in: int,
                min_runs: int) -> str:
    """What would make it conclusive (or, with enough runs, the correlation's reading)."""
    words = []
    if runs_in < min_runs:
        words.append(
            f"To conclude: {runs_in} run(s) in the regime, fewer than {min_runs}; a cluster "
            f"bootstrap over them has {distinct_resamples(runs_in)} distinct resamples, too "
            f"few for an interval or a p-value, so none is given. The correlation of flatness "
            f"with accuracy at equal loss needs at least {min_runs} runs in the regime (more "
            "seeds per grid point).")
    else:
        words.append(_reading(table, acc_key, x))
    outside = facts.excluded[facts.excluded["reason"].str.startswith("no checkpoint in")] \
        if not facts.excluded.empty else facts.excluded
    if not outside.empty:  # the others are in it, without the task measured
        words.append(f"{', '.join(outside['run'])} never reached the regime: train "
                     "longer (--set train.steps=...) to compare at equal loss.")
    single = (not facts.groups.empty and "runs" in facts.groups
              and (facts.groups["runs"] == 1).all())
    if single:
        what = short_name(facts.field)
        words.append(f"Each {what} ran once: a difference between two of them is one seed's "
                     f"outcome plus measurement noise (the s.e. above); 2 or more seeds per "
                     f"{what} would give it a spread over seeds, which the paper's claims need.")
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


# -- numbers in words -------------------------------------------------------------------------

def _is_accuracy(key: str) -> bool:
    return key.endswith(("/acc_mean", "/accuracy"))


def _number(value: float, key: str) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value:.3f}" if _is_accuracy(key) else f"{value:#.3g}".rstrip(".")


def _diff(value: float, se: float, key: str = "/acc_mean") -> str:
    """A difference with its size in s.e.: ``+2.8 points (1.9 s.e.)``."""
    if not math.isfinite(value):
        return "n/a"
    text = f"{100 * value:+.1f} points" if _is_accuracy(key) else f"{value:+#.3g}".rstrip(".")
    return f"{text} ({abs(value) / se:.1f} s.e.)" if math.isfinite(se) and se > 0 else text


def _direction(value: float, se: float, sign: int, *, equal: bool | None = None,
               bound: str = "") -> str:
    """The direction against the paper's ``sign``, read only at equal loss, off the bounds
    and at ``DIRECTION_SE`` s.e. or more (``analysis.reach``)."""
    if equal is False:
        return "at unequal loss: no direction read"
    if bound:
        return f"at the {bound}: no direction read"
    if not (math.isfinite(se) and se > 0):
        return "no s.e.: no direction read"
    if abs(value) < DIRECTION_SE * se:
        return f"within {DIRECTION_SE:g} s.e. of 0: no direction"
    return "the paper's direction" if value * sign > 0 else "opposite to the paper"


def _steps(values: pd.Series) -> str:
    low, high = int(values.min()), int(values.max())
    return str(low) if low == high else f"{low}-{high}"
