"""The paper's claims as effects with confidence intervals, and a verdict for each by one rule
that an unsaturated or single-seed run cannot meet.

**Settings** (``VerdictRule``; every one changes verdicts, so each row of the table carries the
values it used):

- ``saturation`` = 0.02 nats/token: a checkpoint is *saturated* when its KL to the true
  conditionals is at most this. The paper's claims are about the saturation regime (2.1: the
  model's conditionals equal the truth); its Fig. 1 models span 0.004 nats of loss.
- ``tol`` = 0.02 nats: the compared checkpoints' KLs lie within this of each other (the paper's
  "same pre-training loss"; with ``tol >= saturation`` saturation implies it).
- ``min_seeds`` = 3: fewer paired per-seed effects than this reach no verdict.
- ``level`` = 0.95: the Student-t interval over seeds (the seeds are the independent units; with
  one seed there is no interval: a measurement's own standard error is not the seed-to-seed
  spread).
- ``measurement_error`` = True: the interval also counts the measurement s.e. every seed shares
  (one test set, the same probe seeds): half-width = sqrt(t_half^2 + (z se_meas)^2), se_meas
  the mean over seeds of the effect's measurement s.e. (sqrt(se_a^2 + se_b^2) for a difference;
  ``analysis/uncertainty.py``). For an accuracy, se_a and se_b are each accuracy's s.e. as
  ``analysis/room.py`` defines it (the recorded ``acc_se``, at least the binomial s.e. at the
  Laplace-smoothed accuracy), not the recorded ``acc_se`` alone. The lookup table is one
  measurement repeated in every trial: its s.e. counts either way, and its repetitions narrow
  nothing.
- ``room_factor`` = 2.0 and ``bound_se`` = 2.0: an accuracy claim's *room* is ceiling - control
  for "better" (the ceiling 100%, or the task's recorded Bayes ceiling where the sentence does
  not determine the label), control - majority share for "worse"; room < ``room_factor`` x
  |paper's effect|, or an arm's mean within ``bound_se`` of its s.e. of the ceiling / of the
  majority share, puts the claim at its ``ceiling`` / ``floor`` (``analysis/room.py``).

**Effects**, computed per training seed and averaged. An accuracy effect is a difference of
accuracies (fractions; 0.016 = 1.6 points); a trace effect is *relative*, treatment / control - 1
per seed, because the trace's scale depends on the model and the data (the paper's own summaries
are "2 times larger", "40% larger"), so only a ratio compares with the paper's number. An
accuracy effect is also given as the change in the (empirical) logit of the accuracy, per seed
then averaged, with its interval by the same rule (``effect_logit``; ``analysis/room.py``).

- steps / sgd: a run's *saturated window* is its final stretch of checkpoints all at KL <=
  ``saturation``; the effect is the window's last minus its first checkpoint. Every run needs a
  window of >= 2 checkpoints whose KLs lie within ``tol`` of each other. (The rule this replaces,
  "checkpoints within tol of the final KL", held for any monotone KL curve however far from the
  truth.) The KL spread checked against ``tol``: for steps / sgd the largest over runs of one
  run's window on its own (max - min over all its checkpoints; the whole curve where it has no
  window); for sizes and algorithms max - min over every compared checkpoint, all seeds and both
  arms together.
- sizes: the *saturated models* are those whose final checkpoint is saturated in every seed; the
  effect is the largest minus the smallest of them, per seed, and needs two of them within
  ``tol``. Otherwise the effect is shown across every size, unsaturated.
- algorithms: the treatment minus the control at the final checkpoint, per seed (SAM against
  noreg, as Table 2's "-dropout-WD+SAM"); every compared checkpoint saturated and within ``tol``.
  The lookup table has KL 0, so the control must be saturated (and within ``tol`` of 0).

**Verdict**, the first that applies:

1. a compared checkpoint above ``saturation`` -> ``inconclusive (not saturated)``; saturated
   but further apart than ``tol`` -> ``inconclusive (losses differ)``;
2. fewer than ``min_seeds`` per-seed effects -> ``inconclusive (n < 3)``;
3. the interval entirely on the paper's side of 0 -> ``reproduces``; entirely on the other side
   -> ``contradicts``;
4. an accuracy claim without room (above) -> ``inconclusive (ceiling)`` or ``inconclusive
   (floor)``: a bound compresses effects towards 0, so it can hide an effect but not make an
   interval exclude 0; it decides among the verdicts of an interval that contains 0 only;
5. the interval contains 0 and excludes the paper's effect -> ``inconclusive (no effect as large
   as the paper's)``; contains both -> ``inconclusive (underpowered)``; the paper states a
   direction but no size -> ``inconclusive (paper states no size)``.

**Multiplicity.** Beside each verdict, ``verdict_holm``: Holm's adjustment at family-wise level
1 - ``level`` over the report's tests that reach step 3 (every row with an interval verdict,
Fig. 1's included), each with the p-value of its effect against 0 from the same t statistic
(measurement error included); a ``reproduces`` or ``contradicts`` whose adjusted p exceeds
1 - ``level`` reads ``inconclusive (not significant after Holm)`` there.

>>> rule = DEFAULT_RULE
>>> verdict(+1, (0.01, 0.03), n=3, paper_effect=0.02, saturated=True, rule=rule)
'reproduces'
>>> verdict(+1, (-0.01, 0.01), n=3, paper_effect=0.05, saturated=True, rule=rule)
"inconclusive (no effect as large as the paper's)"
>>> verdict(+1, (0.01, 0.03), n=2, paper_effect=0.02, saturated=True, rule=rule)
'inconclusive (n < 3)'
>>> verdict(+1, (0.01, 0.03), n=5, paper_effect=0.02, saturated=False, rule=rule)
'inconclusive (not saturated)'
>>> verdict(+1, (-0.01, 0.01), n=3, paper_effect=0.05, saturated=True, bound="ceiling")
'inconclusive (ceiling)'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from scipy import stats

from analysis import matched
from analysis.paper_claims import (
    ARMS_EFFECT,
    CLAIMS,
    SIZES_EFFECT,
    WINDOW_EFFECT,
    Claim,
    acc,
    deviation,
    lookup,
)
from analysis.room import (
    BOUND_SE,
    CEILING,
    FLOOR,
    ROOM_FACTOR,
    arm_frame,
    is_accuracy,
    logit_pairs,
    logit_slope,
    paired,
    room_check,
    with_accuracy_se,
)
from analysis.uncertainty import (
    Interval,
    effect_se,
    holm,
    mean_se,
    measured_ci,
    seeds_to_resolve,
)
from flatlm.measure import KL, SATURATED_KL
from flatlm.models.presets import parameter_count, parse_model

TOL = 0.02  # nats: "the same pre-training loss" among the compared checkpoints
MIN_SEEDS = 3
LEVEL = 0.95
RUN = "run_id"

REPRODUCES, CONTRADICTS = "reproduces", "contradicts"
NOT_SATURATED = "inconclusive (not saturated)"
LOSSES_DIFFER = "inconclusive (losses differ)"
NO_EFFECT = "inconclusive (no effect as large as the paper's)"
UNDERPOWERED = "inconclusive (underpowered)"
NO_SIZE = "inconclusive (paper states no size)"
NO_INTERVAL = "inconclusive (no interval)"
AT_CEILING, AT_FLOOR = f"inconclusive ({CEILING})", f"inconclusive ({FLOOR})"
NOT_SIGNIFICANT_HOLM = "inconclusive (not significant after Holm)"


def too_few_seeds(min_seeds: int = MIN_SEEDS) -> str:
    return f"inconclusive (n < {min_seeds})"


@dataclass(frozen=True)
class VerdictRule:
    """The choices a verdict depends on (module docstring)."""

    saturation: float = SATURATED_KL  # nats/token (flatlm.measure)
    tol: float = TOL
    min_seeds: int = MIN_SEEDS
    level: float = LEVEL
    measurement_error: bool = True  # fold the shared measurement s.e. into every interval
    room_factor: float = ROOM_FACTOR  # room < this x |paper's effect|: ceiling / floor
    bound_se: float = BOUND_SE  # an arm within this many s.e. of its ceiling / majority: bound
    # the matched-loss rule (analysis/matched.py): off while target_kl is None
    target_kl: float | None = None  # nats/token: the common KL every unsaturated arm is read at
    match_tol: float = matched.MATCH_TOL  # the nearest checkpoint within this counts
    slope_window: float = matched.SLOPE_WINDOW  # checkpoints this near the target: the slope
    confound_share: float = matched.CONFOUND_SHARE  # bound above this x the effect: not matched
    plateau_points: int = matched.PLATEAU_POINTS  # the last checkpoints a plateau is read on
    # (protocol, KL) pairs: a protocol read at its own target, not ``target_kl`` (a robustness
    # column's grammar, whose models reach another KL in the same budget)
    protocol_targets: tuple[tuple[str, float], ...] = ()

    def for_protocol(self, protocol: str) -> VerdictRule:
        """The rule ``protocol``'s claims are read by: its own target KL where it has one."""
        own = dict(self.protocol_targets).get(protocol)
        return self if own is None else replace(self, target_kl=own, protocol_targets=())

    @property
    def matching(self) -> matched.MatchRule:
        """The matched-loss settings, as ``analysis.matched`` reads them."""
        return matched.MatchRule(self.target_kl, self.level, self.match_tol, self.slope_window,
                                 self.plateau_points)

    def __post_init__(self):
        for name in ("saturation", "tol"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"VerdictRule.{name}={getattr(self, name)!r}: give a KL in "
                                 "nats/token >= 0 (default 0.02)")
        if self.min_seeds < 2:
            raise ValueError(f"VerdictRule.min_seeds={self.min_seeds}: a t interval needs >= 2 "
                             "seeds (default 3)")
        if not 0 < self.level < 1:
            raise ValueError(f"VerdictRule.level={self.level}: give a coverage in (0, 1), e.g. "
                             "0.95")
        for name in ("room_factor", "bound_se"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"VerdictRule.{name}={getattr(self, name)!r}: give a factor "
                                 ">= 0 (default 2; 0 turns the check off)")
        if self.target_kl is not None and not self.target_kl > 0:
            raise ValueError(f"VerdictRule.target_kl={self.target_kl!r}: give the common KL "
                             "in nats/token > 0 (e.g. 0.6 on testbed-v2), or None for the "
                             "saturation rule alone")
        for name in ("match_tol", "slope_window", "confound_share"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"VerdictRule.{name}={getattr(self, name)!r}: give a value "
                                 ">= 0 (analysis/matched.py has the defaults)")
        for protocol, kl in self.protocol_targets:
            if not kl > 0:
                raise ValueError(f"VerdictRule.protocol_targets: {protocol}={kl!r}: give a KL "
                                 "in nats/token > 0")
        if self.plateau_points < 3:
            raise ValueError(f"VerdictRule.plateau_points={self.plateau_points}: a slope with "
                             "an s.e. needs >= 3 checkpoints (default 4)")

    def describe(self) -> str:
        return (f"saturated: KL <= {self.saturation:g} nats/token at every compared checkpoint, "
                f"their KLs within {self.tol:g} of each other; >= {self.min_seeds} seeds; "
                f"{self.level:.0%} Student-t interval over seeds"
                + (" widened by the shared measurement s.e." if self.measurement_error else "")
                + f"; accuracy room >= {self.room_factor:g} x the paper's effect size, arms "
                  f"more than "
                  f"{self.bound_se:g} s.e. from 100% and the majority share"
                + ("" if self.target_kl is None else
                   f"; unsaturated arms read at KL {self.target_kl:g} (matched loss: "
                   f"interpolated, or the nearest checkpoint within {self.match_tol:g}), the "
                   f"KL confound bounded by the slope over +-{self.slope_window:g} nats and "
                   f"at most {self.confound_share:g} x the effect; convergence claims need a "
                   f"KL plateau over the last {self.plateau_points} checkpoints"))


