"""The table a sweep ends with, one row per run: KL, each probed task's accuracy, Tr(F) and
grown Tr(F), each +- its standard error; then the reference rows every trial measures (the same
probe on a randomly initialised model of the run's shape, on the lookup table, and the majority
class). Read at the final checkpoints and at matched loss (``analysis.checkpoints``), with the
runs a reading leaves out named, each with the reason. Pure pandas.

>>> rows = pd.DataFrame({"run_id": ["a", "b"], "model": ["m1", "m2"], "step": [9, 9],
...     "pretrain/kl": [0.02, 0.01], "pretrain/kl_se": [0.001, 0.001],
...     "probe/A/acc_mean": [0.9, 0.95], "probe/A/acc_se": [0.01, 0.01],
...     "random_init/A/acc_mean": [0.8, 0.85], "probe/A/majority_acc": [0.5, 0.5]})
>>> print(render(run_table(rows, "probe/A/acc_mean")))
| run                  | step | KL              | A             |
|----------------------|------|-----------------|---------------|
| model=m1             | 9    | 0.0200 ± 0.0010 | 0.900 ± 0.010 |
| model=m2             | 9    | 0.0100 ± 0.0010 | 0.950 ± 0.010 |
| random-init model=m1 |      |                 | 0.8000        |
| random-init model=m2 |      |                 | 0.8500        |
| majority class       |      |                 | 0.5000        |
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.checkpoints import (
    RUN,
    SEEDS,
    final_checkpoints,
    loss_matched,
    run_labels,
    short_name,
    varying_columns,
)
from analysis.correlate import saturated, saturation_rule
from analysis.effects import group_means
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_FISHER_GROWN, probe_key, se_key
from flatlm.storage.metrics_log import N_PARAMS

SE = " se"  # a shown quantity's standard-error column: "KL se"
REFERENCES = (("random_init", "random-init"), ("lookup", "lookup table"))
MAJORITY = "majority class"


def probed_tasks(columns) -> list[str]:
    """The tasks with a linear-probe accuracy (``probe/<task>/acc_mean``) among ``columns``."""
    return sorted({c.split("/")[1] for c in columns
                   if c.startswith("probe/") and c.endswith("/acc_mean")})


NAMES = {KL: "KL", LOSS: "loss", TRACE_FISHER: "Tr(F)", TRACE_FISHER_GROWN: "grown Tr(F)"}


def task_name(key: str) -> str:
    """A column's short name in the table: ``probe/A/acc_mean`` -> ``A``, ``flat/trace_fisher``
    -> ``Tr(F)``; another key as it is."""
    if key.startswith("probe/") and key.endswith("/acc_mean"):
        return key.split("/")[1]
    return NAMES.get(key, key)


def quantities(df: pd.DataFrame, acc_key: str) -> dict[str, str]:
    """Shown name -> metric key of what the table shows, those measured: KL (the loss when
    the source has no truth), ``acc_key`` and every probed task, Tr(F), grown Tr(F)."""
    keys = [KL if _has(df, KL) else LOSS, acc_key, *(probe_key(t) for t in probed_tasks(df)),
            TRACE_FISHER, TRACE_FISHER_GROWN]
    return {task_name(key): key for key in dict.fromkeys(keys) if _has(df, key)}


def run_table(rows: pd.DataFrame, acc_key: str) -> pd.DataFrame:
    """One row per run of ``rows`` (one checkpoint each), smallest model first, then the
    reference rows. Columns ``run, step`` and, per shown quantity, its value and ``<name> se``."""
    names = quantities(rows, acc_key)
    rows = rows.loc[_order(rows)]
    columns = {"run": run_labels(rows).to_numpy(), "step": rows["step"].to_numpy(float)}
    for name, key in names.items():
        columns[name] = rows[key].to_numpy(float)
        columns[name + SE] = _column(rows, se_key(key))
    table = pd.DataFrame(columns)
    return pd.concat([table, reference_rows(rows, names)], ignore_index=True)


def seed_means(rows: pd.DataFrame, acc_key: str) -> pd.DataFrame | None:
    """One row per group of runs that differ by seed only (``rows``: one checkpoint per run):
    the mean over its runs of each shown quantity and its s.e. (the spread over seeds,
    ``analysis.effects.group_means``), named by what the group varies with ``(n runs)``;
    None when no group has two runs."""
    fields = varying_columns(rows, seeds=False)
    if not any(c in SEEDS for c in varying_columns(rows)):
        return None
    names = quantities(rows, acc_key)
    label = (rows[fields].astype(str).apply(
        lambda r: " ".join(f"{short_name(c)}={v}" for c, v in r.items()), axis=1)
        if fields else pd.Series("all runs", index=rows.index))
    keep = [c for c in dict.fromkeys([RUN, N_PARAMS, *names.values(),
                                      *map(se_key, names.values())]) if c in rows]
    groups = group_means(rows[keep].assign(_group=label), "_group", list(names.values()))
    if (groups["runs"] < 2).all():
        return None
    columns = {"run": [f"{g} ({n} runs)" for g, n in groups["runs"].items()]}
    for name, key in names.items():
        columns[name] = groups[key].to_numpy(float)
        columns[name + SE] = groups[se_key(key)].to_numpy(float)
    return pd.DataFrame(columns)


def reference_rows(rows: pd.DataFrame, names: dict[str, str]) -> pd.DataFrame:
    """The reference rows beside ``rows``' runs: random-init and the lookup table (one row per
    distinct value, named by what its runs share: ``random-init model=d16-h1-l1-i64``), then
    the majority class. The lookup table's KL is 0 (it is the truth)."""
    out = []
    for stage, title in REFERENCES:
        keys = {n: k.replace("probe/", f"{stage}/", 1) for n, k in names.items()
                if k.startswith("probe/")}
        extra = {"KL": 0.0} if stage == "lookup" and "KL" in names else {}
        out += _distinct_rows(rows, keys, title, extra, with_se=True)
    keys = {n: k.replace("/acc_mean", "/majority_acc") for n, k in names.items()
            if k.startswith("probe/")}
    out += _distinct_rows(rows, keys, MAJORITY, {}, with_se=False)
    return pd.DataFrame(out)


