"""The replication report's figures, with error bars: every point is a mean over training seeds
with its standard error (bars), one colour per protocol (and experiment where two share a
panel). Drawn on ``matplotlib.figure.Figure`` with the Agg canvas, as ``analysis/figures.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.claims import acc, final_rows, model_size
from analysis.figures import panels, save_figure
from analysis.labels import count_axis, label_axis
from flatlm.measure import KL, TRACE_FISHER, TRACE_FISHER_GROWN
from flatlm.storage.metrics_log import N_PARAMS

STEP_KEYS = (KL, TRACE_FISHER, acc("B"), acc("C"))
SIZE_KEYS = (KL, TRACE_FISHER_GROWN, acc("B"), acc("C"))
ALGORITHM_KEYS = (KL, TRACE_FISHER, acc("B"))


def _mean_se(frame: pd.DataFrame, by: str, key: str) -> pd.DataFrame:
    g = frame.groupby(by)[key]
    return pd.DataFrame({"mean": g.mean(), "se": g.std(ddof=1) / np.sqrt(g.count())})


def over_steps(df: pd.DataFrame, path: str | Path) -> Path:
    """Figs. 2/4/10: each key over steps, per protocol x (steps, sgd) experiment."""
    part = df[df["experiment"].isin(["steps", "sgd"])]
    keys = [k for k in STEP_KEYS if k in part]
    fig, axes = panels(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        for (protocol, experiment), group in part.groupby(["protocol", "experiment"]):
            stats = _mean_se(group, "step", key)
            ax.errorbar(stats.index, stats["mean"], yerr=stats["se"], marker="o", ms=3,
                        capsize=2, label=f"{protocol} / {experiment}")
        label_axis(ax, "x", "step")
        label_axis(ax, "y", key)
    if keys:
        axes[0].legend(fontsize=7)
    return save_figure(fig, path, "over training steps (mean ± s.e. over seeds)", empty=not keys)


def over_sizes(df: pd.DataFrame, path: str | Path) -> Path:
    """Figs. 3/5: final-checkpoint keys over model size, per protocol."""
    final = final_rows(df[df["experiment"] == "sizes"])
    final = final.assign(params=final["model"].map(model_size)) if len(final) else final
    keys = [k for k in SIZE_KEYS if k in final]
    fig, axes = panels(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        for protocol, group in final.groupby("protocol"):
            stats = _mean_se(group, "params", key)
            ax.errorbar(stats.index, stats["mean"], yerr=stats["se"], marker="o", ms=3,
                        capsize=2, label=protocol)
        count_axis(ax, final.get("params", []))
        label_axis(ax, "x", N_PARAMS)
        label_axis(ax, "y", key)
    if keys:
        axes[0].legend(fontsize=7)
    return save_figure(fig, path, "final checkpoint over model size (mean ± s.e. over seeds)",
                 empty=not keys)


def algorithm_bars(df: pd.DataFrame, path: str | Path) -> Path:
    """Tables 1/2: final-checkpoint keys per algorithm and protocol; the lookup table as a
    dashed line on the accuracy panel."""
    final = final_rows(df[df["experiment"] == "algorithms"])
    keys = [k for k in ALGORITHM_KEYS if k in final]
    fig, axes = panels(len(keys))
    protocols = sorted(final["protocol"].dropna().unique()) if len(final) else []
    for ax, key in zip(axes, keys, strict=True):
        for i, protocol in enumerate(protocols):
            stats = _mean_se(final[final["protocol"] == protocol], "train.algorithm", key)
            x = np.arange(len(stats)) + i * 0.8 / max(len(protocols), 1)
            ax.bar(x, stats["mean"], width=0.8 / max(len(protocols), 1), yerr=stats["se"],
                   capsize=2, label=protocol)
            ax.set_xticks(np.arange(len(stats)), stats.index, rotation=30, fontsize=7)
            lookup = key.replace("probe/", "lookup/")
            if key.startswith("probe/") and lookup in final:
                value = final[final["protocol"] == protocol][lookup].mean()
                ax.axhline(value, ls="--", lw=1, color=f"C{i}")
        label_axis(ax, "y", key)
        if key.startswith("probe/"):
            ax.set_title("dashed: lookup table", fontsize=8)
    if keys and protocols:
        axes[0].legend(fontsize=7)
    return save_figure(fig, path, "final checkpoint by algorithm (mean ± s.e. over seeds)",
                 empty=not keys)


def scatter(df: pd.DataFrame, path: str | Path, acc_key: str, saturation: float) -> Path:
    """Fig. 1: accuracy against the KL and against Tr(F), every saturated checkpoint (KL <=
    ``saturation``), coloured by protocol and experiment. With none saturated, the checkpoints
    within 0.05 nats of each protocol's smallest KL, and the title says they are not."""
    part = df[df[KL] <= saturation] if KL in df else df.iloc[:0]
    title = f"Fig. 1: saturated checkpoints (KL <= {saturation:g})"
    if part.empty and len(df) and KL in df:
        part = pd.concat([g[g[KL] <= g[KL].min() + 0.05] for _, g in df.groupby("protocol")])
        title = ("Fig. 1: NO checkpoint is saturated; shown: within 0.05 nats of the smallest "
                 "KL")
    keys = [k for k in (KL, TRACE_FISHER) if k in part and acc_key in part]
    fig, axes = panels(len(keys))
    for ax, key in zip(axes, keys, strict=True):
        for (protocol, experiment), group in part.groupby(["protocol", "experiment"]):
            ax.scatter(group[key], group[acc_key], s=10, label=f"{protocol} / {experiment}")
        label_axis(ax, "x", key)
        label_axis(ax, "y", acc_key)
    if keys:
        axes[0].legend(fontsize=6)
    return save_figure(fig, path, title, empty=not keys)
