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

**Effects**, computed per training seed and averaged. An accuracy effect is a difference of
accuracies (fractions; 0.016 = 1.6 points); a trace effect is *relative*, treatment / control - 1
per seed, because the trace's scale depends on the model and the data (the paper's own summaries
are "2 times larger", "40% larger"), so only a ratio compares with the paper's number.

- steps / sgd: a run's *saturated window* is its final stretch of checkpoints all at KL <=
  ``saturation``; the effect is the window's last minus its first checkpoint. Every run needs a
  window of >= 2 checkpoints whose KLs lie within ``tol`` of each other. (The rule this replaces,
  "checkpoints within tol of the final KL", held for any monotone KL curve however far from the
  truth.)
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
4. the interval contains 0 and excludes the paper's effect -> ``inconclusive (no effect as large
   as the paper's)``; contains both -> ``inconclusive (underpowered)``; the paper states a
   direction but no size -> ``inconclusive (paper states no size)``.

>>> rule = DEFAULT_RULE
>>> verdict(+1, (0.01, 0.03), n=3, paper_effect=0.02, saturated=True, rule=rule)
'reproduces'
>>> verdict(+1, (-0.01, 0.01), n=3, paper_effect=0.05, saturated=True, rule=rule)
"inconclusive (no effect as large as the paper's)"
>>> verdict(+1, (0.01, 0.03), n=2, paper_effect=0.02, saturated=True, rule=rule)
'inconclusive (n < 3)'
>>> verdict(+1, (0.01, 0.03), n=5, paper_effect=0.02, saturated=False, rule=rule)
'inconclusive (not saturated)'
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN, probe_keys
from flatlm.models.presets import parameter_count, parse_model

SATURATION = 0.02  # nats/token: KL to the truth at or below which a checkpoint is saturated
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


def too_few_seeds(min_seeds: int = MIN_SEEDS) -> str:
    return f"inconclusive (n < {min_seeds})"


@dataclass(frozen=True)
class VerdictRule:
    """The choices a verdict depends on (module docstring)."""

    saturation: float = SATURATION
    tol: float = TOL
    min_seeds: int = MIN_SEEDS
    level: float = LEVEL

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

    def describe(self) -> str:
        return (f"saturated: KL <= {self.saturation:g} nats/token at every compared checkpoint, "
                f"their KLs within {self.tol:g} of each other; >= {self.min_seeds} seeds; "
                f"{self.level:.0%} Student-t interval over seeds")