def _distinct_rows(rows, keys: dict[str, str], title: str, extra: dict, *,
                   with_se: bool) -> list[dict]:
    keys = {n: k for n, k in keys.items() if _has(rows, k)}
    if not keys:
        return []
    values = pd.DataFrame({n: rows[k].to_numpy(float) for n, k in keys.items()},
                          index=rows[RUN].to_numpy())
    groups = values.round(12).astype(str).agg("|".join, axis=1)
    out = []
    for _, members in values.groupby(groups.to_numpy(), sort=False):
        first = rows[rows[RUN] == members.index[0]].iloc[0]
        label = _shared_label(rows, set(members.index))
        row = {"run": f"{title} {label}".strip(), **extra, **members.iloc[0].to_dict()}
        if with_se:
            row.update({n + SE: _value(first, se_key(k)) for n, k in keys.items()})
        out.append(row)
    return out


def _shared_label(rows: pd.DataFrame, members: set) -> str:
    """What the runs ``members`` have in common that the others do not share: the varying
    fields constant among them; "" when they are all the runs."""
    if members == set(rows[RUN]):
        return ""
    mine = rows[rows[RUN].isin(members)]
    fields = [c for c in varying_columns(rows) if mine[c].astype(str).nunique() == 1]
    return " ".join(f"{short_name(c)}={mine[c].iloc[0]}" for c in fields)