DEFAULT_RULE = VerdictRule()


# -- the rule ---------------------------------------------------------------------------------

def verdict(sign: int, ci: tuple[float, float], *, n: int, paper_effect: float | None,
            saturated: bool, same_loss: bool = True, rule: VerdictRule = DEFAULT_RULE,
            bound: str = "") -> str:
    """The stated rule (module docstring). ``paper_effect`` is in the effect's units and signed
    as the paper reports it; ``ci`` is the interval of our effect; ``bound`` is "ceiling" or
    "floor" for an accuracy claim without room (``analysis.room.room_check``), else ""."""
    if not saturated:
        return NOT_SATURATED
    if not same_loss:
        return LOSSES_DIFFER
    if n < rule.min_seeds:
        return too_few_seeds(rule.min_seeds)
    return interval_verdict(sign, ci, paper_effect, bound)


def interval_verdict(sign: int, ci: tuple[float, float], paper_effect: float | None,
                     bound: str = "") -> str:
    """Steps 3-5 of the rule: where the interval lies against 0, the bounds and the paper's
    effect."""
    if not (np.isfinite(ci[0]) and np.isfinite(ci[1])):
        return NO_INTERVAL
    low, high = sorted((sign * ci[0], sign * ci[1]))
    if low > 0:
        return REPRODUCES
    if high < 0:
        return CONTRADICTS
    if bound:
        return f"inconclusive ({bound})"
    if paper_effect is None or not np.isfinite(paper_effect):
        return NO_SIZE
    return UNDERPOWERED if paper_in_ci(ci, paper_effect) else NO_EFFECT


