"""The paper's figures from the tidy table of ``analysis.runs.load_runs``.

* Fig. 1 style, :func:`accuracy_scatter`: downstream accuracy against the KL to the truth and
  against flatness, one point per checkpoint, coloured by what the sweep varies (the model, the
  algorithm; ``point_groups``).
* Figs. 2/4 style, :func:`metrics_over_steps`: metrics over training steps, one line per run,
  each named in the legend by what sets it apart (``analysis.checkpoints.run_labels``).
* Figs. 3/5 style, :func:`metrics_over_size`: final-checkpoint metrics over model size
  (``n_params``, log x), each size named by its model under its tick, mean and standard
  deviation over the runs of each group.

Tables 1/2 are ``analysis.tables``'; axis names and units ``analysis.labels``'.

Every point carries its standard error (the ``_se`` twin of its metric) as an error bar. The
loss axis is the KL to the truth (the loss minus the entropy, which every run shares): the loss's
own s.e. is mostly the shared entropy estimate's and would hide KL gaps. Accuracy panels draw the
reference levels (majority class, lookup table, each group's random-init model) and fit the
axes to the bulk of the points, outliers marked at the edge (``analysis.figure_marks``).

Figures are drawn on ``matplotlib.figure.Figure`` with the Agg canvas: no pyplot, no global
backend switch, no display needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.checkpoints import (
    final_checkpoints,
    run_labels,
    short_name,
    varying_columns,
)
from analysis.figure_marks import (
    draw_levels,
    fit_axis,
    is_reference,
    mark_outside,
    reference_levels,
)
from analysis.labels import (
    count_axis,
    is_accuracy,
    label_axis,
    percent_axis,
    plain_name,
    short_names,
    untangle_ticks,
)
from analysis.output import write_figure
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN, se_key
from flatlm.storage.metrics_log import N_PARAMS

PANEL_IN = 3.6  # inches per panel
LOG_KEYS = (LOSS, KL)  # drawn on a log axis when they span more than a decade, as flat/*


def point_groups(df: pd.DataFrame, color_by: str | None = None) -> tuple[pd.Series, str]:
    """(a label per row, the legend's title): ``color_by``'s values when given, else what the
    sweep varies besides the seed (``model``, ``algorithm``, both), else the seed, else
    ``all``."""
    if color_by is not None:
        return _labels(df, color_by), color_by
    fields = varying_columns(df, seeds=False) or varying_columns(df)
    return _field_labels(df, fields, "all")


def _field_labels(df: pd.DataFrame, fields: list[str], default: str) -> tuple[pd.Series, str]:
    """Each row's values of ``fields`` joined, and their short names (``default`` and "" when
    there is no field)."""
    if not fields:
        return pd.Series(default, index=df.index), ""
    labels = df[fields].astype(object).where(df[fields].notna(), "n/a").astype(str)
    return labels.agg(" ".join, axis=1), " ".join(short_name(f) for f in fields)


def accuracy_scatter(df: pd.DataFrame, acc_key: str, path: str | Path, *,
                     x_keys=(KL, TRACE_FISHER, TRACE_HESSIAN), color_by: str | None = None,
                     regime: pd.Series | None = None, title: str | None = None) -> Path:
    """Fig. 1: accuracy against each of ``x_keys``, one point per checkpoint with its standard
    errors as bars, coloured by ``point_groups``; rows outside ``regime`` (a mask) drawn
    hollow; the reference levels drawn; outliers marked at the axis edge.

    With a ``regime`` that holds some rows but not all, the panels show the saturated window
    (their axes fitted to the rows in it: the early checkpoints, far from it, would set the
    range and squash the window into a strip) and a short row below shows every checkpoint with
    the window framed."""
    keys = [k for k in x_keys if _has(df, k)] if _has(df, acc_key) else []
    inside = regime if regime is not None else pd.Series(True, index=df.index)
    framed = bool(keys) and inside.any() and not inside.all()
    fig, axes, overview = _window_panels(len(keys), framed)
    groups, legend_title = point_groups(df, color_by)
    colors = palette(groups)
    window = df[inside] if framed else df
    levels = reference_levels(df, acc_key, groups, colors)
    for i, x in enumerate(keys):
        ax = axes[i]
        _scatter_panel(ax, df, x, acc_key, groups, colors, inside)
        _fit_scatter_panel(ax, window, x, acc_key, groups.loc[window.index], colors, levels)
        if framed:
            _overview_panel(overview[i], df, x, acc_key, groups, colors, inside, ax)
    if keys:
        axes[0].legend(title=legend_title or None, fontsize=7, title_fontsize=7)
    note = "" if regime is None else "\nhollow: outside the saturation regime"
    if framed:
        note += "; above: the saturated window, below: every checkpoint"
    title = title or f"Fig. 1: {plain_name(acc_key)} vs KL and flatness"
    return save_figure(fig, path, title + note, empty=not keys)


def _window_panels(n: int, framed: bool):
    """(figure, the main axes, the overview axes below them or []): ``panels`` with, when
    ``framed``, a short second row."""
    if not framed:
        fig, axes = panels(n)
        return fig, axes, []
    fig = Figure(figsize=(PANEL_IN * n, PANEL_IN * 1.45), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.subplots(2, n, squeeze=False, gridspec_kw={"height_ratios": [3, 1.1]})
    return fig, list(grid[0]), list(grid[1])


def _fit_scatter_panel(ax, rows: pd.DataFrame, x: str, y: str, groups: pd.Series,
                       colors: dict, levels) -> None:
    """The axes of a Fig. 1 panel around ``rows`` (the window shown), their labels and units,
    the reference levels, the rows beyond the limits marked at the edge."""
    if x.startswith("flat/") or x in LOG_KEYS:
        _maybe_log(ax, rows[x], "x")
    fit_axis(ax, "x", rows[x], errors=_err(rows, x))
    fit_axis(ax, "y", rows[y], [v for v, *_ in levels], errors=_err(rows, y))
    draw_levels(ax, levels)
    for label, part in rows.groupby(groups, sort=True):
        mark_outside(ax, part[x], part[y], colors[label], label)
    label_axis(ax, "x", x)
    label_axis(ax, "y", y)
    _plain_log_ticks(ax)


def _overview_panel(ax, df: pd.DataFrame, x: str, y: str, groups: pd.Series, colors: dict,
                    inside: pd.Series, window) -> None:
    """Every checkpoint, small, with the saturated window (``window``'s limits) framed."""
    from matplotlib.patches import Rectangle

    for label, rows in df.groupby(groups, sort=True):
        for mask, face in ((inside.loc[rows.index], colors[label]),
                           (~inside.loc[rows.index], "none")):
            ax.plot(rows.loc[mask, x], rows.loc[mask, y], "o", ms=3, mfc=face,
                    color=colors[label])
    if x.startswith("flat/") or x in LOG_KEYS:
        _maybe_log(ax, df[x], "x")
    (x0, x1), (y0, y1) = window.get_xlim(), window.get_ylim()
    ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ls="--", lw=0.8,
                           ec="black"))
    ax.set_title("every checkpoint; dashed: the window above", fontsize=7)
    ax.tick_params(labelsize=7)
    if is_accuracy(y):
        percent_axis(ax, "y")
    _plain_log_ticks(ax)