def left_out(df: pd.DataFrame, acc_key: str, *, kl_threshold: float | None = None,
             loss_tolerance: float | None = None) -> pd.DataFrame:
    """``run, reason`` of each run the regime's reading (the correlations, the matched-loss
    table) leaves out: no checkpoint in the saturation regime, or none there with ``acc_key``."""
    rule = dict(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)
    if kl_threshold is None and loss_tolerance is None:
        return pd.DataFrame(columns=["run", "run_id", "reason"])
    inside = saturated(df, **rule)
    words = saturation_rule(**rule, df=df)
    labels = run_labels(df)
    out = []
    for run, rows in df.groupby(RUN, sort=False):
        reason = _reason(rows, inside.loc[rows.index], acc_key, words)
        if reason:
            out.append((labels.loc[rows.index[0]], run, reason))
    return pd.DataFrame(out, columns=["run", "run_id", "reason"])


def _reason(rows: pd.DataFrame, inside: pd.Series, acc_key: str, rule: str) -> str:
    status = rows["status"].iloc[-1] if "status" in rows else None
    ended = f"; its run ended {status}" if isinstance(status, str) and status != "FINISHED" \
        else ""
    if not inside.any():
        return f"no checkpoint in the saturation regime ({rule}): {_closest(rows)}{ended}"
    if acc_key not in rows or rows.loc[inside, acc_key].isna().all():
        return f"no {acc_key} measured in the regime{ended}"
    return ""


def _closest(rows: pd.DataFrame) -> str:
    if _has(rows, KL):
        return f"its smallest KL {rows[KL].min():.3g} nats"
    if _has(rows, LOSS):
        return f"its lowest loss {rows[LOSS].min():.4g} nats"
    return "no loss measured"


def matched_rows(df: pd.DataFrame, excluded, kl_threshold: float | None
                 ) -> tuple[pd.DataFrame, float]:
    """Each run's checkpoint nearest the common KL (``loss_matched``) and that KL, over the
    runs not ``excluded`` (their ids): a run outside the regime does not set the target."""
    kept = df[~df[RUN].isin(set(excluded))]
    rows, target, _ = loss_matched(kept, kl_threshold)
    return rows, target


# -- text -------------------------------------------------------------------------------------

def render(table: pd.DataFrame) -> str:
    """``run_table`` as an aligned Markdown table: each value with its s.e. (``0.931 ± 0.006``,
    the value to the s.e.'s second significant digit), a step as a whole number, a missing
    value blank. Columns with no value are left out."""
    shown = [c for c in table.columns if not c.endswith(SE) and table[c].notna().any()]
    cells = [[_cell(table, i, c) for c in shown] for i in range(len(table))]
    widths = [max(len(c), *(len(r[j]) for r in cells)) for j, c in enumerate(shown)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths,  # noqa: E731
                                                                          strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(shown), rule, *(line(r) for r in cells)])


def _cell(table: pd.DataFrame, i: int, column: str) -> str:
    value = table[column].iloc[i]
    if column == "run":
        return str(value)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if column == "step":
        return str(int(value))
    se = table[column + SE].iloc[i] if column + SE in table else math.nan
    return plus_minus(float(value), float(se))


def plus_minus(value: float, se: float) -> str:
    """``value ± se`` with the s.e. to two significant digits and the value to as many
    decimals; without an s.e., four significant digits.

    >>> plus_minus(0.93146, 0.00612), plus_minus(12.345, 0.41), plus_minus(0.5, math.nan)
    ('0.9315 ± 0.0061', '12.35 ± 0.41', '0.5000')
    """
    if not math.isfinite(se) or se <= 0:
        return f"{value:#.4g}" if value != 0 else "0"
    places = max(0, min(6, 1 - math.floor(math.log10(se))))
    return f"{value:.{places}f} ± {se:.{places}f}"


# -- helpers ----------------------------------------------------------------------------------

def _has(df: pd.DataFrame, key: str) -> bool:
    return key in df and df[key].notna().any()