def paper_in_ci(ci: tuple[float, float], paper_effect: float | None) -> bool | None:
    """Whether the paper's effect lies in our interval (None: no size or no interval)."""
    if paper_effect is None or not (np.isfinite(ci[0]) and np.isfinite(ci[1])):
        return None
    return bool(min(ci) <= paper_effect <= max(ci))


def mean_ci(values, level: float = LEVEL) -> tuple[float, float, float, int]:
    """(mean, low, high, n) of per-seed effects: Student's t over them; fewer than 2 values:
    no interval (NaN bounds)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    n = len(v)
    if n == 0:
        return np.nan, np.nan, np.nan, 0
    mean = float(v.mean())
    if n == 1:
        return mean, np.nan, np.nan, 1
    half = stats.t.ppf(0.5 + level / 2, n - 1) * v.std(ddof=1) / np.sqrt(n)
    return mean, mean - half, mean + half, n


# -- effects ----------------------------------------------------------------------------------

@dataclass
class Effects:
    """Per-seed effects of one claim and what the rule needs to know about their checkpoints."""

    values: list[float]
    saturated: bool  # every compared checkpoint at KL <= saturation
    same_loss: bool  # ... and within tol of the others
    kl_max: float  # the largest KL among the compared checkpoints
    kl_spread: float  # max - min of their KLs (within a run for steps/sgd: the largest such)
    note: str
    # per seed (or run), the compared arms: analysis.room.PAIR columns (values, their s.e.s,
    # the task's majority share and test size); values = change(treated, control)
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)
    fixed_treated: bool = False  # the treated arm is one measurement repeated (lookup table)
    # the matched-loss rule (analysis/matched.py): the regime read, the confound bound in the
    # effect's units, and a verdict that no interval decides ("precondition not met", ...)
    regime: str = matched.SATURATED
    confound: float = np.nan
    precondition: str = ""
    confound_read_kl: float = np.nan  # the bound from the read KLs' difference alone


def metric_key(metric: str) -> str:
    """The column a claim's metric reads: ``lookup:B`` -> ``lookup/B/acc_mean``."""
    return lookup(metric.split(":")[1]) if metric.startswith("lookup:") else metric


