"""What a sweep varies and how each quantity moves along it, in numbers: the facts that
``analysis.conclusion`` states. Pure pandas.

* ``sizes`` (the model varies): one group per model, smallest first (``n_params``);
* ``algorithms``: one group per algorithm, AdamW first;
* ``steps`` (only seeds vary, runs with several checkpoints): each run's first checkpoint in the
  saturation regime against its last;
* ``other`` (another param varies: a search): one group per value.

A group's value is the mean over its runs; its standard error is the measurement's own with one
run, the spread over runs (std / sqrt(n)) with several.

>>> rows = pd.DataFrame({"run_id": list("abc"), "model": ["big", "small", "small"],
...     "n_params": [9.0, 1.0, 1.0], "acc": [0.9, 0.7, 0.8], "acc_se": [0.01, 0.02, 0.02]})
>>> design(rows)
('sizes', 'model')
>>> group_means(rows, "model", ["acc"]).round(4).to_dict("index")
{'small': {'acc': 0.75, 'acc_se': 0.05, 'runs': 2}, 'big': {'acc': 0.9, 'acc_se': 0.01, 'runs': 1}}
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.checkpoints import RUN, varying_columns
from flatlm.measure import se_key
from flatlm.storage.metrics_log import N_PARAMS

KINDS = {"model": "sizes", "train.algorithm": "algorithms", "algorithm": "algorithms"}
CONTROL = "adamw"  # the algorithms' baseline, first in their order


def design(df: pd.DataFrame) -> tuple[str, str | None]:
    """(kind, the column that varies): ``sizes``, ``algorithms``, ``other`` or ``steps``
    (None: the runs differ by seed only), ``none`` when a run has one checkpoint."""
    varying = varying_columns(df, seeds=False)
    for field in varying:
        if field in KINDS:
            return KINDS[field], field
    if varying:
        return "other", varying[0]
    if not df.empty and df.groupby(RUN)["step"].nunique().max() > 1:
        return "steps", None
    return "none", None


def group_means(rows: pd.DataFrame, field: str, keys) -> pd.DataFrame:
    """Per value of ``field`` (in :func:`group_order`), per key of ``keys`` measured: the mean
    over the group's runs (``key``) and its s.e. (``key_se``, module docstring); ``runs``."""
    keys = [k for k in keys if k in rows and rows[k].notna().any()]
    out = {}
    for name, part in rows.groupby(rows[field].astype(str), sort=False):
        row = {}
        for key in keys:
            row[key], row[se_key(key)] = _mean_se(part, key)
        out[name] = {**row, "runs": part[RUN].nunique()}
    table = pd.DataFrame.from_dict(out, orient="index")
    return table.loc[group_order(rows, field, list(table.index))]


def group_order(rows: pd.DataFrame, field: str, names: list[str]) -> list[str]:
    """Models smallest first (by ``n_params``), algorithms AdamW first, else sorted."""
    if field == "model" and N_PARAMS in rows:
        size = rows.groupby(rows[field].astype(str))[N_PARAMS].mean()
        return sorted(names, key=lambda n: (size.get(n, math.inf), n))
    return sorted(names, key=lambda n: (n != CONTROL, n))


def _mean_se(part: pd.DataFrame, key: str) -> tuple[float, float]:
    values = part[key].dropna()
    if values.empty:
        return math.nan, math.nan
    if len(values) > 1:
        return float(values.mean()), float(values.std() / math.sqrt(len(values)))
    se = se_key(key)
    return float(values.iloc[0]), float(part.loc[values.index, se].iloc[0]) if se in part \
        else math.nan


def difference(groups: pd.DataFrame, a: str, b: str, key: str) -> tuple[float, float]:
    """(value, s.e.) of group ``a`` minus group ``b`` in ``key``."""
    if key not in groups or a not in groups.index or b not in groups.index:
        return math.nan, math.nan
    se = se_key(key)
    ses = groups.loc[[a, b], se] if se in groups else pd.Series([np.nan, np.nan])
    return (float(groups.loc[a, key] - groups.loc[b, key]),
            float(np.sqrt((ses.astype(float) ** 2).sum(min_count=2))))


def plateau(df: pd.DataFrame, inside: pd.Series, keys) -> pd.DataFrame:
    """Per run: the step and each key at its first checkpoint in the regime (``inside``, a
    mask) and at its last checkpoint: columns ``step first``, ``step last``, ``<key> first``,
    ``<key> last``, ``<key> change``, ``<key> change se`` (the two s.e.s in quadrature)."""
    out = {}
    for run, rows in df[inside].sort_values("step").groupby(RUN, sort=False):
        last = df[df[RUN] == run].sort_values("step").iloc[-1]
        first = rows.iloc[0]
        row = {"step first": first["step"], "step last": last["step"]}
        for key in (k for k in keys if k in df):
            row[f"{key} first"], row[f"{key} last"] = first[key], last[key]
            row[f"{key} change"] = last[key] - first[key]
            se = [float(r[se_key(key)]) if se_key(key) in r else np.nan for r in (first, last)]
            row[f"{key} change se"] = math.hypot(*se)
        out[run] = row
    return pd.DataFrame.from_dict(out, orient="index")


def mean_change(changes: pd.DataFrame, key: str) -> tuple[float, float]:
    """(mean, s.e.) over runs of ``key``'s change on the plateau: the spread over runs with
    several, the measurement's s.e. with one."""
    values = changes[f"{key} change"].dropna() if f"{key} change" in changes else pd.Series()
    if values.empty:
        return math.nan, math.nan
    if len(values) > 1:
        return float(values.mean()), float(values.std() / math.sqrt(len(values)))
    return float(values.iloc[0]), float(changes.loc[values.index[0], f"{key} change se"])