def _scatter_panel(ax, df, x: str, y: str, groups: pd.Series, colors: dict,
                   inside: pd.Series) -> None:
    for label, rows in df.groupby(groups, sort=True):
        named = False  # one legend entry per group, filled or hollow
        for mask, face in ((inside.loc[rows.index], colors[label]),
                           (~inside.loc[rows.index], "none")):
            part = rows[mask]
            if part.empty:
                continue
            ax.errorbar(part[x], part[y], xerr=_err(part, x), yerr=_err(part, y),
                        fmt="o", ms=4, mfc=face, color=colors[label], elinewidth=0.6,
                        alpha=1.0 if face != "none" else 0.5,
                        label=None if named else str(label))
            named = True


def metrics_over_steps(df: pd.DataFrame, path: str | Path, *, keys, acc_key: str | None = None,
                       title: str | None = None) -> Path:
    """Figs. 2/4: one panel per key, one line per run over ``step`` (its own color, named in
    the legend by ``run_labels``), with each checkpoint's standard error as bars; axes fitted
    to the bulk of the points (an outlying run marked at the edge); the panel of ``acc_key``
    with the reference levels."""
    keys = [k for k in keys if _has(df, k)]
    fig, axes = panels(len(keys))
    labels = run_labels(df)
    colors = palette(labels)
    for ax, key in zip(axes, keys, strict=True):
        for _, rows in df.groupby("run_id", sort=False):
            rows = rows.sort_values("step").dropna(subset=[key])
            if rows.empty:
                continue
            label = labels.loc[rows.index[0]]
            ax.errorbar(rows["step"], rows[key], yerr=_err(rows, key), marker=".", lw=1,
                        capsize=2, elinewidth=0.6, color=colors[label], label=label)
        label_axis(ax, "x", "step")
        label_axis(ax, "y", key)
        if key in LOG_KEYS or key.startswith("flat/"):
            _maybe_log(ax, df[key], "y")
        _fit_steps_panel(ax, df, key, labels, colors, key == acc_key)
        _plain_log_ticks(ax)
    if keys:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center",
                   ncols=min(4, max(1, labels.nunique())), fontsize=7)
    return save_figure(fig, path, title or "Figs. 2/4: metrics over training steps", empty=not keys)


