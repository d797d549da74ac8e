"""Tables 1/2 of the report: accuracy by algorithm (and model), with loss, KL and flatness
columns, over each run's final checkpoint or, for Table 1, the checkpoint at the common loss
(``analysis.checkpoints.loss_matched``); the lookup table as the last row, as the paper prints
it. Each table comes with a line saying what it compares and at which loss.

**Equal loss** is a claim the table's line makes only when it holds: the matched checkpoints'
KLs lie within ``EQUAL_LOSS_SE`` standard errors of each other (the conclusion's rule,
``analysis.conclusion``). Otherwise the line says "at matched KL" and how far apart they are:
the paper compares "at the same pre-training loss", and KL 0.034 against 0.045 is not that.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.checkpoints import final_checkpoints, loss_matched, short_name
from analysis.correlate import to_markdown
from analysis.labels import is_accuracy, plain_name
from analysis.reach import DIRECTION_SE, gap_is_equal_loss
from flatlm.measure import ENTROPY, KL, LOSS, TRACE_FISHER, TRACE_HESSIAN, se_key

EQUAL_LOSS_SE = DIRECTION_SE  # KLs within this many s.e. of their gap: "equal loss"
UNITS = {KL: "nats/token", LOSS: "nats/token"}


def summary_table(df: pd.DataFrame, acc_key: str, *, by=("algorithm",),
                  keys=(LOSS, KL, TRACE_FISHER, TRACE_HESSIAN),
                  match_loss: bool = False, kl_threshold: float | None = None) -> pd.DataFrame:
    """Per group of ``by``: number of runs, then mean and std over runs of ``acc_key`` and
    ``keys`` at one checkpoint per run (columns ``<key> mean``, ``<key> std``): its final one,
    or with ``match_loss`` the one at the common loss of :func:`loss_matched` (the target KL in
    ``table.attrs["target_kl"]``, the groups of runs that never reached ``kl_threshold`` in
    ``table.attrs["unmatched"]``). ``attrs["kl_range"]``: the (low, high) KL of the rows read
    and ``attrs["kl_gap_se"]`` the standard error of their gap. When the runs measured the
    lookup table (``lookup/<task>/acc_mean``) a last row ``lookup table`` holds its accuracy
    (the true conditionals as features; loss = entropy, KL 0), as the paper's Table 1 does."""
    rows, target, unmatched = (loss_matched(df, kl_threshold) if match_loss
                               else (final_checkpoints(df), math.nan, []))
    out = _summary(rows, acc_key, by, keys)
    by = [b for b in by if b in rows]
    stuck = rows[rows["run_id"].isin(unmatched)]
    out.attrs["target_kl"] = target
    out.attrs["unmatched"] = (sorted({" ".join(map(str, r)) for r in
                                      stuck[by].itertuples(index=False)}) if by else unmatched)
    out.attrs["kl_range"], out.attrs["kl_gap_se"] = _kl_spread(
        rows[~rows["run_id"].isin(unmatched)])
    return out


def _kl_spread(rows: pd.DataFrame) -> tuple[tuple[float, float], float]:
    """((lowest, highest) KL of ``rows``, the s.e. of their difference); NaN without a KL."""
    if KL not in rows or rows[KL].notna().sum() == 0:
        return (math.nan, math.nan), math.nan
    kl = rows[KL].dropna()
    low, high = rows.loc[kl.idxmin()], rows.loc[kl.idxmax()]
    se = math.hypot(*(float(r.get(se_key(KL), math.nan)) for r in (low, high)))
    return (float(low[KL]), float(high[KL])), se


def equal_loss(kl_range: tuple[float, float], gap_se: float) -> bool:
    """Whether KLs ``kl_range`` apart are one loss: their gap within ``EQUAL_LOSS_SE`` s.e.

    >>> equal_loss((0.040, 0.041), 0.0017), equal_loss((0.034, 0.045), 0.0017)
    (True, False)
    """
    low, high = kl_range
    return gap_is_equal_loss(high - low, gap_se)


def _summary(final: pd.DataFrame, acc_key: str, by, keys) -> pd.DataFrame:
    cols = [k for k in (acc_key, *keys) if _has(final, k)]
    by = [b for b in by if b in final]
    if not by or final.empty:
        return pd.DataFrame(columns=[*by, "runs"])
    grouped = final.assign(**{b: final[b].astype(object).fillna("n/a") for b in by}).groupby(by)
    out = grouped.size().rename("runs").to_frame()
    for c in cols:
        out[f"{c} mean"] = grouped[c].mean()
        out[f"{c} std"] = grouped[c].std()
    return pd.concat([out.reset_index(), lookup_row(final, acc_key, by)], ignore_index=True)


