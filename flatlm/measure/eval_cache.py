"""Evaluation data on disk, shared by the trials of a sweep: drawn (and labelled) once, keyed by
what defines it.

The validation and labelled downstream sentences of ``measure.run.eval_data`` depend only on the
language, the measurement seed, the sizes, the label rule and the tasks, not on the model: every
trial of a sweep measures on the same sentences, so the exact truth behind the labels (minutes of
inside-outside on a CPU for 10^5 sentences of the paper's grammar) is paid once. A file is
``<cache_dir>/eval-<key>.pt`` (tensors only, read with ``weights_only=True``), written to a
temporary name and renamed, so concurrent trials either find a whole file or draw their own. A
file that cannot be read back (torn by a full disk, edited, of another format) is drawn again and
replaced, with a warning. ``measure.reference_cache`` keeps the reference rows the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger(__name__)

FORMAT = "flatlm.eval/1"
# what reading a damaged or foreign file raises (torch.load, json.loads): redraw, do not crash
UNREADABLE = (EOFError, RuntimeError, ValueError, KeyError, TypeError, pickle.UnpicklingError,
              zipfile.BadZipFile)


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
    tensors = _read_tensors(path) if path.is_file() else None
    if tensors is not None:
        return tensors
    tensors = make()
    replace_atomically(path, lambda tmp: torch.save(tensors, tmp))
    return tensors


def _read_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    """The stored dict of tensors, or None (and a warning) if the file is damaged."""
    try:
        tensors = torch.load(path, weights_only=True)
        if isinstance(tensors, dict) and all(isinstance(t, torch.Tensor)
                                             for t in tensors.values()):
            return tensors
        problem = "not a dict of tensors"
    except UNREADABLE as e:
        problem = str(e)
    log.warning("evaluation cache %s does not load (%s): drawing it again", path, problem)
    return None


def replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then renamed to ``path``: a reader
    sees no file or a whole one, and concurrent writers each leave a whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:  # a failed or interrupted write leaves no temporary file behind
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_temporaries(cache_dir: str | Path) -> int:
    """Removes the temporaries a killed writer left in ``cache_dir`` (call it when no writer
    runs: a sweep's end); returns how many."""
    stale = list(Path(cache_dir).glob(".eval-*.tmp"))
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)
