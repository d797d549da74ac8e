"""Fig. 1 as a claim: among saturated checkpoints, does the flatter model probe better once the
loss is accounted for?

The paper's Fig. 1 plots task-B accuracy against Tr(H) for AdamW models of several sizes and
steps whose losses lie within 0.004 nats, and calls the correlation strong. Here it is the
**partial correlation** of the flatness measure with the accuracy given the KL (both regressed
on the KL; the residuals correlated; Spearman by default: the measure, the accuracy and the KL
are ranked first, then the ranks regressed), over the **saturated checkpoints**: every
checkpoint at KL <= ``VerdictRule.saturation``, not only a run's final stretch, on measures in
**one
parameterisation**: Tr(F) of one model shape at a time (``model``), or Tr(F) grown into one
shape (``flat/trace_fisher_grown``, one group per ``measure.grow*`` setting). Traces of different
shapes are never pooled: their scale differs by construction, not by flatness.

The interval is a cluster bootstrap over runs (a run's checkpoints share its initialisation and
data): the percentile interval, p as in ``analysis/correlate.py`` (2 min(P*(r <= 0), P*(r >=
0)), +1 smoothed; a resample at 0 up to rounding is a tie, counted on both sides). A *run* is a
training, not a trial: trials of one training (``analysis/same_training.py``: the steps, sizes
and AdamW trials of one seed) are one run with the union of their checkpoints. Each row states
the number of runs, of checkpoints, and of distinct resamples. Below
``min_runs`` runs (default 5) the row gives r and no interval, and no verdict.

The paper gives no size for the correlation ("strong"), so an interval that contains 0 reads
``inconclusive (paper states no size)``.

**Constant accuracy.** At the ceiling a resample can draw only checkpoints of one accuracy (all
100%), where the correlation is 0/0. Dropping those resamples (the old rule) keeps only the
draws where accuracy happens to vary, which narrowed an interval to one side of 0 that the data
do not support. The rule (``Fig1Settings``): such a resample counts as r = 0
(``constant_as_zero``), the value of a sample that carries no association, so the interval and
the p-value count it; and when more than ``max_constant_share`` (5%) of the resamples are
constant and the interval then contains 0, the row reads ``inconclusive (ceiling)``: the
interval reaches 0 because the accuracy does not vary, which is the ceiling, not an absence of
the paper's association. An interval that excludes 0 keeps its verdict (``analysis/claims.py``,
step 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.claims import (
    DEFAULT_RULE,
    NOT_SATURATED,
    RUN,
    VerdictRule,
    acc,
    interval_verdict,
)
from analysis.correlate import Bootstrap, partial_correlation_ci
from analysis.room import CEILING
from analysis.same_training import merge_same_training
from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN

MIN_RUNS = 5  # fewer runs: no interval is claimed (a bootstrap over few clusters is too narrow)
SIGN = -1  # flatter (smaller trace) -> better: a negative correlation
MAX_CONSTANT_SHARE = 0.05  # a larger share of constant-accuracy resamples: at the ceiling


@dataclass(frozen=True)
class Fig1Settings:
    """The choices the Fig. 1 row depends on."""

    task: str = "B"  # Fig. 1's caption: PCFG task B
    algorithm: str | None = "adamw"  # Fig. 1's models are AdamW's (2.2); None: every run
    method: str = "spearman"  # partial Spearman (ranks) or pearson
    n_boot: int = 1000
    seed: int = 0
    min_runs: int = MIN_RUNS
    constant_as_zero: bool = True  # a constant-accuracy resample counts as r = 0 (else dropped)
    max_constant_share: float = MAX_CONSTANT_SHARE  # more constant resamples: at the ceiling

    def __post_init__(self):
        if self.method not in ("spearman", "pearson"):
            raise ValueError(f"Fig1Settings.method={self.method!r}: use 'spearman' or 'pearson'")
        if self.min_runs < 2:
            raise ValueError(f"Fig1Settings.min_runs={self.min_runs}: a cluster bootstrap needs "
                             ">= 2 runs (default 5)")
        if not 0 <= self.max_constant_share <= 1:
            raise ValueError(f"Fig1Settings.max_constant_share={self.max_constant_share}: give "
                             "a share in [0, 1] (default 0.05)")


DEFAULT_FIG1 = Fig1Settings()


def parameterisations(df: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(measure, group label, rows) for each measure in one parameterisation: Tr(F) per model
    shape; grown Tr(F) per growth setting (every ``measure.grow*`` column)."""
    out = []
    if TRACE_FISHER in df and "model" in df:
        for model, rows in df[df[TRACE_FISHER].notna()].groupby("model"):
            out.append((TRACE_FISHER, f"model {model}", rows))
    if TRACE_FISHER_GROWN in df:
        grown = df[df[TRACE_FISHER_GROWN].notna()]
        # growth_compare names extra keys (flat/*_grown_<name>), not this measure's setting
        keys = sorted(c for c in grown if c.startswith("measure.grow")
                      and c != "measure.growth_compare")
        grown = grown.assign(**{k: grown[k].map(_hashable) for k in keys})
        groups = grown.groupby(keys, dropna=False) if keys else [((), grown)]
        for values, rows in groups:
            if rows.empty:
                continue
            values = values if isinstance(values, tuple) else (values,)
            label = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))
            out.append((TRACE_FISHER_GROWN, f"grown ({label})" if label else "grown", rows))
    return out


