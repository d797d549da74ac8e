"""``metrics.jsonl``, a trial's measurement log: its one writer and its one reader.

One JSON object per line, ``{"step": N, <metric key>: value, ...}``, appended by the trial at
every checkpoint (``flatlm.runs.trial``). Everything that needs a trial's metrics reads them through
:func:`read_metrics` or :func:`parse_metrics`, with one rule for a step written twice (a resumed
trial that measured a checkpoint again): **the last row of a step wins**. A torn last line (a
crash mid-write) is skipped, and the next append starts on a fresh line.

>>> parse_metrics('{"step": 2, "a": 1.0}\\n{"step": 2, "a": 3.0}\\n{"step": 4, "a"')
{2: {'step': 2, 'a': 3.0}}

Beside it, ``train_log.jsonl`` holds the training curve: the means of each ``train.log_every``
window (``{"step", "train/loss", "train/lr", ...}``), rewritten whole at every checkpoint from
the run's history (so a resumed run's file is that checkpoint's history, then continues).

No torch, no MLflow here: the tracker (``flatlm.tracking.tracker``) and the analysis read the
same file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flatlm.core.safe_io import append_bytes, write_atomic

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CHECKPOINT_METRICS_FILE = "metrics.json"  # one row, in each checkpoints/step-<N>/
TRAIN_LOG_FILE = "train_log.jsonl"  # the training curve (module docstring)
N_PARAMS = "n_params"  # in every checkpoint's row besides its measurements: the model's
#   parameter count (a number to sort and plot by; the analysis' model size)


def is_number(v) -> bool:
    """A metric value (booleans and strings are not)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def parse_metrics(text: str, where: str = "metrics.jsonl") -> dict[int, dict]:
    """step -> row (``step`` included) from ``metrics.jsonl`` text; the last row of a step wins.

    Lines that are not a JSON object with a ``step`` (a torn last line) are skipped with a
    warning naming ``where``.
    """
    rows: dict[int, dict] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["step"])  # a non-finite step (1e400) overflows: not a row either
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError):
            log.warning("%s line %d is not a metrics row (a torn write?); skipped", where, n)
            continue
        rows[step] = row
    return rows


def read_metrics(out_dir: str | Path) -> dict[int, dict]:
    """step -> row from ``out_dir/metrics.jsonl`` (the last row of a step wins), and from the
    ``metrics.json`` of checkpoints the log lacks (a checkpoint restored from elsewhere)."""
    out_dir = Path(out_dir)
    rows: dict[int, dict] = {}
    for path in sorted(out_dir.glob(f"checkpoints/step-*/{CHECKPOINT_METRICS_FILE}")):
        rows.update(parse_metrics(_text(path), str(path)))
    path = out_dir / METRICS_FILE
    if path.exists():
        rows.update(parse_metrics(_text(path), str(path)))
    return rows


def _text(path: Path) -> str:
    """A log's text; bytes that are not UTF-8 (a damaged disk block) become U+FFFD, so their
    line fails to parse and is skipped with parse_metrics' warning, not the whole log."""
    return path.read_bytes().decode("utf-8", errors="replace")


def write_train_log(out_dir: str | Path, history: list[dict]) -> None:
    """Replaces ``out_dir/train_log.jsonl`` with ``history`` (one row per log window)."""
    text = "".join(json.dumps(row) + "\n" for row in history)
    write_atomic(Path(out_dir) / TRAIN_LOG_FILE, text)  # no link followed or renamed over


def read_train_log(out_dir: str | Path) -> dict[int, dict]:
    """step -> row of the training curve (empty when the run has not checkpointed yet)."""
    path = Path(out_dir) / TRAIN_LOG_FILE
    return parse_metrics(path.read_text(), str(path)) if path.exists() else {}


def append_metrics(out_dir: str | Path, step: int, metrics: dict) -> None:
    """Appends ``{"step": step, **metrics}`` to ``out_dir/metrics.jsonl``, on a line of its own
    even after a torn last line."""
    row = json.dumps({"step": int(step), **metrics}) + "\n"
    append_bytes(Path(out_dir) / METRICS_FILE, row.encode())  # never through a link