def _column(rows: pd.DataFrame, key: str) -> np.ndarray:
    return rows[key].to_numpy(float) if key in rows else np.full(len(rows), np.nan)


def _value(row: pd.Series, key: str) -> float:
    return float(row[key]) if key in row and pd.notna(row[key]) else math.nan


def _order(rows: pd.DataFrame) -> pd.Index:
    """Smallest model first (``n_params``), then by label."""
    labels = run_labels(rows)
    size = rows[N_PARAMS] if N_PARAMS in rows else pd.Series(0.0, index=rows.index)
    key = pd.DataFrame({"size": size.fillna(0).to_numpy(), "label": labels.to_numpy()},
                       index=rows.index)
    return key.sort_values(["size", "label"], kind="stable").index


# -- the sweep's closing tables ---------------------------------------------------------------

LEGEND = {"KL": "KL to the truth in nats", "loss": "pre-training loss in nats",
          "Tr(F)": "Tr(F): Fisher trace in the run's own shape",
          "grown Tr(F)": "grown Tr(F): in one common shape"}


def legend(names: dict[str, str]) -> str:
    """What the table's columns are, in words."""
    tasks = [n for n, k in names.items() if k.startswith("probe/")]
    words = ["value ± standard error", *(LEGEND[n] for n in names if n in LEGEND and n in
                                        ("KL", "loss"))]
    if tasks:
        words.append(f"{', '.join(tasks)}: linear-probe accuracy")
    words += [LEGEND[n] for n in ("Tr(F)", "grown Tr(F)") if n in names]
    return "; ".join(words)


def glance(df: pd.DataFrame, acc_key: str, *, kl_threshold: float | None = None,
           loss_tolerance: float | None = None) -> str:
    """The per-run tables at the final checkpoints and at matched loss, and the runs left
    out with the reason, as text (Markdown)."""
    final = final_checkpoints(df)
    parts = [f"Per run, final checkpoint ({legend(quantities(df, acc_key))}):",
             render(run_table(final, acc_key))]
    excluded = left_out(df, acc_key, kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)
    parts += _matched_section(df, final, excluded, acc_key, kl_threshold)
    parts.append(left_out_text(excluded, saturation_rule(
        kl_threshold=kl_threshold, loss_tolerance=loss_tolerance, df=df)))
    return "\n\n".join(parts)


def _matched_section(df, final, excluded, acc_key: str, kl_threshold) -> list[str]:
    rows, target = matched_rows(df, excluded["run_id"], kl_threshold)
    if not math.isfinite(target):
        means = seed_means(final, acc_key)
        why = ("no run reached the regime (left out below)" if _has(df, KL) else
               "no KL was measured (a source without a truth)")
        return [f"At matched loss: {why}, no table.",
                *(["Over seeds, final checkpoints (mean ± s.e. over the runs of each):",
                   render(means)] if means is not None else [])]
    head = (f"At matched loss: each run's checkpoint whose KL is nearest {target:.3g} nats, "
            "the lowest KL every run in the regime reached")
    same = set(zip(rows[RUN], rows["step"], strict=True)) <= set(
        zip(final[RUN], final["step"], strict=True))
    means = seed_means(rows, acc_key)
    over_seeds = (["Over seeds, at matched loss (mean ± s.e. over the runs of each):",
                   render(means)] if means is not None else [])
    if same:
        less = ", less the runs left out" if len(excluded) else ""
        return [f"{head}: their final checkpoints (the table above{less}).", *over_seeds]
    return [f"{head}:", render(run_table(rows, acc_key)), *over_seeds]


def left_out_text(excluded: pd.DataFrame, rule: str) -> str:
    """The runs left out, each named with its reason; or that none is."""
    if excluded.empty:
        return f"Left out: none (every run has checkpoints in the regime {rule})."
    lines = [f"- {r.run}: {r.reason}" for r in excluded.itertuples()]
    return "Left out of the correlations and the matched-loss table:\n" + "\n".join(lines)