def _hashable(value):
    """A config cell as a group key: lists (a JSON list param) as their text."""
    return str(value) if isinstance(value, list | dict) else value


def fig1_rows(df: pd.DataFrame, rule: VerdictRule = DEFAULT_RULE,
              settings: Fig1Settings = DEFAULT_FIG1) -> pd.DataFrame:
    """One claim row (``analysis.claims.claim_rows``'s columns) per parameterisation with any
    checkpoint of the chosen algorithm measured: the partial correlation and its verdict."""
    key = acc(settings.task)
    if key not in df or KL not in df:
        return pd.DataFrame()
    # a training repeated by two experiments (the steps and sizes trials of one seed) is one
    # run of the bootstrap, with the union of its checkpoints
    part, _ = merge_same_training(df)
    if settings.algorithm is not None and "train.algorithm" in part:
        part = part[part["train.algorithm"] == settings.algorithm]
    rows = [_row(measure, label, group, key, rule, settings)
            for measure, label, group in parameterisations(part)]
    return pd.DataFrame(rows)


def _row(measure: str, label: str, group: pd.DataFrame, key: str, rule: VerdictRule,
         settings: Fig1Settings) -> dict:
    inside = group[group[KL] <= rule.saturation][[measure, key, KL, RUN]].dropna()
    res = partial_correlation_ci(inside[measure], inside[key], inside[KL], inside[RUN],
                                 method=settings.method,
                                 boot=Bootstrap(settings.n_boot, rule.level, settings.seed),
                                 constant_as=0.0 if settings.constant_as_zero else None)
    saturated = len(inside) >= 4 and res["runs"] >= 2
    enough = res["runs"] >= settings.min_runs
    low, high = (res["ci_low"], res["ci_high"]) if enough else (np.nan, np.nan)
    share = res["constant"] / settings.n_boot if settings.n_boot else 0.0
    bound = CEILING if share > settings.max_constant_share else ""
    if not saturated:
        result = NOT_SATURATED
    elif not enough:
        result = f"inconclusive (runs < {settings.min_runs})"
    else:
        result = interval_verdict(SIGN, (low, high), None, bound)
    spread = float(inside[KL].max() - inside[KL].min()) if len(inside) else np.nan
    return {**_paper_columns(measure, label, key, settings),
            "effect": res["r"], "ci_low": low, "ci_high": high, "level": rule.level,
            "n": res["runs"], "p_value": res["p"] if enough else np.nan, "bound": bound,
            "min_seeds": settings.min_runs, "saturation": rule.saturation, "tol": rule.tol,
            "kl_max": float(inside[KL].max()) if len(inside) else np.nan,
            "kl_spread": spread, "saturated": saturated, "same_loss": saturated,
            "paper_in_ci": None, "verdict": result,
            "decided_by": _decided_by(res, enough, spread, (low, high), share, rule, settings),
            "note": _note(res, len(group), rule, settings), "seeds_to_resolve": np.nan,
            "checkpoints": res["n"], "resamples_distinct": res["distinct"],
            "resamples_constant": res["constant"]}


def _paper_columns(measure: str, label: str, key: str, settings: Fig1Settings) -> dict:
    return {
        "experiment": "all", "figure": "Fig. 1 (1, 4)",
        "claim": "among saturated checkpoints, the flatter probes better given the loss",
        "metric": f"partial {settings.method}({measure}, {key} given {KL}), {label}",
        "effect_unit": "correlation", "paper": "strong",
        "paper_setting": "PCFG, AdamW models of several sizes and steps, loss 3.204-3.208, "
                         "task B",
        "paper_effect": np.nan, "paper_effect_origin": "", "analogue": "", "sign": SIGN}


def _decided_by(res: dict, enough: bool, spread: float, ci: tuple, share: float,
                rule: VerdictRule, settings: Fig1Settings) -> str:
    constant = (f"; {share:.1%} of resamples at constant accuracy "
                f"({'counted as r = 0' if settings.constant_as_zero else 'dropped'}; "
                f"{'>' if share > settings.max_constant_share else '<='} "
                f"{settings.max_constant_share:.0%}"
                f"{': at its ceiling' if share > settings.max_constant_share else ''})")
    return (f"{res['n']} saturated checkpoints of {res['runs']} runs "
            f"({'>=' if enough else '<'} {settings.min_runs}); KL spread {spread:.3f}"
            + (f"; {rule.level:.0%} CI [{ci[0]:+.3f}, {ci[1]:+.3f}]" if np.isfinite(ci[0])
               else "")
            + constant + "; paper: 'strong', no size")


def _note(res: dict, checkpoints: int, rule: VerdictRule, settings: Fig1Settings) -> str:
    return (f"{res['n']} of {checkpoints} checkpoints saturated (KL <= {rule.saturation:g}), "
            f"{res['runs']} runs; cluster bootstrap: {settings.n_boot} resamples of runs, "
            f"{res['distinct']} distinct, {res['constant']} at constant accuracy")