def _fit_steps_panel(ax, df: pd.DataFrame, key: str, labels: pd.Series, colors: dict,
                     accuracy: bool) -> None:
    """The y axis around the bulk of the points, the reference levels of an accuracy panel
    (with their own legend), the points beyond the axis marked at its edge."""
    levels = reference_levels(df, key, labels, colors) if accuracy else []
    fit_axis(ax, "y", df[key], [v for v, *_ in levels], errors=_err(df, key))
    draw_levels(ax, levels)
    for label, rows in df.groupby(labels, sort=False):
        mark_outside(ax, rows["step"], rows[key], colors[label], label)
    shown = [h for h in ax.get_lines() if is_reference(h.get_label())]
    if shown:
        ax.legend(handles=shown, fontsize=6)


def metrics_over_size(df: pd.DataFrame, path: str | Path, *, keys,
                      color_by: str | None = None, title: str | None = None) -> Path:
    """Figs. 3/5: final-checkpoint values over ``n_params`` (log x), one line per group of
    ``color_by`` (default: what varies besides the model and the seed; one line when nothing
    does), each size named by its model under its tick: the mean over the group's runs of each
    size, with bars of the standard deviation over runs (the standard error of the one run where
    a size has one run). Accuracy panels draw the random-init model of each size (dashed) and the
    majority class and lookup table."""
    final = final_checkpoints(df).copy()  # one block per dtype: no fragmentation warning
    keys = [k for k in keys if _has(final, k)] if _has(final, N_PARAMS) else []
    fig, axes = panels(len(keys))
    groups, legend_title = _size_groups(final, color_by)
    colors = palette(groups)
    final = final.assign(_group=groups, _n=pd.to_numeric(final.get(N_PARAMS), errors="coerce"))
    for ax, key in zip(axes, keys, strict=True):
        _size_panel(ax, final, key, colors)
        models, pattern = short_names(_model_of_count(final))
        count_axis(ax, final["_n"], names=models)
        label_axis(ax, "x", N_PARAMS)
        if pattern:
            ax.set_xlabel(f"{ax.get_xlabel()} (models {pattern})")
        label_axis(ax, "y", key)
    if keys:
        axes[0].legend(title=legend_title or None, fontsize=7, title_fontsize=7)
    return save_figure(fig, path, title or "Figs. 3/5: final checkpoint over model size",
                       empty=not keys)