DEFAULT_RULE = VerdictRule()


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, where it says it, and the effect it reports."""

    experiment: str  # the trials it is read from
    figure: str  # the paper's figure/table and section
    statement: str
    metric: str  # the column whose difference is the effect
    sign: int  # +1: the paper says it goes up; -1: down
    paper: str  # the paper's number, as it reports it
    setting: str  # the paper's data, model, optimiser and task for this claim
    effect_size: float | None = None  # the paper's effect in our units; None: a direction only
    relative: bool = False  # the effect is treatment / control - 1 (traces), else a difference
    compare: tuple[str, str] | None = None  # algorithms: (treatment, control)
    analogue: str = ""  # what the paper tested instead, when our test is an analogue of it
    origin: str = field(default="", compare=False)  # how effect_size was read from the paper


def acc(task: str) -> str:
    return probe_keys(task)[0]


def lookup(task: str) -> str:
    return f"lookup/{task}/acc_mean"


# The paper does not name Fig. 5's task. Its range, 40.4 -> 50.5%, is task B's: Table 1 has
# AdamW's 235M model at 49.2 on B and the lookup table at 39.7, "worse than all other models in
# Figure 3(a) on task B", while Table 2 has the same model at 55.7 on task C, above the whole
# range; and B.3 says Fig. 5 follows Section 2's setting, whose sizes figure (3a) is task B.
FIG5_TASK = "B"
PCFG_235M = "PCFG, 235M transformer, 4096 batch"
BOOKCORPUS = "BookCorpus, 330M transformer, GLUE fine-tuning (QNLI, SST-2, RTE)"
GLUE_ANALOGUE = "BookCorpus/GLUE claim, tested here on the PCFG task B probe"
GROWN_HEAD_NORM = TRACE_FISHER_GROWN + "_head_norm"  # measure.growth_compare=["head-norm"]

CLAIMS: tuple[Claim, ...] = (
    Claim("steps", "Fig. 2a (2.3)", "after the loss converges, accuracy keeps rising",
          acc("C"), +1, "rises", "PCFG, 41M, AdamW at a constant lr after warmup (A.5), task C"),
    Claim("sgd", "Fig. 4 left (4, B.2)", "under SGD, accuracy rises after the loss converges",
          acc("C"), +1, "+1.6 pts", "PCFG, 235M, SGD (B.2: 12% warmup, then 1e-3), task C",
          0.016, origin="4: 'the downstream performance improves by 1.6%' (PCFG)"),
    Claim("sgd", "Fig. 4 left (4, B.2)", "under SGD, Tr(H) falls after the loss converges",
          TRACE_FISHER, -1, "falls", "PCFG, 235M, SGD (B.2)", relative=True),
    Claim("sgd", "Fig. 10 (B.2)", "... and accuracy rises on task B", acc("B"), +1, "rises",
          "PCFG, SGD (B.2), task B"),
    Claim("sgd", "Fig. 10 (B.2)", "... and on task A", acc("A"), +1, "rises",
          "PCFG, SGD (B.2), task A"),
    Claim("sizes", "Fig. 3a (2.3)", "a larger model probes better at the same loss", acc("B"),
          +1, "+6.9 pts", "PCFG, Table 3 transformers in the saturation regime, AdamW, task B",
          0.069, origin="2.3: 'scaling up the models improves linear probe performance by 6.9%'"),
    Claim("sizes", "Fig. 8 (A.6)", "... and on task A", acc("A"), +1, "rises",
          "PCFG, Table 3 transformers in the saturation regime, AdamW, task A"),
    Claim("sizes", "Fig. 5 (4, B.3)", "a larger model is flatter, grown to one shape",
          TRACE_FISHER_GROWN, -1, "19.8 -> 12.6 (-36%)",
          "PCFG, models > 9M grown into Table 4's shape (B.4), AdamW", 12.6 / 19.8 - 1,
          relative=True, origin="4: 'decreases from 19.8 to 12.6'"),
    # The verdict depends on the growth construction (both preserve the function, not the
    # trace): the row above uses B.4.2's (embeddings halved), this one flatlm's head-norm.
    Claim("sizes", "Fig. 5 (4, B.3)", "... the same, grown by flatlm's head-norm construction",
          GROWN_HEAD_NORM, -1, "19.8 -> 12.6 (-36%)",
          "PCFG, models > 9M grown into Table 4's shape (B.4), AdamW; grown here by flatlm's "
          "construction, not B.4.2's (embeddings kept, the MLM head's LayerNorm divided by m)",
          12.6 / 19.8 - 1, relative=True, origin="4: 'decreases from 19.8 to 12.6'"),
    Claim("sizes", "Fig. 5 (4, B.3)", f"... while its probe accuracy rises (task {FIG5_TASK})",
          acc(FIG5_TASK), +1, "40.4 -> 50.5%",
          "PCFG, the same models; the task is not named (task B by its range, see FIG5_TASK)",
          0.101, origin="4: 'increase of linear probe accuracy from 40.4% to 50.5%'"),
    Claim("algorithms", "Table 1 (2.3)", "adversarial pre-training probes worse than AdamW",
          acc("B"), -1, "42.3 vs 49.2", f"{PCFG_235M}, task B", -0.069,
          compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 1 (2.3)", "... on task A", acc("A"), -1, "83.1 vs 89.9",
          f"{PCFG_235M}, task A", -0.068, compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 2 (4)", "... on task C", acc("C"), -1, "50.2 vs 55.7",
          f"{PCFG_235M}, task C", -0.055, compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 2 (4)", "adversarial pre-training is sharper", TRACE_FISHER, +1,
          "19.34 vs 8.01 (2.4x)", PCFG_235M, 19.34 / 8.01 - 1, relative=True,
          compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 1 (2.3)", "the lookup table probes worse than AdamW", "lookup:B",
          -1, "39.7 vs 49.2", f"{PCFG_235M}, task B", -0.095, compare=("lookup", "adamw")),
    Claim("algorithms", "Table 1 (2.3)", "... and on task A", "lookup:A", -1, "71.2 vs 89.9",
          f"{PCFG_235M}, task A", -0.187, compare=("lookup", "adamw")),
    Claim("algorithms", "Tables 1/2 (2.3, 4)", "no dropout / weight decay probes worse",
          acc("B"), -1, "QNLI -1.4, SST-2 -1.3, RTE -2.7 pts", BOOKCORPUS, -0.013,
          compare=("noreg", "adamw"), analogue=GLUE_ANALOGUE,
          origin="the smallest of the three GLUE differences"),
    Claim("algorithms", "Table 2 (4)", "no dropout / weight decay is sharper", TRACE_FISHER, +1,
          "34.91 vs 24.55 (+42%)", BOOKCORPUS, 34.91 / 24.55 - 1, relative=True,
          compare=("noreg", "adamw"), analogue="BookCorpus claim, tested here on PCFG"),
    Claim("algorithms", "Tables 1/2 (2.3, 4)", "SAM recovers the accuracy noreg loses",
          acc("B"), +1, "QNLI +1.4, SST-2 +0.6, RTE +2.3 pts", BOOKCORPUS, 0.006,
          compare=("sam", "noreg"), analogue=GLUE_ANALOGUE,
          origin="the smallest of the three GLUE differences"),
    Claim("algorithms", "Table 2 (4)", "SAM is flatter than noreg", TRACE_FISHER, -1,
          "22.15 vs 34.91 (-37%)", BOOKCORPUS, 22.15 / 34.91 - 1, relative=True,
          compare=("sam", "noreg"), analogue="BookCorpus claim, tested here on PCFG"),
)


# -- the rule ---------------------------------------------------------------------------------

def verdict(sign: int, ci: tuple[float, float], *, n: int, paper_effect: float | None,
            saturated: bool, same_loss: bool = True, rule: VerdictRule = DEFAULT_RULE) -> str:
    """The stated rule (module docstring). ``paper_effect`` is in the effect's units and signed
    as the paper reports it; ``ci`` is the interval of our effect."""
    if not saturated:
        return NOT_SATURATED
    if not same_loss:
        return LOSSES_DIFFER
    if n < rule.min_seeds:
        return too_few_seeds(rule.min_seeds)
    return interval_verdict(sign, ci, paper_effect)


def interval_verdict(sign: int, ci: tuple[float, float], paper_effect: float | None) -> str:
    """Steps 3-4 of the rule: where the interval lies against 0 and the paper's effect."""
    if not (np.isfinite(ci[0]) and np.isfinite(ci[1])):
        return NO_INTERVAL
    low, high = sorted((sign * ci[0], sign * ci[1]))
    if low > 0:
        return REPRODUCES
    if high < 0:
        return CONTRADICTS
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


