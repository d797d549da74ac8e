"""Evaluation data on disk, shared by the trials of a sweep: drawn (and labelled) once, keyed by
what defines it.

The validation and labelled downstream sentences of ``measure.run.eval_data`` depend only on the
language, the measurement seed, the sizes, the label rule and the tasks, not on the model: every
trial of a sweep measures on the same sentences, so the exact truth behind the labels (minutes of
inside-outside on a CPU for 10^5 sentences of the paper's grammar) is paid once. A file is
``<cache_dir>/eval-<key>.pt`` (tensors only, read with ``weights_only=True``), written to a
temporary name and renamed, so concurrent trials either find a whole file or draw their own.
A file that does not load (truncated, damaged) is drawn again and replaced, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

FORMAT = "flatlm.eval/1"

log = logging.getLogger(__name__)


def cache_key(fingerprint: str, spec: dict, fields: dict) -> str:
    """sha256 (first 24 hex digits) of the language and the fields that define the data."""
    text = json.dumps({"format": FORMAT, "fingerprint": fingerprint, "spec": spec, **fields},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cached_tensors(cache_dir: str | Path | None, key: str,
                   make: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``make()`` (a dict of CPU tensors), read from ``cache_dir`` when a previous call under the
    same ``key`` stored it, else computed and stored. ``cache_dir`` None: no cache."""
    if cache_dir is None:
        return make()
    path = Path(cache_dir) / f"eval-{key}.pt"
    if path.is_file():
        try:
            return torch.load(path, weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file: draw it again
            why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            log.warning("evaluation cache %s does not load (%s: %s); drawing it again",
                        path, type(e).__name__, why)
    tensors = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    torch.save(tensors, tmp)
    os.replace(tmp, path)  # atomic: a reader sees no file or a whole one
    return tensors