def _model_of_count(final: pd.DataFrame) -> dict:
    """parameter count -> the model of that size (its x tick names it: a name beside each point
    printed over its neighbours where two sizes score alike)."""
    if "model" not in final:
        return {}
    sized = final.dropna(subset=["_n"])
    return dict(zip(sized["_n"], sized["model"].astype(str), strict=True))


def _size_groups(final: pd.DataFrame, color_by: str | None) -> tuple[pd.Series, str]:
    if color_by is not None:
        return _labels(final, color_by), color_by
    fields = [f for f in varying_columns(final, seeds=False) if f != "model"]
    return _field_labels(final, fields, "trained")


def _size_panel(ax, final: pd.DataFrame, key: str, colors: dict) -> None:
    rows = final.dropna(subset=["_n", key])
    rows = rows.assign(_se=_err(rows, key) if _has(rows, se_key(key)) else np.nan)
    for label, part in rows.groupby("_group", sort=True):
        part = part.assign(_model=part["model"] if "model" in part else part["_n"])
        agg = part.groupby("_n").agg(mean=(key, "mean"), std=(key, "std"),
                                     se=("_se", "first"), runs=(key, "size"),
                                     model=("_model", "first")).sort_index()
        bars = agg["std"].where(agg["runs"] > 1, agg["se"]).fillna(0)
        ax.errorbar(agg.index, agg["mean"], yerr=bars, marker="o", ms=4, capsize=3,
                    color=colors[label], label=str(label))
    ref = key.replace("probe/", "random_init/", 1)
    if key.startswith("probe/") and _has(rows, ref):
        level = rows.groupby("_n")[ref].mean().sort_index()
        ax.plot(level.index, level.to_numpy(), ls="--", marker="x", color="grey", lw=1,
                label="random-init")
        levels = [lv for lv in reference_levels(rows, key, rows["_group"], colors)
                  if not lv[1].startswith("random-init")]
        fit_axis(ax, "y", [*rows[key], *level], [v for v, *_ in levels])
        draw_levels(ax, levels)


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


def palette(labels: pd.Series) -> dict:
    """A colour per distinct label, from a qualitative palette: tab10's ten hues, then their
    light twins (tab20's odd entries), then again. tab20 in its own order pairs each hue with
    its light shade, so two neighbouring runs would look alike."""
    from matplotlib import colormaps

    labels = sorted(labels.astype(str).unique())
    tab20 = colormaps["tab20"].colors
    colours = [*tab20[0::2], *tab20[1::2]]  # tab20[0::2] is tab10
    return {label: colours[i % len(colours)] for i, label in enumerate(labels)}


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


def _plain_log_ticks(ax) -> None:
    """Plain numbers (``170``, ``0.05``) on a log axis, minor ticks labelled only within a
    decade: matplotlib's default labels a narrow log axis ``1.58 x 10^2``, ``1.6 x 10^2``, ...,
    which print over each other."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    for axis, limits, scale in ((ax.xaxis, ax.get_xlim(), ax.get_xscale()),
                                (ax.yaxis, ax.get_ylim(), ax.get_yscale())):
        if scale != "log":
            continue
        low, high = sorted(limits)
        narrow = low > 0 and high / low < 10
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain if narrow else NullFormatter())


def save_figure(fig: Figure, path: str | Path, title: str, *, empty: bool) -> Path:
    if empty:
        fig.axes[0].text(0.5, 0.5, "no data", ha="center", va="center")
        fig.axes[0].set_axis_off()
    fig.suptitle(title, fontsize=9)
    untangle_ticks(fig)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_figure(fig, path, dpi=120)
    return path
