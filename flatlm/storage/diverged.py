"""A trial's divergence, recorded in its directory: every runner (``flatlm replicate``, the Ray
sweeps) writes and reads the same ``diverged.json``, so a diverged trial is reported, counted by
the analysis (``analysis/trials.py``: status FAILED) and not trained again on a rerun, where the
same seed would diverge at the same step.

>>> import tempfile; from pathlib import Path
>>> from flatlm.train.run import Diverged
>>> out = Path(tempfile.mkdtemp())
>>> record_divergence(out, Diverged(7, float("nan"), "is not finite"))
>>> divergence(out)["step"], divergence(out)["loss"]
(7, None)
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from flatlm.core.safe_io import write_atomic

DIVERGED_FILE = "diverged.json"  # {"step", "loss" (null when not finite), "message", "reason"}


def record_divergence(out_dir: str | Path, e) -> None:
    """Writes ``e`` (a ``flatlm.train.run.Diverged``) as valid JSON (no NaN or inf)."""
    loss = e.loss if math.isfinite(e.loss) else None
    write_atomic(Path(out_dir) / DIVERGED_FILE, json.dumps(
        {"step": e.step, "loss": loss, "message": str(e), "reason": e.reason},
        allow_nan=False) + "\n")


def divergence(out_dir: str | Path) -> dict | None:
    """The trial's divergence record, or None when it did not diverge (or its record is not
    readable JSON: then it counts as diverged with an unknown step)."""
    path = Path(out_dir) / DIVERGED_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {"step": None, "loss": None, "message": f"{path} is damaged"}
    return record if isinstance(record, dict) else {"step": None, "loss": None,
                                                    "message": f"{path} is damaged"}