def _change(after, before, relative: bool):
    return after / before - 1 if relative else after - before


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's last checkpoint."""
    return df.sort_values("step").groupby(RUN, sort=False).tail(1)


def saturated_window(run: pd.DataFrame, saturation: float = SATURATED_KL) -> pd.DataFrame:
    """A run's final stretch of checkpoints all at KL <= ``saturation`` (empty when its last
    checkpoint is above it), in step order."""
    run = run.sort_values("step")
    above = np.flatnonzero(~(run[KL] <= saturation).to_numpy())
    start = above[-1] + 1 if len(above) else 0
    return run.iloc[start:]


def window_effects(df: pd.DataFrame, metric: str, rule: VerdictRule = DEFAULT_RULE,
                   relative: bool = False) -> Effects:
    """steps / sgd: per run, metric(last) vs metric(first) checkpoint of the saturated window.
    A run without a window of >= 2 checkpoints gives its whole curve's change, unsaturated."""
    lasts, firsts, unsaturated, spreads, kl_max = [], [], 0, [], 0.0
    runs = list(df.sort_values("step").groupby(RUN))
    for _, run in runs:
        window = saturated_window(run, rule.saturation)
        if len(window) < 2:
            unsaturated += 1
            window = run
        lasts.append(window.iloc[[-1]])
        firsts.append(window.iloc[[0]])
        spreads.append(float(window[KL].max() - window[KL].min()))
        kl_max = max(kl_max, float(window[KL].max()))
    pairs = _run_pairs(lasts, firsts, metric_key(metric))
    values = [float(v) for v in _change(pairs["treated"], pairs["control"], relative)]
    spread = max(spreads, default=np.nan)
    saturated = bool(runs) and unsaturated == 0
    note = (f"{len(runs) - unsaturated}/{len(runs)} runs end in a saturated window of >= 2 "
            f"checkpoints (KL <= {rule.saturation:g}); largest KL compared {kl_max:.3f}")
    return Effects(values, saturated, bool(spread <= rule.tol), kl_max, spread, note, pairs)


def _run_pairs(lasts: list, firsts: list, key: str) -> pd.DataFrame:
    """The last and first compared checkpoints of each run as arms, in run order."""
    if not lasts:
        return paired(arm_frame(pd.DataFrame(), key), arm_frame(pd.DataFrame(), key))
    last, first = (pd.concat(rows, ignore_index=True) for rows in (lasts, firsts))
    return paired(arm_frame(last, key), arm_frame(first, key))


def size_effects(df: pd.DataFrame, metric: str, rule: VerdictRule = DEFAULT_RULE,
                 relative: bool = False) -> Effects:
    """sizes: per seed, metric(largest saturated model) vs metric(smallest saturated model)."""
    final = final_rows(df)
    by_model = final.assign(_size=final["model"].map(model_size)).groupby("model")
    worst_kl = by_model[KL].max()
    sizes = by_model["_size"].first()
    saturated = sorted(worst_kl[worst_kl <= rule.saturation].index, key=lambda m: sizes[m])
    ok = len(saturated) >= 2
    models = saturated if ok else sorted(worst_kl.index, key=lambda m: sizes[m])
    small, large = models[0], models[-1]
    pairs = _paired(final, "model", large, small, metric)
    values = list(_change(pairs["treated"], pairs["control"], relative))
    compared = final[final["model"].isin([small, large])][KL]
    note = (f"{large} vs {small} (largest KL {worst_kl[large]:.3f} vs {worst_kl[small]:.3f}); "
            f"{len(saturated)} model(s) saturated in every seed (KL <= {rule.saturation:g})")
    spread = float(compared.max() - compared.min())
    return Effects(values, ok, spread <= rule.tol, float(compared.max()), spread, note, pairs)