def _value(df: pd.DataFrame, metric: str) -> pd.Series:
    if metric.startswith("lookup:"):
        return df[lookup(metric.split(":")[1])]
    return df[metric] if metric in df else pd.Series(np.nan, index=df.index)


def _change(after, before, relative: bool):
    return after / before - 1 if relative else after - before


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's last checkpoint."""
    return df.sort_values("step").groupby(RUN, sort=False).tail(1)


def saturated_window(run: pd.DataFrame, saturation: float = SATURATION) -> pd.DataFrame:
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
    values, unsaturated, spreads, kl_max = [], 0, [], 0.0
    runs = list(df.sort_values("step").groupby(RUN))
    for _, run in runs:
        window = saturated_window(run, rule.saturation)
        if len(window) < 2:
            unsaturated += 1
            window = run
        v = _value(window, metric)
        values.append(float(_change(v.iloc[-1], v.iloc[0], relative)))
        spreads.append(float(window[KL].max() - window[KL].min()))
        kl_max = max(kl_max, float(window[KL].max()))
    spread = max(spreads, default=np.nan)
    saturated = bool(runs) and unsaturated == 0
    note = (f"{len(runs) - unsaturated}/{len(runs)} runs end in a saturated window of >= 2 "
            f"checkpoints (KL <= {rule.saturation:g}); largest KL compared {kl_max:.3f}")
    return Effects(values, saturated, bool(spread <= rule.tol), kl_max, spread, note)


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
    values = _paired(final, "model", large, small, metric, relative)
    compared = final[final["model"].isin([small, large])][KL]
    note = (f"{large} vs {small} (largest KL {worst_kl[large]:.3f} vs {worst_kl[small]:.3f}); "
            f"{len(saturated)} model(s) saturated in every seed (KL <= {rule.saturation:g})")
    spread = float(compared.max() - compared.min())
    return Effects(values, ok, spread <= rule.tol, float(compared.max()), spread, note)


