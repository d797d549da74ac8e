"""The paper's figures and tables from the tidy table of ``analysis.runs.load_runs``.

* Fig. 1 style, :func:`accuracy_scatter`: downstream accuracy against the pre-training loss and
  against flatness, one point per checkpoint, colored by algorithm (or model).
* Figs. 2/4 style, :func:`metrics_over_steps`: metrics over training steps, one line per run,
  each named in the legend by what sets it apart (:func:`run_labels`).
* Figs. 3/5 style, :func:`metrics_over_size`: final-checkpoint metrics over model size
  (``n_params``, log x), mean and standard deviation over the runs of each group.
* Tables 1/2, :func:`summary_table` + :func:`summary_markdown`: accuracy by algorithm (and
  model), with loss, KL and flatness columns, over each run's final checkpoint (or, for
  Table 1, the checkpoint at the common loss: :func:`loss_matched`).

Every point carries its standard error (the ``_se`` twin of its metric) as an error bar.

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, no global
backend switch, no display needed.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.correlate import to_markdown
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN, se_key
from flatlm.runs.metrics_log import N_PARAMS

PANEL_IN = 3.6  # inches per panel


def final_checkpoints(df: pd.DataFrame) -> pd.DataFrame:
    """The last checkpoint (largest step) of each run."""
    if df.empty:
        return df
    return df.sort_values("step").groupby("run_id", sort=False).tail(1).sort_index()


# What tells runs apart first, in legend order; then any other param that varies.
LABEL_FIRST = ("model", "algorithm", "train.algorithm", "train.seed", "seed")


def run_labels(df: pd.DataFrame, max_fields: int = 3) -> pd.Series:
    """A legend label per row naming its run by what differs between the runs: the values of
    the (up to ``max_fields``) columns of ``LABEL_FIRST`` and params that vary across runs,
    ``model=d32-h2-l1-i128 algorithm=sam seed=1``, with the trial name added where runs share
    them; the trial name alone when nothing varies."""
    per_run = df.groupby("run_id", sort=False).first()
    params = [c for c in df.attrs.get("params", []) if c not in LABEL_FIRST]
    candidates = [c for c in (*LABEL_FIRST, *params) if c in per_run]
    varying = [c for c in candidates if per_run[c].dropna().astype(str).nunique() > 1]
    varying = [c for c in varying if not (c == "algorithm" and "train.algorithm" in varying)]
    trial = per_run["trial"].astype(str) if "trial" in per_run else per_run.index.to_series()
    if not varying:
        return df["run_id"].map(trial)
    names = per_run[varying[:max_fields]].astype(str).apply(
        lambda r: " ".join(f"{c.rsplit('.', 1)[-1]}={v}" for c, v in r.items()), axis=1)
    shared = names.duplicated(keep=False)
    names[shared] = names[shared] + " (" + trial[shared] + ")"
    return df["run_id"].map(names)


def accuracy_scatter(df: pd.DataFrame, acc_key: str, path: str | Path, *,
                     x_keys=(LOSS, TRACE_FISHER, TRACE_HESSIAN), color_by: str = "algorithm",
                     regime: pd.Series | None = None, title: str | None = None) -> Path:
    """Fig. 1: accuracy against each of ``x_keys``, one point per checkpoint with its standard
    errors as bars, colored by ``color_by``; rows outside ``regime`` (a mask) drawn hollow."""
    keys = [k for k in x_keys if _has(df, k)] if _has(df, acc_key) else []
    fig, axes = panels(len(keys))
    colors = _colors(df, color_by)
    inside = regime if regime is not None else pd.Series(True, index=df.index)
    for ax, x in zip(axes, keys, strict=True):
        for label, rows in df.groupby(_labels(df, color_by), sort=True):
            named = False  # one legend entry per group, filled or hollow
            for mask, face in ((inside.loc[rows.index], colors[label]),
                               (~inside.loc[rows.index], "none")):
                part = rows[mask]
                if part.empty:
                    continue
                ax.errorbar(part[x], part[acc_key], xerr=_err(part, x), yerr=_err(part, acc_key),
                            fmt="o", ms=4, mfc=face, color=colors[label], elinewidth=0.6,
                            alpha=1.0 if face != "none" else 0.5,
                            label=None if named else str(label))
                named = True
        ax.set_xlabel(x)
        ax.set_ylabel(acc_key)
        if x.startswith("flat/"):
            _maybe_log(ax, df[x], "x")
    if keys:
        axes[0].legend(title=color_by, fontsize=7, title_fontsize=7)
    note = "" if regime is None else " (hollow: outside the saturation regime)"
    return save_figure(fig, path, (title or f"Fig. 1: {acc_key} vs loss and flatness") + note,
                 empty=not keys)


def metrics_over_steps(df: pd.DataFrame, path: str | Path, *, keys,
                       title: str | None = None) -> Path:
    """Figs. 2/4: one panel per key, one line per run over ``step`` (its own color, named in
    the legend by ``run_labels``), with each checkpoint's standard error as bars."""
    keys = [k for k in keys if _has(df, k)]
    fig, axes = panels(len(keys))
    labels = run_labels(df)
    colors = _colors(labels.to_frame("run"), "run")
    for ax, key in zip(axes, keys, strict=True):
        for _, rows in df.groupby("run_id", sort=False):
            rows = rows.sort_values("step").dropna(subset=[key])
            if rows.empty:
                continue
            label = labels.loc[rows.index[0]]
            ax.errorbar(rows["step"], rows[key], yerr=_err(rows, key), marker=".", lw=1,
                        capsize=2, elinewidth=0.6, color=colors[label], label=label)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        if key in (LOSS, KL) or key.startswith("flat/"):
            _maybe_log(ax, df[key], "y")
    if keys:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center",
                   ncols=min(4, max(1, labels.nunique())), fontsize=7)
    return save_figure(fig, path, title or "Figs. 2/4: metrics over training steps", empty=not keys)