def algorithm_effects(df: pd.DataFrame, metric: str, treatment: str, control: str,
                      rule: VerdictRule = DEFAULT_RULE, relative: bool = False) -> Effects:
    """algorithms: per seed, metric(treatment) vs metric(control) at the final checkpoint;
    ``lookup`` is the lookup table measured in the control's trials (KL 0): one measurement
    repeated in each of them, a fixed arm (``analysis/uncertainty.py``)."""
    final = final_rows(df)
    if control not in set(final["train.algorithm"]):
        return Effects([], False, False, np.nan, np.nan, f"no {control} runs")
    ctrl = final[final["train.algorithm"] == control]
    if treatment == "lookup":
        task = metric.split(":")[1]
        pairs = paired(arm_frame(ctrl, lookup(task)), arm_frame(ctrl, acc(task)))
        compared = pd.concat([ctrl[KL], pd.Series([0.0])])
    else:
        pairs = _paired(final, "train.algorithm", treatment, control, metric)
        compared = final[final["train.algorithm"].isin([treatment, control])][KL]
    values = list(_change(pairs["treated"], pairs["control"], relative))
    kl_max, spread = float(compared.max()), float(compared.max() - compared.min())
    note = (f"KL {treatment} {_kl_range(final, treatment)} vs {control} "
            f"{_kl_range(final, control)} (saturated: <= {rule.saturation:g})")
    return Effects(values, bool(values) and kl_max <= rule.saturation,
                   bool(values) and spread <= rule.tol, kl_max, spread, note, pairs,
                   fixed_treated=treatment == "lookup")


def _kl_range(final: pd.DataFrame, algorithm: str) -> str:
    if algorithm == "lookup":
        return "0"
    kl = final.loc[final["train.algorithm"] == algorithm, KL]
    return f"{kl.min():.3f}-{kl.max():.3f}" if len(kl) else "n/a"


def _paired(final: pd.DataFrame, column: str, a, b, metric: str) -> pd.DataFrame:
    """Per training seed, the arms column == a (treated) and column == b (control); seeds
    without both are left out."""
    if metric.startswith("lookup:"):
        raise ValueError("the lookup table is compared through algorithm_effects")
    arms = []
    for value in (a, b):
        rows = final[final[column] == value]
        arms.append(arm_frame(rows, metric).groupby(rows["train.seed"]).mean())
    pairs = paired(*arms)
    return pairs[pairs["treated"].notna() & pairs["control"].notna()]


EFFECTS = {WINDOW_EFFECT: window_effects, SIZES_EFFECT: size_effects}  # and ARMS_EFFECT's:
#   algorithm_effects, with the claim's compare


def model_size(model: str) -> float:
    """Parameter count of a model name (orders the sizes)."""
    return float(parameter_count(parse_model(model), vocab_size=100, max_length=32))


# -- the table --------------------------------------------------------------------------------

def claim_effects(part: pd.DataFrame, claim: Claim, rule: VerdictRule) -> Effects:
    """The saturation rule's effects; where they are not saturated and the rule has a target
    KL, the matched-loss rule's (``analysis/matched.py``)."""
    if claim.effect == ARMS_EFFECT:
        eff = algorithm_effects(part, claim.metric, *claim.compare, rule, claim.relative)
    else:
        eff = EFFECTS[claim.effect](part, claim.metric, rule, claim.relative)
    if rule.target_kl is None or eff.saturated:
        return eff
    return matched_loss_effects(part, claim, rule)


def matched_loss_effects(part: pd.DataFrame, claim: Claim, rule: VerdictRule) -> Effects:
    """``claim`` read at ``rule.target_kl`` (``analysis.matched.matched_effects``)."""
    m = matched.matched_effects(
        part, matched.Compared(claim.effect, metric_key(claim.metric), claim.compare,
                               claim.relative),
        rule.matching)
    return Effects(m.values, False, True, m.kl_max, m.kl_spread, m.note, m.pairs,
                   regime=matched.MATCHED, confound=m.confound, precondition=m.precondition,
                   confound_read_kl=m.confound_read_kl)


