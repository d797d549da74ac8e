"""What the figures and tables call a metric: a plain name and its unit, for a reader who has not
seen the metric keys (``pretrain/kl``), and the axis formats that go with them (accuracy in %,
parameter counts as ``114k``).

>>> axis_label("pretrain/kl"), axis_label("probe/B/acc_mean")
('KL to the truth (nats/token)', 'task B probe accuracy (%)')
>>> axis_label("flat/trace_fisher"), axis_label("n_params")
('Tr(F), Fisher trace', 'parameters')
>>> [count_label(n) for n in (950, 113_920, 2_400_000)]
['950', '114k', '2.4M']
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flatlm.measure.registry import quantity_of
from flatlm.storage.metrics_log import N_PARAMS

# what no measurement gives; every measurement's keys are named by its registered quantities
# (flatlm.measure.registry.Measurement.quantities: label and unit), a plug-in's too
NAMES = {N_PARAMS: "parameters", "step": "training step"}
ACCURACY_STAGES = {"probe": "probe accuracy", "random_init": "random-init probe accuracy",
                   "lookup": "lookup-table probe accuracy", "finetune": "fine-tuned accuracy"}


def is_accuracy(key: str) -> bool:
    """``<stage>/<task>/acc_mean``: an accuracy in [0, 1], shown in %."""
    parts = key.split("/")
    return len(parts) == 3 and parts[0] in ACCURACY_STAGES and parts[2] == "acc_mean"


def plain_name(key: str) -> str:
    """A metric's name in words (the key itself when it has none).

    >>> plain_name("flat/sharpness_worst_linf"), plain_name("noise/loss_delta_0.03")
    ('worst-case sharpness, L-inf', 'loss rise under weight noise 0.03')
    >>> plain_name("flat/trace_fisher_grown_head_norm"), plain_name("made/up")
    ('grown Tr(F), head_norm construction', 'made/up')
    """
    if is_accuracy(key):
        stage, task, _ = key.split("/")
        return f"task {task} {ACCURACY_STAGES[stage]}"
    if key in NAMES:
        return NAMES[key]
    found = quantity_of(key)
    return key if found is None else found[1].name_of(key)


def unit_of(key: str) -> str | None:
    """The unit its registered quantity declares (``nats/token``), or None."""
    found = quantity_of(key)
    return None if found is None else found[1].unit


def axis_label(key: str) -> str:
    """The plain name with its unit: ``KL to the truth (nats/token)``; an accuracy in %."""
    unit = "%" if is_accuracy(key) else unit_of(key)
    return f"{plain_name(key)} ({unit})" if unit else plain_name(key)


def count_label(n: float) -> str:
    """A parameter count in three significant digits at most: ``114k``, ``2.4M``."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def percent_axis(ax, axis: str = "y") -> None:
    """Tick labels of an accuracy axis (values in [0, 1]) in %, the unit its label names."""
    from matplotlib.ticker import FuncFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.4g}"))


def label_axis(ax, axis: str, key: str) -> None:
    """``axis_label(key)`` on ``axis`` ("x" or "y"), with % ticks for an accuracy."""
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(axis_label(key))
    if is_accuracy(key):
        percent_axis(ax, axis)


SAME_COUNT = 1.02  # counts within 2% share one tick (a pre-LN twin of a shape: 213352, 213480)


def _apart(values: np.ndarray, ratio: float) -> np.ndarray:
    """The sorted positive ``values`` less each within ``ratio`` of the last one kept."""
    kept: list[float] = []
    for v in values:
        if not kept or v / kept[-1] >= ratio:
            kept.append(float(v))
    return np.array(kept)


def count_axis(ax, counts, axis: str = "x", names: dict | None = None) -> None:
    """A log axis of parameter counts, ticked at the counts drawn and labelled ``114k``, with no
    minor labels: matplotlib labels every minor tick of a narrow log axis (``1.2 x 10^5``), and
    those labels print over each other. ``names``: count -> what has it (a model), written under
    the count (``114k`` / ``d64-h4-l2-i256``), the counts of one tick joined."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, NullFormatter, NullLocator

    values = np.sort(pd.to_numeric(pd.Series(list(counts)), errors="coerce").dropna().unique())
    values = _apart(values[values > 0], SAME_COUNT)
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    if not len(values):
        return
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(values))
    target.set_major_formatter(FixedFormatter([_count_tick(v, names) for v in values]))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())


def short_names(names: dict) -> tuple[dict, str]:
    """(key -> the parts of its name that differ, the pattern they share) for names of one form:
    ``d64-h4-l2-i256``, ``d64-h4-l3-i256`` -> ``l2``, ``l3`` and ``d64-h4-*-i256`` (whole names on
    ticks print over each other); names of different forms are kept whole, with no pattern.

    >>> short_names({1: "d64-h4-l2-i256", 2: "d64-h4-l3-i256"})
    ({1: 'l2', 2: 'l3'}, 'd64-h4-*-i256')
    """
    split = {k: str(v).split("-") for k, v in names.items()}
    if len({len(parts) for parts in split.values()}) != 1 or len(set(names.values())) < 2:
        return dict(names), ""
    columns = list(zip(*split.values(), strict=True))
    same = [len(set(column)) == 1 for column in columns]
    pattern = "-".join(column[0] if one else "*" for column, one in zip(columns, same,
                                                                       strict=True))
    short = {k: "-".join(p for p, one in zip(parts, same, strict=True) if not one)
             for k, parts in split.items()}
    return short, pattern


def _count_tick(value: float, names: dict | None) -> str:
    """``114k``, and under it the names of the counts within ``SAME_COUNT`` of ``value``."""
    near = sorted({str(name) for n, name in (names or {}).items()
                   if max(n, value) / min(n, value) < SAME_COUNT})
    return "\n".join([count_label(value), *(["/".join(near)] if near else [])])


def overlapping(labels, renderer) -> bool:
    """Whether any two of the visible, non-empty tick ``labels`` overlap on the canvas."""
    boxes = [t.get_window_extent(renderer) for t in labels
             if t.get_visible() and t.get_text()]
    return any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def untangle_ticks(fig) -> None:
    """Every x axis of ``fig`` whose tick labels (major and minor) overlap: the minor labels
    dropped, then the labels rotated 30 degrees, then, while they still overlap, only every
    n-th one labelled (n = 2, 3, ...). Run on the figure as laid out, just before it is saved:
    extents depend on the layout."""
    from matplotlib.ticker import NullFormatter

    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    tangled = lambda ax: overlapping(ax.get_xticklabels(which="both"), renderer)  # noqa: E731
    for ax in fig.axes:
        if not tangled(ax):
            continue
        ax.xaxis.set_minor_formatter(NullFormatter())
        fig.draw_without_rendering()
        if not tangled(ax):
            continue
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")
        shown, step = ax.xaxis.get_major_formatter(), 2
        fig.draw_without_rendering()
        while tangled(ax) and step <= 10:
            ax.xaxis.set_major_formatter(_every(shown, step))
            fig.draw_without_rendering()
            step += 1


def _every(formatter, step: int):
    """``formatter``'s labels at every ``step``-th tick, the others blank."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, pos: formatter(x, pos) if (pos or 0) % step == 0 else "")
