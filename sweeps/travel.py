"""What a trial's Tune checkpoint carries to a fresh node besides the model: the trial's
``metrics.jsonl``, the tracker's ledger and state (with the MLflow run id). No Ray here: the
trainable hands in the checkpoint directory.

Layout added to a checkpoint directory: ``tracking.json`` (``{"run_id", "step"}``) and
``outbox/<file>`` for each of :data:`TRAVELLING`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flatlm.storage.metrics_log import METRICS_FILE
from flatlm.tracking.ledger import STATE_FILE, TRACKER_FILES

TRAVELLING = (*TRACKER_FILES, METRICS_FILE)  # trial files a checkpoint carries to a new node
TRACKING_FILE = "tracking.json"
CARRIED_DIR = "outbox"


def save_tracking(ckpt_dir: Path, out_dir: Path, run_id: str | None, step: int) -> None:
    """Copies the run id and the :data:`TRAVELLING` files into the checkpoint Tune persists (a new
    node then re-sends what MLflow missed and keeps the trial's full ``metrics.jsonl``)."""
    (ckpt_dir / TRACKING_FILE).write_text(json.dumps({"run_id": run_id, "step": step}))
    (ckpt_dir / CARRIED_DIR).mkdir(exist_ok=True)
    for name in TRAVELLING:
        if (out_dir / name).exists():
            shutil.copy2(out_dir / name, ckpt_dir / CARRIED_DIR / name)


def restore_tracking(ckpt_dir: Path, out_dir: Path) -> str | None:
    """Copies Tune's checkpoint ``ckpt_dir`` into ``out_dir/checkpoints/step-<N>`` (if missing),
    and its :data:`TRAVELLING` files into ``out_dir`` on a node that has no tracker state yet;
    returns the checkpoint's MLflow run id."""
    info = json.loads((ckpt_dir / TRACKING_FILE).read_text())
    target = out_dir / "checkpoints" / f"step-{info['step']}"
    if not target.exists():
        shutil.copytree(ckpt_dir, target, ignore=shutil.ignore_patterns(CARRIED_DIR))
    if not (out_dir / STATE_FILE).exists():
        for name in TRAVELLING:
            if (ckpt_dir / CARRIED_DIR / name).exists():
                shutil.copy2(ckpt_dir / CARRIED_DIR / name, out_dir / name)
    return info.get("run_id")
