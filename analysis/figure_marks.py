"""What the figures draw besides the points: the reference levels (majority class, lookup table,
each group's random-init model) as horizontal lines, and axes fitted to the bulk of the points,
an outlier drawn as a marker at the axis edge with its value instead of stretching the axis.

An **outlier** on an axis: split the sorted values (log10 on a log axis) at their largest gap;
the smaller side is outliers when it holds at most a quarter of the points (at least one) and
the gap exceeds ``OUTLIER_GAP`` times the spread of the rest (an adversarial run at accuracy 0.63
beside three at 0.93 - 0.95).

>>> bulk_range([0.93, 0.94, 0.95, 0.63])
(0.93, 0.95)
>>> bulk_range([0.90, 0.92, 0.94])
(0.9, 0.94)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

REFERENCE_LABELS = ("majority class", "lookup table", "random-init")  # a level's label starts so
OUTLIER_GAP = 3.0  # a side apart from the rest by this many times the rest's spread
MARGIN = 0.08  # of the shown span, on each side
REACH = 1.0  # a reference level this many spans beyond the points widens the axis to it


def bulk_range(values, *, log: bool = False) -> tuple[float, float] | None:
    """(low, high) of the values an axis shows: all of them but the outliers (module
    docstring); None without a finite value."""
    v = np.sort(_finite(values, log))
    if v.size == 0:
        return None
    if v.size >= 3:
        gaps = np.diff(v)
        i = int(np.argmax(gaps))
        lower, upper = v[: i + 1], v[i + 1:]
        small, rest = (lower, upper) if len(lower) < len(upper) else (upper, lower)
        if len(small) <= max(1, v.size // 4) and gaps[i] > OUTLIER_GAP * np.ptp(rest):
            v = rest
    low, high = float(v[0]), float(v[-1])
    return (10 ** low, 10 ** high) if log else (low, high)


def _finite(values, log: bool) -> np.ndarray:
    v = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)
    v = v[np.isfinite(v) & ((v > 0) if log else True)]
    return np.log10(v) if log else v


def fit_axis(ax, axis: str, values, levels=(), errors=None) -> tuple[float, float] | None:
    """Limits of ``axis`` ("x" or "y") around the bulk of ``values`` and their error bars
    (``errors``, standard errors aligned with ``values``), widened to each of the reference
    ``levels`` within ``REACH`` spans of them; returns the limits (None: unchanged)."""
    log = (ax.get_xscale() if axis == "x" else ax.get_yscale()) == "log"
    bulk = bulk_range(values, log=log)
    if bulk is None:
        return None
    v = pd.to_numeric(pd.Series(list(values)), errors="coerce").to_numpy(float)
    e = np.zeros_like(v) if errors is None else np.nan_to_num(np.asarray(errors, float))
    kept = (v >= bulk[0]) & (v <= bulk[1])
    ends = np.array([np.min(v[kept] - e[kept]), np.max(v[kept] + e[kept])])
    ends = np.log10(np.clip(ends, bulk[0] / 10, None)) if log else ends
    low, high = float(ends[0]), float(ends[1])
    span = (high - low) or max(abs(high) * 0.05, 1e-3)
    for level in _finite(levels, log):
        if low - REACH * span <= level <= high + REACH * span:
            low, high = min(low, level), max(high, level)
    pad = MARGIN * ((high - low) or span)
    limits = (low - pad, high + pad)
    limits = tuple(10 ** a for a in limits) if log else limits
    (ax.set_xlim if axis == "x" else ax.set_ylim)(*limits)
    return limits


MARKERS = {"top": "^", "bottom": "v", "right": ">", "left": "<"}


def mark_outside(ax, x, y, color, label: str = "") -> None:
    """Points outside the axes' limits as an arrow-like marker at the edge they lie beyond,
    and per edge one note of their values: ``adversarial 0.397-0.43``."""
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    beyond: dict[str, list] = {}
    for xv, yv in zip(np.asarray(x, float), np.asarray(y, float), strict=True):
        side = _side(xv, yv, (x0, x1), (y0, y1)) if np.isfinite([xv, yv]).all() else None
        if side is not None:
            beyond.setdefault(side, []).append((min(max(xv, x0), x1), min(max(yv, y0), y1),
                                                yv if side in ("top", "bottom") else xv))
    for side, points in beyond.items():
        px, py, value = zip(*points, strict=True)
        ax.plot(px, py, marker=MARKERS[side], ms=7, color=color, clip_on=False, ls="none")
        low, high = min(value), max(value)
        text = f"{low:.3g}" if f"{low:.3g}" == f"{high:.3g}" else f"{low:.3g}-{high:.3g}"
        left = (px[0] - x0) < (x1 - x0) / 2 if ax.get_xscale() != "log" else \
            np.log10(px[0] / x0) < np.log10(x1 / x0) / 2
        # runs beyond the same edge at one point (every step-0 checkpoint): notes stacked
        stacked = sum(1 for t in ax.texts if getattr(t, "xy", None) == (px[0], py[0]))
        rise = 8 * stacked * (-1 if side == "top" else 1)
        ax.annotate(f"{label} {text}".strip(), (px[0], py[0]), fontsize=6, color=color,
                    xytext=(6 if left else -6, (-10 if side == "top" else 6) + rise),
                    textcoords="offset points", ha="left" if left else "right",
                    annotation_clip=False)


def _side(x: float, y: float, xlim, ylim) -> str | None:
    if y > ylim[1]:
        return "top"
    if y < ylim[0]:
        return "bottom"
    if x > xlim[1]:
        return "right"
    if x < xlim[0]:
        return "left"
    return None


def is_reference(label: str) -> bool:
    """Whether a line's label names a reference level (``random-init d64-h4-l2-i256``)."""
    return label.startswith(REFERENCE_LABELS)


