"""Which checkpoint of each run a table or a figure reads, and how runs are named: pure pandas,
shared by the tables (``analysis.run_table``), the conclusion and the figures.

* :func:`final_checkpoints`: each run's last checkpoint.
* :func:`loss_matched`: each run's checkpoint at (nearly) one common loss, as the paper compares
  models and algorithms "at the same pre-training loss".
* :func:`varying_columns` / :func:`run_labels`: what tells the runs apart (model, algorithm,
  seed, any other param that varies), as column names and as one label per run.
"""

from __future__ import annotations

import math

import pandas as pd

from flatlm.measure import KL

RUN = "run_id"
# What tells runs apart first, in legend order; then any other param that varies.
LABEL_FIRST = ("model", "algorithm", "train.algorithm", "train.seed", "seed")
SEEDS = ("train.seed", "seed")


def final_checkpoints(df: pd.DataFrame) -> pd.DataFrame:
    """The last checkpoint (largest step) of each run."""
    if df.empty:
        return df
    return df.sort_values("step").groupby(RUN, sort=False).tail(1).sort_index()


def loss_matched(df: pd.DataFrame, kl_threshold: float | None = None
                 ) -> tuple[pd.DataFrame, float, list[str]]:
    """One checkpoint per run at (nearly) the same loss. The paper compares algorithms "at the
    same pre-training loss"; final checkpoints of runs that converge at different speeds are
    not that. The target is the lowest KL every run reached (the largest of the runs' smallest
    KLs); each run contributes its checkpoint whose KL is closest to it. With ``kl_threshold``
    a run that never got below it (a run that failed to fit) does not drag the target up for
    the others: it contributes its lowest-KL checkpoint and is listed as unmatched; and a run
    that did contributes a checkpoint below it, the closest of those (an earlier checkpoint
    above the rule may lie closer to the target, but it is not in the regime compared). Returns
    (those rows, the target, the unmatched runs' ids). Runs without a KL (a source without a
    truth, e.g. real text) give their final checkpoints, and the target NaN says so."""
    rows = df.dropna(subset=[KL]) if KL in df else df.iloc[:0]
    if rows.empty:
        return final_checkpoints(df), math.nan, []
    best = rows.groupby(RUN)[KL].min()
    fitted = best[best < kl_threshold] if kl_threshold is not None else best
    in_regime = not fitted.empty and kl_threshold is not None
    if fitted.empty:
        fitted = best
    target = float(fitted.max())
    gap = (rows[KL] - target).abs().where(rows[RUN].isin(fitted.index), rows[KL])
    if in_regime:  # a fitted run's checkpoints above the rule are not candidates
        gap = gap.mask(rows[RUN].isin(fitted.index) & (rows[KL] >= kl_threshold), math.inf)
    unmatched = sorted(set(best.index) - set(fitted.index))
    return rows.loc[gap.groupby(rows[RUN]).idxmin()].sort_index(), target, unmatched


def varying_columns(df: pd.DataFrame, *, seeds: bool = True) -> list[str]:
    """The columns of ``LABEL_FIRST`` and the params (``df.attrs["params"]``) whose value
    differs between runs, ``LABEL_FIRST`` first; the ``algorithm`` tag is dropped when the
    ``train.algorithm`` param says the same; ``seeds=False`` leaves the seeds out.

    >>> df = pd.DataFrame({"run_id": ["a", "b"], "model": ["m1", "m2"], "train.seed": [0, 0]})
    >>> varying_columns(df)
    ['model']
    """
    per_run = df.groupby(RUN, sort=False).first()
    params = [c for c in df.attrs.get("params", []) if c not in LABEL_FIRST]
    candidates = [c for c in (*LABEL_FIRST, *params) if c in per_run]
    varying = [c for c in candidates if per_run[c].dropna().astype(str).nunique() > 1]
    varying = [c for c in varying if not (c == "algorithm" and "train.algorithm" in varying)]
    return [c for c in varying if seeds or c not in SEEDS]


def run_labels(df: pd.DataFrame, max_fields: int = 3) -> pd.Series:
    """A label per row naming its run by what differs between the runs: the values of the (up
    to ``max_fields``) :func:`varying_columns`, ``model=d32-h2-l1-i128 algorithm=sam seed=1``,
    with the trial name added where runs share them; the trial name alone when nothing
    varies."""
    per_run = df.groupby(RUN, sort=False).first()
    varying = varying_columns(df)
    trial = per_run["trial"].astype(str) if "trial" in per_run else per_run.index.to_series()
    if not varying:
        return df[RUN].map(trial)
    names = per_run[varying[:max_fields]].astype(str).apply(
        lambda r: " ".join(f"{short_name(c)}={v}" for c, v in r.items()), axis=1)
    shared = names.duplicated(keep=False)
    names[shared] = names[shared] + " (" + trial[shared] + ")"
    return df[RUN].map(names)


def short_name(column: str) -> str:
    """``train.algorithm`` -> ``algorithm``: a param's last dotted part."""
    return column.rsplit(".", 1)[-1]