def algorithm_effects(df: pd.DataFrame, metric: str, treatment: str, control: str,
                      rule: VerdictRule = DEFAULT_RULE, relative: bool = False) -> Effects:
    """algorithms: per seed, metric(treatment) vs metric(control) at the final checkpoint;
    ``lookup`` is the lookup table measured in the control's trials (KL 0)."""
    final = final_rows(df)
    if control not in set(final["train.algorithm"]):
        return Effects([], False, False, np.nan, np.nan, f"no {control} runs")
    ctrl = final[final["train.algorithm"] == control]
    if treatment == "lookup":
        task = metric.split(":")[1]
        values = list(_change(_value(ctrl, metric), ctrl[acc(task)], relative))
        compared = pd.concat([ctrl[KL], pd.Series([0.0])])
    else:
        values = _paired(final, "train.algorithm", treatment, control, metric, relative)
        compared = final[final["train.algorithm"].isin([treatment, control])][KL]
    kl_max, spread = float(compared.max()), float(compared.max() - compared.min())
    note = (f"KL {treatment} {_kl_range(final, treatment)} vs {control} "
            f"{_kl_range(final, control)} (saturated: <= {rule.saturation:g})")
    return Effects(values, bool(values) and kl_max <= rule.saturation,
                   bool(values) and spread <= rule.tol, kl_max, spread, note)


def _kl_range(final: pd.DataFrame, algorithm: str) -> str:
    if algorithm == "lookup":
        return "0"
    kl = final.loc[final["train.algorithm"] == algorithm, KL]
    return f"{kl.min():.3f}-{kl.max():.3f}" if len(kl) else "n/a"


def _paired(final: pd.DataFrame, column: str, a, b, metric: str, relative: bool) -> list:
    """Per training seed: metric(column == a) vs metric(column == b)."""
    if metric.startswith("lookup:"):
        raise ValueError("the lookup table is compared through algorithm_effects")
    rows = final.assign(_v=_value(final, metric))
    values = rows.groupby(["train.seed", column])["_v"].mean().unstack(column)
    if a not in values or b not in values:
        return []
    return list(_change(values[a], values[b], relative).dropna())


def model_size(model: str) -> float:
    """Parameter count of a model name (orders the sizes)."""
    return float(parameter_count(parse_model(model), vocab_size=100, max_length=32))


# -- the table --------------------------------------------------------------------------------

def claim_effects(part: pd.DataFrame, claim: Claim, rule: VerdictRule) -> Effects:
    if claim.experiment in ("steps", "sgd"):
        return window_effects(part, claim.metric, rule, claim.relative)
    if claim.experiment == "sizes":
        return size_effects(part, claim.metric, rule, claim.relative)
    return algorithm_effects(part, claim.metric, *claim.compare, rule, claim.relative)


