"""The paper's figures and tables from the tidy table of ``analysis.runs.load_runs``.

* Fig. 1 style, :func:`accuracy_scatter`: downstream accuracy against the pre-training loss and
  against flatness, one point per checkpoint, colored by algorithm (or preset).
* Figs. 2/4 style, :func:`metrics_over_steps`: metrics over training steps, one line per run.
* Figs. 3/5 style, :func:`metrics_over_size`: final-checkpoint metrics over model size
  (``n_params``, log x), mean and standard deviation over the runs of each group.
* Tables 1/2, :func:`summary_table` + :func:`summary_markdown`: accuracy by algorithm (and
  preset), with loss, KL and flatness columns, over each run's final checkpoint.

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
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN

PANEL_IN = 3.6  # inches per panel


def final_checkpoints(df: pd.DataFrame) -> pd.DataFrame:
    """The last checkpoint (largest step) of each run."""
    if df.empty:
        return df
    return df.sort_values("step").groupby("run_id", sort=False).tail(1).sort_index()


def accuracy_scatter(df: pd.DataFrame, acc_key: str, path: str | Path, *,
                     x_keys=(LOSS, TRACE_FISHER, TRACE_HESSIAN), color_by: str = "algorithm",
                     regime: pd.Series | None = None, title: str | None = None) -> Path:
    """Accuracy against each of ``x_keys``; rows outside ``regime`` (a mask) drawn hollow."""
    keys = [k for k in x_keys if _has(df, k)] if _has(df, acc_key) else []
    fig, axes = _panels(len(keys))
    colors = _colors(df, color_by)
    inside = regime if regime is not None else pd.Series(True, index=df.index)
    for ax, x in zip(axes, keys, strict=True):
        for label, rows in df.groupby(_labels(df, color_by), sort=True):
            ins = inside.loc[rows.index]
            ax.scatter(rows.loc[ins, x], rows.loc[ins, acc_key], s=18, color=colors[label],
                       label=str(label))
            if (~ins).any():
                ax.scatter(rows.loc[~ins, x], rows.loc[~ins, acc_key], s=18,
                           facecolors="none", edgecolors=colors[label], alpha=0.5)
        ax.set_xlabel(x)
        ax.set_ylabel(acc_key)
        if x.startswith("flat/"):
            _maybe_log(ax, df[x], "x")
    if keys:
        axes[0].legend(title=color_by, fontsize=7, title_fontsize=7)
    note = "" if regime is None else " (hollow: outside the saturation regime)"
    return _save(fig, path, (title or f"{acc_key} vs loss and flatness") + note, empty=not keys)


def metrics_over_steps(df: pd.DataFrame, path: str | Path, *, keys, color_by: str = "algorithm",
                       title: str | None = None) -> Path:
    """One panel per key, one line per run over ``step``, colored by ``color_by``."""
    keys = [k for k in keys if _has(df, k)]
    fig, axes = _panels(len(keys))
    colors = _colors(df, color_by)
    labels = _labels(df, color_by)
    for ax, key in zip(axes, keys, strict=True):
        seen = set()
        for _, rows in df.groupby("run_id", sort=True):
            rows = rows.sort_values("step").dropna(subset=[key])
            label = labels.loc[rows.index[0]] if len(rows) else None
            if label is None:
                continue
            ax.plot(rows["step"], rows[key], marker=".", lw=1, color=colors[label],
                    label=str(label) if label not in seen else None)
            seen.add(label)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        if key in (LOSS, KL) or key.startswith("flat/"):
            _maybe_log(ax, df[key], "y")
    if keys:
        axes[0].legend(title=color_by, fontsize=7, title_fontsize=7)
    return _save(fig, path, title or "metrics over training", empty=not keys)


def metrics_over_size(df: pd.DataFrame, path: str | Path, *, keys, color_by: str = "algorithm",
                      title: str | None = None) -> Path:
    """Final-checkpoint values over ``n_params`` (log x): mean ± std over each group's runs."""
    final = final_checkpoints(df)
    keys = [k for k in keys if _has(final, k)] if _has(final, "n_params") else []
    fig, axes = _panels(len(keys))
    colors = _colors(df, color_by)
    final = final.assign(_group=_labels(final, color_by),
                         _n=pd.to_numeric(final.get("n_params"), errors="coerce"))
    for ax, key in zip(axes, keys, strict=True):
        for label, rows in final.dropna(subset=["_n", key]).groupby("_group", sort=True):
            agg = rows.groupby("_n")[key].agg(["mean", "std"]).sort_index()
            ax.errorbar(agg.index, agg["mean"], yerr=agg["std"].fillna(0), marker="o", ms=4,
                        capsize=3, color=colors[label], label=str(label))
        ax.set_xscale("log")
        ax.set_xlabel("parameters")
        ax.set_ylabel(key)
    if keys:
        axes[0].legend(title=color_by, fontsize=7, title_fontsize=7)
    return _save(fig, path, title or "final checkpoint over model size", empty=not keys)


def summary_table(df: pd.DataFrame, acc_key: str, *, by=("algorithm",),
                  keys=(LOSS, KL, TRACE_FISHER, TRACE_HESSIAN)) -> pd.DataFrame:
    """Per group of ``by``: number of runs, then mean and std over runs of ``acc_key`` and
    ``keys`` at each run's final checkpoint (columns ``<key> mean``, ``<key> std``). When the
    runs measured the lookup table (``lookup/<task>/acc_mean``) a last row ``lookup table``
    holds its accuracy (the true conditionals as features; loss = entropy, KL 0), as the
    paper's Table 1 does."""
    final = final_checkpoints(df)
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
            shown[key] = [_pm(m, s, digits) for m, s in
                          zip(table[c], std if std is not None else [math.nan] * len(table),
                              strict=True)]
    return to_markdown(shown, digits)


# -- drawing helpers --------------------------------------------------------------------------

def _has(df: pd.DataFrame, key: str) -> bool:
    return key in df and df[key].notna().any()


def _labels(df: pd.DataFrame, color_by: str) -> pd.Series:
    if color_by not in df:
        return pd.Series("all", index=df.index)
    return df[color_by].astype(object).where(df[color_by].notna(), "n/a").astype(str)


def _colors(df: pd.DataFrame, color_by: str) -> dict:
    from matplotlib import colormaps

    labels = sorted(_labels(df, color_by).unique())
    cmap = colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _panels(n: int):
    fig = Figure(figsize=(PANEL_IN * max(n, 1), PANEL_IN), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(n, 1), squeeze=False)[0]
    return fig, list(axes[:n])  # with n == 0, fig.axes[0] is kept for the 'no data' note


def _maybe_log(ax, values: pd.Series, axis: str) -> None:
    """Log scale for positive values spanning more than a decade."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if len(v) and (v > 0).all() and v.max() / v.min() > 10:
        (ax.set_xscale if axis == "x" else ax.set_yscale)("log")


def _save(fig: Figure, path: str | Path, title: str, *, empty: bool) -> Path:
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