def claim_rows(df: pd.DataFrame, rule: VerdictRule = DEFAULT_RULE,
               claims: tuple[Claim, ...] = CLAIMS) -> pd.DataFrame:
    """One row per claim of ``claims`` (the paper's) with data in ``df`` (one protocol's
    trials): the paper's attribution and effect, ours with its interval, what decided the
    verdict, and the verdict. A claim that compares an algorithm with no runs here has no data
    (not a row that would read "not saturated")."""
    rows = []
    for claim in claims:
        part = df[df["experiment"] == claim.experiment]
        if part.empty or not _measured(part, claim.metric) or _arm_not_run(part, claim):
            continue
        eff = claim_effects(part, claim, rule)
        row = claim_row(claim, eff, summarise(claim, eff, rule), rule)
        rows.append({**row, "deviation": deviation(claim, part.get("train.lr", ())),
                     "fragile": fragile_thresholds(part, claim, rule, eff, row["verdict"])})
    return pd.DataFrame(rows)


# A verdict is *fragile* when a small change of one threshold changes it: each of these moved
# by FRAGILE_STEP (10%) either way; the level by one point either way.
FRAGILE_STEP = 0.1
FRAGILE_FIELDS = ("saturation", "tol", "room_factor", "bound_se", "target_kl", "confound_share")
EFFECT_FIELDS = ("saturation", "tol", "target_kl")  # the thresholds that choose checkpoints


def threshold_variants(rule: VerdictRule) -> list[tuple[str, VerdictRule]]:
    """(name, rule) for each small change of one of the rule's thresholds."""
    out = [(f"level {v:g}", dataclasses.replace(rule, level=v))
           for v in (rule.level - 0.01, rule.level + 0.01) if 0 < v < 1]
    for name in FRAGILE_FIELDS:
        value = getattr(rule, name)
        if value is None or value == 0:
            continue
        out += [(f"{name} {value * f:.4g}", dataclasses.replace(rule, **{name: value * f}))
                for f in (1 - FRAGILE_STEP, 1 + FRAGILE_STEP)]
    return out


def fragile_thresholds(part: pd.DataFrame, claim: Claim, rule: VerdictRule, eff: Effects,
                       result: str) -> str:
    """The threshold changes (``threshold_variants``) under which ``claim``'s verdict is no
    longer ``result``, each with the verdict it gives ("" when none: a robust verdict); ``eff``
    is reused where the change does not choose other checkpoints."""
    moved = []
    for name, variant in threshold_variants(rule):
        moved_eff = claim_effects(part, claim, variant) if name.split()[0] in EFFECT_FIELDS \
            else eff
        other = row_verdict(claim, moved_eff, summarise(claim, moved_eff, variant), variant)
        if other != result:
            moved.append(f"{name}: {other}")
    return "; ".join(moved)


@dataclass(frozen=True)
class Summary:
    """What the rule reads off a claim's per-seed effects: the interval (measurement error
    included), for an accuracy the same on the logit scale, and its room."""

    interval: Interval
    logit: Interval | None = None
    bound: str = ""  # "ceiling", "floor" or "" (analysis.room.room_check)
    room: float = np.nan
    room_words: str = ""


def summarise(claim: Claim, eff: Effects, rule: VerdictRule = DEFAULT_RULE) -> Summary:
    """The interval of ``eff`` by ``rule`` and, for an accuracy claim, its logit twin and
    its room (``analysis/room.py``, ``analysis/uncertainty.py``)."""
    accuracy, pairs = is_accuracy(claim.metric) and len(eff.pairs) > 0, eff.pairs
    if accuracy:
        pairs = with_accuracy_se(pairs)
    kw = {"measurement_error": rule.measurement_error, "fixed_treated": eff.fixed_treated}
    se = mean_se(effect_se(pairs, relative=claim.relative, **kw)) if len(pairs) else 0.0
    interval = matched.widen(measured_ci(eff.values, se, rule.level), eff.confound, rule.level)
    if not accuracy:
        return Summary(interval)
    on_logit = logit_pairs(pairs)
    logit = measured_ci(on_logit["treated"] - on_logit["control"],
                        mean_se(effect_se(on_logit, relative=False, **kw)), rule.level)
    # the confound bound on the logit scale: its points at the control's mean accuracy
    logit = matched.widen(logit, eff.confound * float(np.nanmean(
        logit_slope(pairs["control"], pairs["n_test"]))), rule.level)
    name, space, words = room_check(pairs, claim.sign, claim.effect_size, rule.room_factor,
                               rule.bound_se)
    return Summary(interval, logit, name, space, words)


def compared_metric(metric: str, treatment: str, control: str) -> str:
    """The table's name of an algorithms claim's metric: ``metric (treatment - control)``."""
    return f"{metric} ({treatment} - {control})"


def _arm_not_run(part: pd.DataFrame, claim: Claim) -> bool:
    """Whether a compared algorithm of ``claim`` has no runs in ``part`` (the lookup table is
    measured in the control's runs)."""
    if claim.compare is None:
        return False
    run = set(part.get("train.algorithm", pd.Series(dtype=object)).dropna())
    return any(arm != "lookup" and arm not in run for arm in claim.compare)


