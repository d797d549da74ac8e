"""``curves.png`` of one trial: its measurements over training steps, drawn in the trial's own
process with matplotlib alone (Ray workers import nothing from ``analysis/``)."""

from __future__ import annotations

import math
from pathlib import Path

PANEL_IN = 3.6  # inches per panel
LOG_SCALE_PREFIXES = ("pretrain/", "flat/")  # positive quantities spanning decades


def plot_curves(rows: dict[int, dict], keys: list[str], path: Path, title: str) -> Path | None:
    """One panel per key of ``keys`` present in ``rows`` (step -> metrics, as
    ``flatlm.metrics_log.read_metrics`` gives); None when no key has a value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    steps = sorted(rows)
    series = {k: [(s, rows[s][k]) for s in steps if _finite(rows[s].get(k))] for k in keys}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    cols = min(len(series), 3)
    nrows = math.ceil(len(series) / cols)
    fig = Figure(figsize=(PANEL_IN * cols, PANEL_IN * nrows * 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (key, points) in enumerate(series.items()):
        ax = fig.add_subplot(nrows, cols, i + 1)
        ax.plot([s for s, _ in points], [v for _, v in points], marker=".", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        if key.startswith(LOG_SCALE_PREFIXES) and all(v > 0 for _, v in points):
            ax.set_yscale("log")
    fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=100)
    return path


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
