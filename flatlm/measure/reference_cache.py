"""Reference rows on disk, shared by the trials of a sweep and by ``flatlm measure`` runs.

A reference row (``flatlm.measure``: the random-init model's probe, the lookup table's) depends
on the language, the evaluation data, the seeds, the probe's settings and, for the random-init
model, its shape; not on the trained model. ``measure.run`` computes each once per trial; with a
cache directory (the shared eval cache's, ``measure.eval_cache``) once per sweep: a file is
``<cache_dir>/reference-<key>.json``, the key a hash of every one of those and of the device
type (a GPU's rounding can flip a near tie of a CPU's), written whole under a temporary name and
renamed. A file that cannot be read back is computed again and replaced, with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from flatlm.core.config import to_dict
from flatlm.core.seeds import derive_seed
from flatlm.measure.eval_cache import UNREADABLE, cache_key, replace_atomically
from flatlm.models.masked_lm import build_model
from flatlm.models.presets import ModelConfig

log = logging.getLogger(__name__)

FORMAT = "flatlm.reference/1"  # bump when what a reference row holds, or how, changes


def random_features_model(model_cfg: ModelConfig | dict, source, seed: int) -> nn.Module:
    """The trial's shape randomly initialised, in eval mode: what the random-init reference rows
    (``random_init/*``, ``cka/truth_random_init``) measure; one model for a trial of
    ``measure.seed`` = ``seed``, however many references build it."""
    if isinstance(model_cfg, dict):
        model_cfg = ModelConfig(**model_cfg)
    return build_model(model_cfg, source.V, source.max_length,
                       seed=derive_seed(seed, "random-features")).eval()


def reference_rows(cache_dir: str | Path | None, data_key: str, stage: str, probe_cfg, device,
                   make: Callable[[], dict[str, float]], *,
                   shape: dict | None = None) -> dict[str, float]:
    """Reference ``stage``'s rows from ``make()``, or from ``cache_dir`` where a trial with the
    same evaluation data (``data_key``), probe settings, device type and, for the random-init
    model, ``shape`` (its ``ModelConfig`` as a dict) stored them."""
    fields = {"probe": to_dict(probe_cfg), "device": torch.device(device).type, "shape": shape}
    metrics, hit = cached_metrics(cache_dir, reference_key(data_key, stage, fields), make)
    if hit:
        log.info("reference rows %s read from %s", stage, cache_dir)
    return metrics


def reference_key(data_key: str, stage: str, fields: dict) -> str:
    """The key of reference ``stage`` on the evaluation data ``data_key``
    (``measure.eval_cache.cache_key``) with the settings in ``fields``."""
    return cache_key(FORMAT, {}, {"data": data_key, "stage": stage, **fields})


def cached_metrics(cache_dir: str | Path | None, key: str,
                   make: Callable[[], dict[str, float]]) -> tuple[dict[str, float], bool]:
    """(``make()``, False), or (the metrics a previous call under ``key`` stored, True).
    ``cache_dir`` None: no cache."""
    if cache_dir is None:
        return make(), False
    path = Path(cache_dir) / f"reference-{key}.json"
    metrics = _read_metrics(path) if path.is_file() else None
    if metrics is not None:
        return metrics, True
    metrics = make()
    text = json.dumps({"format": FORMAT, "metrics": metrics}, indent=1)
    replace_atomically(path, lambda tmp: tmp.write_text(text))
    return metrics, False


def _read_metrics(path: Path) -> dict[str, float] | None:
    """The stored metrics, or None (and a warning) if the file is damaged."""
    try:
        stored = json.loads(path.read_text())
        metrics = stored["metrics"]
        if stored["format"] == FORMAT and all(
                isinstance(k, str) and isinstance(v, float | int) and not isinstance(v, bool)
                for k, v in metrics.items()):
            return {k: float(v) for k, v in metrics.items()}
        problem = "not a reference row of this format"
    except (*UNREADABLE, OSError, AttributeError) as e:
        problem = str(e)
    log.warning("%s cannot be read (%s): computing it again", path, problem)
    return None