def lookup_row(final: pd.DataFrame, acc_key: str, by) -> pd.DataFrame:
    """The lookup table's row. Every run of one source measures the same lookup table: one
    measurement repeated, whose spread over runs is 0 by construction. Its row then shows the
    measurement's own s.e. (``<acc> se``) and no run count; runs on sources whose lookup
    tables differ show their mean ± std over runs."""
    lookup = acc_key.replace("probe/", "lookup/", 1)
    if not acc_key.startswith("probe/") or not _has(final, lookup):
        return pd.DataFrame()
    values = final[lookup].dropna()
    one = values.round(12).nunique() == 1
    row = {b: "lookup table" for b in by[:1]}
    row.update({b: "" for b in by[1:]})
    row.update({"runs": math.nan if one else float(len(values)),
                f"{acc_key} mean": float(values.mean()),
                f"{acc_key} std": math.nan if one else float(values.std()),
                f"{KL} mean": 0.0})
    if one and _has(final, se_key(lookup)):
        row[f"{acc_key} se"] = float(final[se_key(lookup)].dropna().iloc[0])
    if _has(final, ENTROPY) and LOSS in final:
        row[f"{LOSS} mean"] = final[ENTROPY].mean()
    return pd.DataFrame([row])


def summary_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """``summary_table`` with each ``mean``/``std`` pair shown as ``mean ± std`` (a measurement
    shown with its own s.e. says so: ``0.973 ± 0.005 s.e.``), under headers that name what the
    columns hold: ``algorithm``, ``task B probe accuracy``, ``KL (nats/token)``."""
    shown = pd.DataFrame(index=table.index)
    for c in table.columns:
        if c.endswith((" std", " se")):
            continue
        if c == "runs":
            shown["runs"] = [_count(v) for v in table[c]]
        elif c.endswith(" mean"):
            key = c.removesuffix(" mean")
            places = 0 if key == "step" else digits  # a training step is a whole number
            shown[header(key)] = [_pm(m, s, e, places) for m, s, e in zip(
                table[c], _column(table, f"{key} std"), _column(table, f"{key} se"),
                strict=True)]
        else:
            shown[short_name(c)] = table[c]
    return to_markdown(shown, digits)


def header(key: str) -> str:
    """A table column's name: the metric in words, with its unit (accuracy as a fraction)."""
    if is_accuracy(key):
        return plain_name(key)
    if key in (KL, LOSS):
        return f"{'KL' if key == KL else 'loss'} ({UNITS[key]})"
    return "step" if key == "step" else plain_name(key).split(",")[0]


def table_rule(summary: pd.DataFrame, what: str) -> str:
    """The line above a summary table: ``what`` it compares (``task A probe accuracy by model
    and algorithm``), at which checkpoint, and whether that is at equal loss."""
    target = summary.attrs.get("target_kl", math.nan)
    if math.isnan(target):
        return f"{what}, final checkpoint of each run: mean ± std over runs."
    low, high = summary.attrs.get("kl_range", (math.nan, math.nan))
    se = summary.attrs.get("kl_gap_se", math.nan)
    if equal_loss((low, high), se):
        where = (f"at equal loss (KL {low:.3g} to {high:.3g} nats/token, within "
                 f"{EQUAL_LOSS_SE:g} s.e.)")
    else:
        apart = f", {(high - low) / se:.0f} s.e. apart" if se > 0 else ""
        where = (f"at matched KL (not equal: KL {low:.3g} vs {high:.3g} nats/token{apart}; "
                 f"equal loss would be within {EQUAL_LOSS_SE:g} s.e.)")
    text = (f"{what}, {where}: each run's checkpoint whose KL is closest to {target:.3g}, the "
            "lowest KL every run in the regime reached (the `step` column says where); mean ± "
            "std over runs.")
    if summary.attrs.get("unmatched"):
        text += (f" Not at that loss: {', '.join(summary.attrs['unmatched'])}, whose runs never "
                 "reached the regime; their rows are their lowest-KL checkpoints.")
    return text


def _column(table: pd.DataFrame, name: str) -> list:
    return list(table[name]) if name in table else [math.nan] * len(table)


def _count(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(int(v))


def _has(df: pd.DataFrame, key: str) -> bool:
    return key in df and df[key].notna().any()


def _missing(v) -> bool:
    return v is None or (isinstance(v, float | np.floating) and math.isnan(v))


def _pm(mean, std, se, digits: int) -> str:
    if _missing(mean):
        return ""
    if not _missing(std):
        return f"{mean:.{digits}f} ± {std:.{digits}f}"
    if not _missing(se):
        return f"{mean:.{digits}f} ± {se:.{digits}f} s.e."
    return f"{mean:.{digits}f}"
