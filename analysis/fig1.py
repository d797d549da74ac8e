"""Fig. 1 as a claim: among saturated checkpoints, does the flatter model probe better once the
loss is accounted for?

The paper's Fig. 1 plots task-B accuracy against Tr(H) for AdamW models of several sizes and
steps whose losses lie within 0.004 nats, and calls the correlation strong. Here it is the
**partial correlation** of the flatness measure with the accuracy given the KL (both regressed
on the KL; the residuals correlated; Spearman by default, on ranks), over the checkpoints in the
**saturated window** (KL <= ``VerdictRule.saturation``), on measures in **one
parameterisation**: Tr(F) of one model shape at a time (``model``), or Tr(F) grown into one
shape (``flat/trace_fisher_grown``, one group per ``measure.grow*`` setting). Traces of different
shapes are never pooled: their scale differs by construction, not by flatness.

The interval is a cluster bootstrap over runs (a run's checkpoints share its initialisation and
data); each row states the number of runs, of checkpoints, and of distinct resamples. Below
``min_runs`` runs (default 5) the row gives r and no interval, and no verdict.

The paper gives no size for the correlation ("strong"), so an interval that contains 0 reads
``inconclusive (paper states no size)``.
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
from analysis.correlate import partial_correlation_ci
from analysis.same_training import merge_same_training
from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN

MIN_RUNS = 5  # fewer runs: no interval is claimed (a bootstrap over few clusters is too narrow)
SIGN = -1  # flatter (smaller trace) -> better: a negative correlation


@dataclass(frozen=True)
class Fig1Settings:
    """The choices the Fig. 1 row depends on."""

    task: str = "B"  # Fig. 1's caption: PCFG task B
    algorithm: str | None = "adamw"  # Fig. 1's models are AdamW's (2.2); None: every run
    method: str = "spearman"  # partial Spearman (ranks) or pearson
    n_boot: int = 1000
    seed: int = 0
    min_runs: int = MIN_RUNS

    def __post_init__(self):
        if self.method not in ("spearman", "pearson"):
            raise ValueError(f"Fig1Settings.method={self.method!r}: use 'spearman' or 'pearson'")
        if self.min_runs < 2:
            raise ValueError(f"Fig1Settings.min_runs={self.min_runs}: a cluster bootstrap needs "
                             ">= 2 runs (default 5)")


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
                                 method=settings.method, n_boot=settings.n_boot,
                                 level=rule.level, seed=settings.seed)
    saturated = len(inside) >= 4 and res["runs"] >= 2
    enough = res["runs"] >= settings.min_runs
    low, high = (res["ci_low"], res["ci_high"]) if enough else (np.nan, np.nan)
    if not saturated:
        result = NOT_SATURATED
    elif not enough:
        result = f"inconclusive (runs < {settings.min_runs})"
    else:
        result = interval_verdict(SIGN, (low, high), None)
    spread = float(inside[KL].max() - inside[KL].min()) if len(inside) else np.nan
    note = (f"{res['n']} of {len(group)} checkpoints saturated (KL <= {rule.saturation:g}), "
            f"{res['runs']} runs; cluster bootstrap: {settings.n_boot} resamples of runs, "
            f"{res['distinct']} distinct")
    decided = (f"{res['n']} saturated checkpoints of {res['runs']} runs "
               f"({'>=' if enough else '<'} {settings.min_runs}); KL spread {spread:.3f}"
               + (f"; {rule.level:.0%} CI [{low:+.3f}, {high:+.3f}]" if np.isfinite(low) else "")
               + "; paper: 'strong', no size")
    return {
        "experiment": "all", "figure": "Fig. 1 (1, 4)",
        "claim": "among saturated checkpoints, the flatter probes better given the loss",
        "metric": f"partial {settings.method}({measure}, {key} given {KL}), {label}",
        "effect_unit": "correlation", "paper": "strong",
        "paper_setting": "PCFG, AdamW models of several sizes and steps, loss 3.204-3.208, "
                         "task B",
        "paper_effect": np.nan, "paper_effect_origin": "", "analogue": "", "sign": SIGN,
        "effect": res["r"], "ci_low": low, "ci_high": high, "level": rule.level,
        "n": res["runs"], "min_seeds": settings.min_runs, "saturation": rule.saturation,
        "tol": rule.tol, "kl_max": float(inside[KL].max()) if len(inside) else np.nan,
        "kl_spread": spread, "saturated": saturated, "same_loss": saturated,
        "paper_in_ci": None, "verdict": result, "decided_by": decided, "note": note,
        "seeds_to_resolve": np.nan, "checkpoints": res["n"], "resamples_distinct":
            res["distinct"],
    }
