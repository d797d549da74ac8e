"""Label-noise SGD (``algorithm="label_noise"``): the implicit regulariser of paper Section 3.3.

SGD with label noise (Blanc et al., 2020; Damian, Ma & Lee, 2021; Li, Wang & Arora, 2021) drifts,
among the minimisers of the loss, towards flatter ones (a smaller trace of the Hessian). Here the
noise is on the masked words' targets: at update i each target is, independently with probability
``train.label_noise.p``, replaced by a word drawn uniformly from the ``V`` words of the vocabulary
(so it may be the same word: the target changes with probability p (1 - 1/V)). The model's input is
untouched (the [MASK] / random / unchanged rule is the masking's). The draws come from
``generator(seed, "label_noise", i)``, a stream of their own: the batches, masks and dropout are
those of plain SGD, p = 0 is plain SGD bit for bit, and a resumed run draws the same noise. The
update is ``standard_step`` on the noisy targets, with sgd's defaults (no momentum, weight decay
0.01, dropout 0.1, warmup over 12% of the steps); ``train/loss`` is the loss on the noisy targets.
``noisy_batch`` is the algorithm's batch transform (``flatlm.train.registry``): the pipeline
applies it to the whole batch, before a data-parallel rank takes its slice.
"""

from __future__ import annotations

import dataclasses

import torch

from flatlm.core.seeds import generator
from flatlm.train.config import TrainConfig
from flatlm.train.data import MLMBatch


def noisy_targets(targets: torch.Tensor, positions: torch.Tensor, p: float, n_words: int,
                  gen: torch.Generator) -> torch.Tensor:
    """``targets`` with each masked word's target replaced, with probability ``p``, by a
    uniform word of ``n_words``. One uniform and one word are drawn per target slot (``targets``'
    shape), in that order, whether the slot is masked or not, so the draws do not depend on p."""
    u = torch.rand(targets.shape, generator=gen, dtype=torch.float64)
    words = torch.randint(0, n_words, targets.shape, generator=gen)
    replace = u < p
    if positions.dtype == torch.bool:  # at a rate: only the masked words carry a target
        replace &= positions
    return torch.where(replace, words, targets)


def with_label_noise(batch: MLMBatch, p: float, n_words: int, seed: int, i: int) -> MLMBatch:
    """Update i's batch with noisy targets (the module docstring's rule)."""
    targets = noisy_targets(batch.targets, batch.positions, p, n_words,
                            generator(seed, "label_noise", i))
    return dataclasses.replace(batch, targets=targets)


def noisy_batch(batch: MLMBatch, cfg: TrainConfig, n_words: int, i: int) -> MLMBatch:
    """``label_noise``'s batch transform: update i's batch noised at ``train.label_noise.p``."""
    return with_label_noise(batch, cfg.label_noise.p, n_words, cfg.seed, i)
