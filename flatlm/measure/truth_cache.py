"""The true conditionals a trial's checkpoints are measured against, computed once per trial.

The pre-training loss and the flatness estimators compare the model with the source's exact
conditionals Pr(. | x_{-t}) at fixed masked inputs of the trial's evaluation data (``EvalData``):
the same numbers at every checkpoint, which inside-outside recomputed at each (37 s of the 10^6
validation sentences of the gpu scale, on an H200). Here they are computed at the first checkpoint
that needs them, by the same function with the same chunks (so the same bits), and kept in
``EvalData.cache`` for the trial's later checkpoints, on the measuring device, when they fit in
``measure.truth_cache_mb``; larger ones are computed at every checkpoint, as before.

The lookup table's truth and the downstream labels are computed once already (the reference rows,
``measure.reference_cache``; the evaluation data, ``measure.eval_cache``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from flatlm.measure.curvature.common import FlatnessConfig, masked_inputs
from flatlm.measure.curvature.flatness import soft_labels
from flatlm.measure.loss import LossConfig, pair_truth

log = logging.getLogger(__name__)


def loss_truth(source, data, cfg: LossConfig, device, budget_mb: float) -> torch.Tensor | None:
    """``pair_truth`` of the validation sentences under ``cfg`` (P, V) on ``device``, kept for
    the trial; None for a source without a truth (``loss_terms`` then needs none)."""
    if not source.has_truth:
        return None
    key = ("truth/loss", cfg.positions, cfg.batch_size, cfg.seed, str(device))
    return _kept(data, key, budget_mb, lambda: pair_truth(source, data.tokens, data.lengths,
                                                         cfg, device=device))


def flatness_labels(source, data, cfg: FlatnessConfig, device, budget_mb: float) -> torch.Tensor:
    """``soft_labels`` at ``measure_flatness``'s masked inputs (n, V), float64 on the CPU as
    ``soft_labels`` gives them, kept for the trial."""
    n, seed = cfg.n_inputs, cfg.seed
    key = ("truth/flatness", n, seed, str(device))

    def compute() -> torch.Tensor:
        x = masked_inputs(data.tokens, data.lengths, seed, n=n)
        m = len(x)
        return soft_labels(source, data.tokens[:m], data.lengths[:m], x.positions, device=device)

    return _kept(data, key, budget_mb, compute)


def _kept(data, key: tuple, budget_mb: float, compute: Callable[[], torch.Tensor]):
    """``data.cache[key]``, computed by ``compute()`` the first time; a result over the budget
    (together with what is kept already) is returned without being kept."""
    if key in data.cache:
        return data.cache[key]
    value = compute()
    kept = sum(t.numel() * t.element_size() for k, t in data.cache.items()
               if isinstance(k, tuple) and k[0].startswith("truth/"))
    size = value.numel() * value.element_size()
    if kept + size <= budget_mb * 2**20:
        data.cache[key] = value
    else:
        log.info("true conditionals %s (%.0f MB) exceed measure.truth_cache_mb=%s: computed "
                 "at every checkpoint", key[0], size / 2**20, budget_mb)
    return value