def reference_levels(rows: pd.DataFrame, acc_key: str, groups: pd.Series,
                     colors: dict) -> list[tuple[float, str, object, str]]:
    """(value, label, colour, line style) of each reference accuracy beside ``acc_key``: the
    majority class (grey, dotted), the lookup table (black, dash-dot) and each group's
    random-init model (its colour, dashed, labelled ``random-init <group>``: a legend entry
    per colour); means over ``rows`` (over a group's)."""
    if not acc_key.startswith("probe/"):
        return []
    out = []
    for key, label, color, style in (
            (acc_key.replace("/acc_mean", "/majority_acc"), "majority class", "grey", ":"),
            (acc_key.replace("probe/", "lookup/", 1), "lookup table", "black", "-.")):
        if key in rows and rows[key].notna().any():
            out.append((float(rows[key].mean()), label, color, style))
    ref = acc_key.replace("probe/", "random_init/", 1)
    if ref not in rows or rows[ref].isna().all():
        return out
    per_group = rows.groupby(groups, sort=True)[ref].mean().dropna()
    if per_group.round(12).nunique() == 1:  # one random model for every group: one line
        return [*out, (float(per_group.iloc[0]), "random-init", "dimgrey", "--")]
    return [*out, *((float(v), f"random-init {g}", colors[g], "--")
                     for g, v in per_group.items())]


def draw_levels(ax, levels, axis: str = "y") -> None:
    """The reference levels as lines across the axes (one legend entry per kind); a level
    outside the limits is a note under the axes instead (:func:`note_under`)."""
    low, high = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    named = set()
    for value, label, color, style in levels:
        if low <= value <= high:
            line = ax.axhline if axis == "y" else ax.axvline
            line(value, color=color, ls=style, lw=1, label=None if label in named else label)
            named.add(label)
            continue
        side = "below" if value < low else "above"
        note_under(ax, f"{label} {value:.3f} ({side} the axis)", color)


NOTE_FONT, NOTE_STEP = 6, 8  # points: a note's size, and the distance between stacked notes


def note_under(ax, text: str, color) -> None:
    """``text`` under the x axis's label, below the notes already there: outside the axes,
    where it cannot sit on a point or a line (inside them it did); the figure's constrained
    layout makes room for it."""
    stacked = sum(1 for t in ax.texts if getattr(t, "is_note_under", False))
    note = ax.annotate(text, xy=(0, 0), xycoords=("axes fraction", ax.xaxis.label),
                       xytext=(0, -2 - NOTE_STEP * stacked), textcoords="offset points",
                       ha="left", va="top", fontsize=NOTE_FONT, color=color,
                       annotation_clip=False)
    note.is_note_under = True