def matched_verdict(claim: Claim, eff: Effects, summary: Summary, rule: VerdictRule) -> str:
    """The matched-loss rule's verdict (``analysis/matched.py``): a precondition or target not
    met, then the confound bound against ``confound_share`` of the effect, then the seeds,
    then the interval (already widened by the bound) as the saturation rule reads it."""
    iv = summary.interval
    if eff.precondition:
        return eff.precondition
    if matched.confounded(eff.confound, claim.effect_size, iv.mean, rule.confound_share,
                          matched.resolution(iv, eff.confound)):
        return matched.NOT_MATCHED
    if iv.n < rule.min_seeds:
        return too_few_seeds(rule.min_seeds)
    return interval_verdict(claim.sign, (iv.low, iv.high), claim.effect_size, summary.bound)


def row_verdict(claim: Claim, eff: Effects, summary: Summary, rule: VerdictRule) -> str:
    """The verdict of ``claim``'s row: the matched-loss rule's in its regime, else the
    saturation rule's."""
    iv = summary.interval
    if eff.regime == matched.MATCHED:
        return matched_verdict(claim, eff, summary, rule)
    return verdict(claim.sign, (iv.low, iv.high), n=iv.n, paper_effect=claim.effect_size,
                   saturated=eff.saturated, same_loss=eff.same_loss, rule=rule,
                   bound=summary.bound)


def claim_row(claim: Claim, eff: Effects, summary: Summary, rule: VerdictRule) -> dict:
    iv = summary.interval
    result = row_verdict(claim, eff, summary, rule)
    metric = claim.metric if claim.compare is None else compared_metric(claim.metric,
                                                                        *claim.compare)
    logit = summary.logit or Interval(np.nan, np.nan, np.nan, 0, np.nan, np.nan, np.nan)
    return {
        "experiment": claim.experiment, "figure": claim.figure, "claim": claim.statement,
        "metric": metric, "effect_unit": "relative" if claim.relative else "difference",
        "paper": claim.paper, "paper_setting": claim.setting,
        "paper_effect": np.nan if claim.effect_size is None else claim.effect_size,
        "paper_effect_origin": claim.origin, "analogue": claim.analogue, "sign": claim.sign,
        "effect": iv.mean, "ci_low": iv.low, "ci_high": iv.high, "level": rule.level,
        "n": iv.n, "ci_seed_half": iv.seed_half, "se_meas": iv.se_meas, "p_value": iv.p,
        "measurement_error": rule.measurement_error, "effect_logit": logit.mean,
        "logit_low": logit.low, "logit_high": logit.high, "room": summary.room,
        "room_factor": rule.room_factor, "bound_se": rule.bound_se, "bound": summary.bound,
        "scales_agree": scales_agree(iv, summary.logit),
        "min_seeds": rule.min_seeds, "saturation": rule.saturation, "tol": rule.tol,
        "kl_max": eff.kl_max, "kl_spread": eff.kl_spread, "saturated": eff.saturated,
        "same_loss": eff.same_loss,
        "paper_in_ci": paper_in_ci((iv.low, iv.high), claim.effect_size), "verdict": result,
        "decided_by": decided_by(eff, summary, claim.effect_size, rule), "note": eff.note,
        "seeds_to_resolve": seeds_to_resolve(eff.values, rule.level, se_meas=iv.se_meas),
    } | _matched_columns(eff, rule)


def interval_side(low: float, high: float) -> int:
    """+1: the interval lies above 0; -1: below; 0: it contains 0 (or is not finite)."""
    if not (np.isfinite(low) and np.isfinite(high)):
        return 0
    return 1 if low > 0 else -1 if high < 0 else 0


def scales_agree(points: Interval, logit: Interval | None) -> bool | float:
    """Whether the logit interval lies on the same side of 0 as the points interval, which
    decides (module docstring); NaN for a claim without a logit twin."""
    if logit is None or not np.isfinite(logit.low) or not np.isfinite(points.low):
        return np.nan
    return interval_side(points.low, points.high) == interval_side(logit.low, logit.high)


def _matched_columns(eff: Effects, rule: VerdictRule) -> dict:
    """The matched-loss rule's columns, in a report that uses it (a target KL) only: the
    saturation rule's reports stay as they were."""
    if rule.target_kl is None:
        return {}
    return {"regime": eff.regime, "target_kl": rule.target_kl, "confound_bound": eff.confound,
            "confound_bound_read_kl": eff.confound_read_kl,
            "confound_share": rule.confound_share, "match_tol": rule.match_tol,
            "slope_window": rule.slope_window, "plateau_points": rule.plateau_points}


