"""The lookup table's downstream accuracy (A.5): the linear probe on the exact conditionals.

The lookup table is the model whose output at every masked input is the true conditional
Pr(. | x_{-t}); its pre-training loss is the entropy, and its contextual embedding of sentence x is
the concatenation of the true conditionals of every position, each masked in turn:

    phi(x) = [Pr(. | x_{-1}), .., Pr(. | x_{-T})] in R^{T V}   (padded positions zero),

i.e. ``source.conditionals(tokens, lengths)`` flattened. The probe, the label handling and the
split are those of ``measure.probe`` (same ``ProbeConfig``), so lookup and model accuracies on one
task and seed are measured on the same test sentences.
"""

from __future__ import annotations

import torch

from flatlm.measure.probes.probe import (
    ProbeConfig,
    downstream_sentences,
    linear_probe_accuracy,
    probe_metrics,
)
from flatlm.sources.base import Source


def lookup_features(source: Source, tokens, lengths, *, device="cpu") -> torch.Tensor:
    """phi(x): [n, T V] float32 on ``device``, the exact conditionals of every position."""
    truth = source.conditionals(tokens, lengths, device=device, dtype=torch.float32)  # (n, T, V)
    return truth.flatten(1)


def lookup_table_accuracy(
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    classes: torch.Tensor,
    task: str,
    cfg: ProbeConfig,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """``lookup/<task>/<stat>`` (the probe's statistics, ``flatlm.measure``) on the downstream
    sentences with their class ids (``sample_downstream``)."""
    tokens, lengths, classes, num_classes = downstream_sentences(source, tokens, lengths,
                                                                 classes, task)
    features = lookup_features(source, tokens, lengths, device=device)
    result = linear_probe_accuracy(features, classes, num_classes, cfg)
    return probe_metrics("lookup", task, result, num_classes)