def metrics_over_size(df: pd.DataFrame, path: str | Path, *, keys, color_by: str = "algorithm",
                      title: str | None = None) -> Path:
    """Figs. 3/5: final-checkpoint values over ``n_params`` (log x), one line per group of
    ``color_by``: the mean over the group's runs of each size, with bars of the standard
    deviation over runs (the standard error of the one run where a size has one run)."""
    final = final_checkpoints(df)
    keys = [k for k in keys if _has(final, k)] if _has(final, N_PARAMS) else []
    fig, axes = panels(len(keys))
    colors = _colors(df, color_by)
    final = final.assign(_group=_labels(final, color_by),
                         _n=pd.to_numeric(final.get(N_PARAMS), errors="coerce"))
    for ax, key in zip(axes, keys, strict=True):
        rows = final.dropna(subset=["_n", key])
        rows = rows.assign(_se=_err(rows, key) if _has(rows, se_key(key)) else np.nan)
        for label, part in rows.groupby("_group", sort=True):
            agg = part.groupby("_n").agg(mean=(key, "mean"), std=(key, "std"),
                                         se=("_se", "first"), runs=(key, "size")).sort_index()
            bars = agg["std"].where(agg["runs"] > 1, agg["se"]).fillna(0)
            ax.errorbar(agg.index, agg["mean"], yerr=bars, marker="o", ms=4, capsize=3,
                        color=colors[label], label=str(label))
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(key)
    if keys:
        axes[0].legend(title=color_by, fontsize=7, title_fontsize=7)
    return save_figure(fig, path, title or "Figs. 3/5: final checkpoint over model size",
                 empty=not keys)


def loss_matched(df: pd.DataFrame, kl_threshold: float | None = None
                 ) -> tuple[pd.DataFrame, float, list[str]]:
    """One checkpoint per run at (nearly) the same loss. The paper compares algorithms "at the
    same pre-training loss"; final checkpoints of runs that converge at different speeds are
    not that. The target is the lowest KL every run reached (the largest of the runs' smallest
    KLs); each run contributes its checkpoint whose KL is closest to it. With ``kl_threshold``
    a run that never got below it (a run that failed to fit) does not drag the target up for
    the others: it contributes its lowest-KL checkpoint and is listed as unmatched. Returns
    (those rows, the target, the unmatched runs' ids). Runs without a KL (a source without a
    truth, e.g. real text) give their final checkpoints, and the target NaN says so."""
    rows = df.dropna(subset=[KL]) if KL in df else df.iloc[:0]
    if rows.empty:
        return final_checkpoints(df), math.nan, []
    best = rows.groupby("run_id")[KL].min()
    fitted = best[best < kl_threshold] if kl_threshold is not None else best
    if fitted.empty:
        fitted = best
    target = float(fitted.max())
    gap = (rows[KL] - target).abs().where(rows["run_id"].isin(fitted.index), rows[KL])
    unmatched = sorted(set(best.index) - set(fitted.index))
    return rows.loc[gap.groupby(rows["run_id"]).idxmin()].sort_index(), target, unmatched