def _saturation_part(eff: Effects, rule: VerdictRule) -> str:
    """The saturation check as the verdict saw it; an effect can be unsaturated with every
    compared KL below the bound when too few groups were saturated to compare (sizes: fewer
    than two models saturated in every seed)."""
    if not np.isfinite(eff.kl_max):
        return "no compared checkpoints"
    below = eff.kl_max <= rule.saturation
    text = f"largest compared KL {eff.kl_max:.4f} {'<=' if below else '>'} {rule.saturation:g}"
    return text + ("; too few saturated to compare" if below and not eff.saturated else "")


def decided_by(eff: Effects, summary: Summary, paper_effect: float | None,
               rule: VerdictRule) -> str:
    """What decided a verdict, in words: each check of the rule with the value it saw."""
    iv = summary.interval
    parts = [_regime_part(eff, paper_effect, iv, rule),
             f"n={iv.n} {'>=' if iv.n >= rule.min_seeds else '<'} {rule.min_seeds} seeds"]
    if np.isfinite(iv.low):
        confound = (f", the confound bound +-{eff.confound:.3g}"
                    if eff.regime == matched.MATCHED and np.isfinite(eff.confound) else "")
        parts.append(f"{rule.level:.0%} CI [{iv.low:+.4g}, {iv.high:+.4g}] (seeds +-"
                     f"{iv.seed_half:.3g}, measurement s.e. {iv.se_meas:.3g}"
                     f"{', the lookup table fixed' if eff.fixed_treated else ''}{confound})")
    if summary.room_words:
        parts.append(summary.room_words + (f": at its {summary.bound}" if summary.bound else ""))
    if paper_effect is None:
        parts.append("paper: a direction only")
    else:
        inside = paper_in_ci((iv.low, iv.high), paper_effect)
        where = "" if inside is None else (" (in the CI)" if inside else " (outside the CI)")
        parts.append(f"paper's effect {paper_effect:+.4g}{where}")
    return "; ".join(p for p in parts if p)


def _regime_part(eff: Effects, paper_effect: float | None, iv: Interval,
                 rule: VerdictRule) -> str:
    """The saturation checks as the verdict saw them, or the matched-loss rule's."""
    if eff.regime != matched.MATCHED:
        spread = (f"; KL spread {eff.kl_spread:.3f} {'<=' if eff.same_loss else '>'} "
                  f"{rule.tol:g}" if np.isfinite(eff.kl_spread) else "")
        return _saturation_part(eff, rule) + spread
    text = f"not saturated: matched loss at KL {rule.target_kl:g}"
    if eff.precondition:
        return f"{text}; {eff.precondition}: {eff.note}"
    resolved = matched.resolution(iv, eff.confound)
    over = matched.confounded(eff.confound, paper_effect, iv.mean, rule.confound_share, resolved)
    if paper_effect is not None:
        against = f"|paper effect {paper_effect:+.3g}|"
    else:
        against = f"max(|our effect {iv.mean:+.3g}|, the unwidened half-width {resolved:.3g})"
    return (f"{text}; {eff.note}; confound bound {eff.confound:.3g} {'>' if over else '<='} "
            f"{rule.confound_share:g} x {against}")


INTERVAL_VERDICTS = (REPRODUCES, CONTRADICTS, NO_EFFECT, UNDERPOWERED, NO_SIZE, AT_CEILING,
                     AT_FLOOR)


def with_holm(rows: pd.DataFrame, level: float = LEVEL) -> pd.DataFrame:
    """A report's claims (every protocol, Fig. 1 included) with ``p_holm`` and
    ``verdict_holm``: Holm over the rows with an interval verdict (module docstring), the whole
    report one family; beside them, where the rows name their protocol, the same with each
    protocol a family of its own (``p_holm_protocol``, ``verdict_holm_protocol``): the
    sensitivity of the family's choice."""
    out = rows.assign(**_holm_columns(rows, level))
    if "protocol" not in rows:
        return out
    per = [_holm_columns(part, level) for _, part in rows.groupby("protocol", sort=False)]
    return out.assign(p_holm_protocol=pd.concat([c["p_holm"] for c in per]),
                      verdict_holm_protocol=pd.concat([c["verdict_holm"] for c in per]))


def _holm_columns(rows: pd.DataFrame, level: float) -> dict:
    """``p_holm`` and ``verdict_holm`` of ``rows`` taken as one family."""
    tested = rows["verdict"].isin(INTERVAL_VERDICTS) & rows["p_value"].notna()
    p_holm = pd.Series(holm(rows["p_value"].where(tested)), index=rows.index)
    demoted = rows["verdict"].isin([REPRODUCES, CONTRADICTS]) & ~(p_holm <= 1 - level)
    return {"p_holm": p_holm, "verdict_holm": rows["verdict"].mask(demoted, NOT_SIGNIFICANT_HOLM)}


def _measured(df: pd.DataFrame, metric: str) -> bool:
    key = lookup(metric.split(":")[1]) if metric.startswith("lookup:") else metric
    return key in df and df[key].notna().any()
