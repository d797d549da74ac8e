"""``curves.png`` of one trial: its training loss and its measurements over training steps, with
each measurement's standard error as bars, drawn in the trial's own process with matplotlib
alone (Ray workers import nothing from ``analysis/``)."""

from __future__ import annotations

import io
import math
from pathlib import Path

from flatlm.core.safe_io import write_atomic
from flatlm.measure import se_key

PANEL_IN = 3.6  # inches per panel
LOG_SCALE_PREFIXES = ("pretrain/", "flat/")  # positive quantities spanning decades
TRAIN_LOSS = "train/loss"


def plot_curves(rows: dict[int, dict], keys: list[str], path: Path, title: str,
                train_rows: dict[int, dict] | None = None) -> Path | None:
    """One panel per key of ``keys`` present in ``rows`` (step -> metrics, as
    ``flatlm.storage.metrics_log.read_metrics`` gives), after a first panel of the training loss
    from ``train_rows`` (``read_train_log``) when given; None when nothing has a value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = {}
    if train_rows:
        panels[TRAIN_LOSS] = _series(train_rows, TRAIN_LOSS)
    panels.update({k: _series(rows, k) for k in keys})
    panels = {k: v for k, v in panels.items() if v}
    if not panels:
        return None
    cols = min(len(panels), 3)
    nrows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(PANEL_IN * cols, PANEL_IN * nrows * 0.8), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (key, points) in enumerate(panels.items()):
        ax = fig.add_subplot(nrows, cols, i + 1)
        steps, values, errors = zip(*points, strict=True)
        has_err = any(e is not None for e in errors)
        ax.errorbar(steps, values, yerr=[e or 0.0 for e in errors] if has_err else None,
                    marker="." if key != TRAIN_LOSS else None, lw=1, capsize=2, elinewidth=0.6)
        ax.set_xlabel("step")
        ax.set_ylabel(key + (" (± s.e.)" if has_err else ""))
        if key.startswith(LOG_SCALE_PREFIXES) and all(v > 0 for v in values):
            ax.set_yscale("log")
    fig.suptitle(title, fontsize=9)

    png = io.BytesIO()
    fig.savefig(png, dpi=100, format="png")
    write_atomic(path, png.getvalue())  # never through a link planted in the trial directory
    return path


def _series(rows: dict[int, dict], key: str) -> list[tuple[int, float, float | None]]:
    """(step, value, standard error or None) of every step where ``key`` is a finite number."""
    out = []
    for step in sorted(rows):
        value = rows[step].get(key)
        if _finite(value):
            se = rows[step].get(se_key(key))
            out.append((step, value, se if _finite(se) and se >= 0 else None))
    return out


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