def summary_table(df: pd.DataFrame, acc_key: str, *, by=("algorithm",),
                  keys=(LOSS, KL, TRACE_FISHER, TRACE_HESSIAN),
                  match_loss: bool = False, kl_threshold: float | None = None) -> pd.DataFrame:
    """Per group of ``by``: number of runs, then mean and std over runs of ``acc_key`` and
    ``keys`` at one checkpoint per run (columns ``<key> mean``, ``<key> std``): its final one,
    or with ``match_loss`` the one at the common loss of :func:`loss_matched` (the target KL in
    ``table.attrs["target_kl"]``, the groups of runs that never reached ``kl_threshold`` in
    ``table.attrs["unmatched"]``). When the runs measured the lookup table
    (``lookup/<task>/acc_mean``) a last row ``lookup table`` holds its accuracy (the true
    conditionals as features; loss = entropy, KL 0), as the paper's Table 1 does."""
    rows, target, unmatched = (loss_matched(df, kl_threshold) if match_loss
                               else (final_checkpoints(df), math.nan, []))
    out = _summary(rows, acc_key, by, keys)
    by = [b for b in by if b in rows]
    stuck = rows[rows["run_id"].isin(unmatched)]
    out.attrs["target_kl"] = target
    out.attrs["unmatched"] = (sorted({" ".join(map(str, r)) for r in
                                      stuck[by].itertuples(index=False)}) if by else unmatched)
    return out


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
    return pd.concat([out.reset_index(), _lookup_row(final, acc_key, by)], ignore_index=True)


def _lookup_row(final: pd.DataFrame, acc_key: str, by) -> pd.DataFrame:
    lookup = acc_key.replace("probe/", "lookup/", 1)
    if not acc_key.startswith("probe/") or not _has(final, lookup):
        return pd.DataFrame()
    row = {b: "lookup table" for b in by[:1]}
    row.update({b: "" for b in by[1:]})
    row.update({"runs": int(final[lookup].notna().sum()), f"{acc_key} mean": final[lookup].mean(),
                f"{acc_key} std": final[lookup].std(), f"{KL} mean": 0.0})
    if _has(final, "pretrain/entropy") and LOSS in final:
        row[f"{LOSS} mean"] = final["pretrain/entropy"].mean()
    return pd.DataFrame([row])


def summary_markdown(table: pd.DataFrame, digits: int = 3) -> str:
    """``summary_table`` with each ``mean``/``std`` pair shown as ``mean ± std``."""
    shown = table[[c for c in table.columns if not c.endswith((" mean", " std"))]].copy()
    for c in table.columns:
        if c.endswith(" mean"):
            key = c.removesuffix(" mean")
            std = table.get(f"{key} std")
            places = 0 if key == "step" else digits  # a training step is a whole number
            shown[key] = [_pm(m, s, places) for m, s in
                          zip(table[c], std if std is not None else [math.nan] * len(table),
                              strict=True)]
    return to_markdown(shown, digits)


# -- drawing helpers --------------------------------------------------------------------------

def _has(df: pd.DataFrame, key: str) -> bool:
    return key in df and df[key].notna().any()


def _err(df: pd.DataFrame, key: str) -> pd.Series | None:
    """The standard errors of ``key`` (``flatlm.measure.se_key``) where measured, else None."""
    se = se_key(key)
    return df[se].fillna(0).clip(lower=0) if _has(df, se) else None


def _labels(df: pd.DataFrame, color_by: str) -> pd.Series:
    if color_by not in df:
        return pd.Series("all", index=df.index)
    return df[color_by].astype(object).where(df[color_by].notna(), "n/a").astype(str)


def _colors(df: pd.DataFrame, color_by: str) -> dict:
    from matplotlib import colormaps

    labels = sorted(_labels(df, color_by).unique())
    cmap = colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {label: cmap(i % cmap.N) for i, label in enumerate(labels)}


def panels(n: int):
    fig = Figure(figsize=(PANEL_IN * max(n, 1), PANEL_IN), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(n, 1), squeeze=False)[0]
    return fig, list(axes[:n])  # with n == 0, fig.axes[0] is kept for the 'no data' note


def _maybe_log(ax, values: pd.Series, axis: str) -> None:
    """Log scale for positive values spanning more than a decade."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if len(v) and (v > 0).all() and v.max() / v.min() > 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def save_figure(fig: Figure, path: str | Path, title: str, *, empty: bool) -> Path:
    if empty:
        fig.axes[0].text(0.5, 0.5, "no data", ha="center", va="center")
        fig.axes[0].set_axis_off()
    fig.suptitle(title, fontsize=9)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _pm(mean, std, digits: int) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    if std is None or (isinstance(std, float | np.floating) and math.isnan(std)):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"