def claim_rows(df: pd.DataFrame, rule: VerdictRule = DEFAULT_RULE) -> pd.DataFrame:
    """One row per claim with data in ``df`` (one protocol's trials): the paper's attribution
    and effect, ours with its interval, what decided the verdict, and the verdict. A claim
    that compares an algorithm with no runs here has no data (not a row that would read "not
    saturated")."""
    rows = []
    for claim in CLAIMS:
        part = df[df["experiment"] == claim.experiment]
        if part.empty or not _measured(part, claim.metric) or _arm_not_run(part, claim):
            continue
        eff = claim_effects(part, claim, rule)
        mean, low, high, n = mean_ci(eff.values, rule.level)
        rows.append(claim_row(claim, eff, (mean, low, high, n), rule))
    return pd.DataFrame(rows)


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


def claim_row(claim: Claim, eff: Effects, summary: tuple, rule: VerdictRule) -> dict:
    mean, low, high, n = summary
    result = verdict(claim.sign, (low, high), n=n, paper_effect=claim.effect_size,
                     saturated=eff.saturated, same_loss=eff.same_loss, rule=rule)
    metric = claim.metric if claim.compare is None else compared_metric(claim.metric,
                                                                        *claim.compare)
    return {
        "experiment": claim.experiment, "figure": claim.figure, "claim": claim.statement,
        "metric": metric, "effect_unit": "relative" if claim.relative else "difference",
        "paper": claim.paper, "paper_setting": claim.setting,
        "paper_effect": np.nan if claim.effect_size is None else claim.effect_size,
        "paper_effect_origin": claim.origin, "analogue": claim.analogue, "sign": claim.sign,
        "effect": mean, "ci_low": low, "ci_high": high, "level": rule.level, "n": n,
        "min_seeds": rule.min_seeds, "saturation": rule.saturation, "tol": rule.tol,
        "kl_max": eff.kl_max, "kl_spread": eff.kl_spread, "saturated": eff.saturated,
        "same_loss": eff.same_loss, "paper_in_ci": paper_in_ci((low, high), claim.effect_size),
        "verdict": result, "decided_by": decided_by(eff, n, (low, high), claim.effect_size, rule),
        "note": eff.note, "seeds_to_resolve": seeds_to_resolve(eff.values, rule.level),
    }



def _saturation_part(eff: Effects, rule: VerdictRule) -> str:
    """The saturation check as the verdict saw it; an effect can be unsaturated with every
    compared KL below the bound when too few groups were saturated to compare (sizes: fewer
    than two models saturated in every seed)."""
    if not np.isfinite(eff.kl_max):
        return "no compared checkpoints"
    below = eff.kl_max <= rule.saturation
    text = f"largest compared KL {eff.kl_max:.4f} {'<=' if below else '>'} {rule.saturation:g}"
    return text + ("; too few saturated to compare" if below and not eff.saturated else "")

def decided_by(eff: Effects, n: int, ci: tuple[float, float], paper_effect: float | None,
               rule: VerdictRule) -> str:
    """What decided a verdict, in words: each check of the rule with the value it saw."""
    parts = [_saturation_part(eff, rule),
             f"KL spread {eff.kl_spread:.3f} {'<=' if eff.same_loss else '>'} {rule.tol:g}"
             if np.isfinite(eff.kl_spread) else "",
             f"n={n} {'>=' if n >= rule.min_seeds else '<'} {rule.min_seeds} seeds"]
    if np.isfinite(ci[0]):
        parts.append(f"{rule.level:.0%} CI [{ci[0]:+.4g}, {ci[1]:+.4g}]")
    if paper_effect is None:
        parts.append("paper: a direction only")
    else:
        inside = paper_in_ci(ci, paper_effect)
        where = "" if inside is None else (" (in the CI)" if inside else " (outside the CI)")
        parts.append(f"paper's effect {paper_effect:+.4g}{where}")
    return "; ".join(p for p in parts if p)


def _measured(df: pd.DataFrame, metric: str) -> bool:
    key = lookup(metric.split(":")[1]) if metric.startswith("lookup:") else metric
    return key in df and df[key].notna().any()
