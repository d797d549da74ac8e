"""What of a trial's ``metrics.jsonl`` has reached its MLflow run: the tracker's two files.

The trial's own ``metrics.jsonl`` (``flatlm.storage.metrics_log``) is the only copy of its
metrics; the tracker (``flatlm.tracking.tracker``) keeps beside it, in the trial directory:

* ``sent.jsonl``, the sent ledger: one ``{"step": N, "keys": [...]}`` per batch MLflow accepted
  (or refused for good), written after the send, so a crash in between re-sends at most that
  batch, and the run's history catches the repeat;
* ``tracker.json``, the tracker's state: the run id, the status a ``finish`` could not deliver,
  and the artifacts still to upload (replaced atomically).

What is left to send is ``metrics.jsonl`` minus the ledger (:meth:`Ledger.unsent`). No MLflow
here.

>>> import tempfile
>>> d = tempfile.mkdtemp()
>>> ledger = Ledger(d)
>>> ledger.mark(10, ["pretrain/loss"])
>>> Ledger(d).unsent({10: {"step": 10, "pretrain/loss": 1.5, "pretrain/kl": 0.5, "note": "x"}})
{10: {'pretrain/kl': 0.5}}
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from flatlm.core.safe_io import append_bytes, write_atomic
from flatlm.storage.metrics_log import is_number

log = logging.getLogger(__name__)

SENT_FILE = "sent.jsonl"
STATE_FILE = "tracker.json"
TRACKER_FILES = (SENT_FILE, STATE_FILE)


class Ledger:
    """The ``(step, key)`` pairs of a trial that are settled in its MLflow run."""

    def __init__(self, trial_dir: str | os.PathLike):
        self.path = Path(trial_dir) / SENT_FILE
        self._settled: set[tuple[int, str]] = set()
        for row in _read_jsonl(self.path):
            if "step" in row and "keys" in row:  # older ledgers also listed artifacts
                self._settled.update((int(row["step"]), str(k)) for k in row["keys"])

    def __contains__(self, step_key: tuple[int, str]) -> bool:
        return step_key in self._settled

    def mark(self, step: int, keys: Iterable[str]) -> None:
        """Records ``keys`` of ``step`` as settled (on disk before this returns)."""
        keys = [str(k) for k in keys]
        self._settled.update((int(step), k) for k in keys)
        line = json.dumps({"step": int(step), "keys": keys}) + "\n"
        append_bytes(self.path, line.encode(), fsync=True)  # after a torn line: a fresh one

    def unsent(self, rows: dict[int, dict]) -> dict[int, dict[str, float]]:
        """step -> {key: value} of the numeric metrics in ``rows`` (``read_metrics``'s step ->
        row) that are not settled yet."""
        out: dict[int, dict[str, float]] = {}
        for step, row in rows.items():
            for key, value in row.items():
                if key != "step" and is_number(value) and (step, key) not in self._settled:
                    out.setdefault(step, {})[key] = float(value)
        return out


def read_state(trial_dir: str | os.PathLike) -> dict | None:
    """The tracker's state (``tracker.json``), or None if there is none yet."""
    try:
        return json.loads((Path(trial_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_state(trial_dir: str | os.PathLike, state: dict) -> None:
    """Replaces ``tracker.json`` atomically (a crash leaves the old state or the new one)."""
    write_atomic(Path(trial_dir) / STATE_FILE, json.dumps(state, indent=1))  # no link followed


def set_aside(trial_dir: str | os.PathLike, run_id: str) -> None:
    """Renames the tracker's files of run ``run_id`` to ``*.run-<run_id>``: the directory is
    now tracked into another run (its ``metrics.jsonl`` stays: it is the trial's)."""
    log.warning("tracking files in %s belong to run %s; moved aside (*.run-%s)", trial_dir,
                run_id, run_id)
    for name in TRACKER_FILES:
        path = Path(trial_dir) / name
        if path.exists():
            os.replace(path, path.with_name(f"{name}.run-{run_id}"))


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file; a torn last line (a crash mid-write) is skipped."""
    rows = []
    try:
        text = path.read_text()
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("skipping a torn line in %s", path)
    return rows
