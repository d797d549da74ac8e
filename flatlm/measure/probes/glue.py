"""GLUE fine-tuning (paper A.2): train on a task's train split, score its dev split with GLUE's
metrics, under GLUE's metric names.

The model is fine-tuned as ``measure.finetune`` does it ([CLS] state, a fresh linear head, the
whole model trained with AdamW; ``FinetuneConfig``), once per seed, on the source's train split of
the task (``Source.glue_split``), and its dev-split predictions are scored with the metrics
the GLUE benchmark reports for that task (scikit-learn's implementations, which the ``evaluate``
library's ``glue`` metric calls): CoLA Matthews correlation, MRPC and QQP accuracy and F1 of class
1, the others accuracy. Keys: ``glue/<task>/<metric>`` (mean over seeds) and
``glue/<task>/<metric>_std``; on a source that drops words of the task's text (the LM source:
those outside its vocabulary) also ``glue/<task>/oov_fraction``, the share dropped.

>>> glue_scores("mrpc", [1, 0, 1, 1], [1, 0, 0, 1])
{'accuracy': 0.75, 'f1': 0.8}
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from flatlm.core.seeds import derive_seed
from flatlm.core.tokens import encode
from flatlm.measure import glue_key
from flatlm.measure.probes.finetune import FinetuneConfig, finetuned_predictions

# task -> the metrics GLUE reports for it (names as the ``evaluate`` library's ``glue`` metric)
GLUE_METRICS = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "qqp": ("accuracy", "f1"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}


def glue_scores(task: str, y_true, y_pred) -> dict[str, float]:
    """GLUE's metrics of ``task`` for the given labels and predictions."""
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    if task not in GLUE_METRICS:
        raise ValueError(f"GLUE task {task!r} is unknown; use one of {', '.join(GLUE_METRICS)}")
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    scores = {"matthews_correlation": lambda: matthews_corrcoef(y_true, y_pred),
              "accuracy": lambda: accuracy_score(y_true, y_pred),
              "f1": lambda: f1_score(y_true, y_pred, zero_division=0.0)}
    return {name: float(scores[name]()) for name in GLUE_METRICS[task]}


def _encoded(source, task: str, split: str, device) -> tuple[torch.Tensor, ...]:
    tokens, lengths, labels = source.glue_split(task, split)
    ids, mask = encode(tokens.to(device), lengths.to(device))  # (n, T+2)
    return ids, mask, labels.to(device)


def glue_finetune(model: nn.Module, source, task: str, cfg: FinetuneConfig,
                  device: str | torch.device | None = None) -> dict[str, float]:
    """``glue/<task>/<metric>`` and ``_std`` over ``cfg.seeds`` fine-tuning runs of ``model`` on
    ``source``'s GLUE ``task`` (run s seeded derive_seed(cfg.seed, "glue", s)); ``model`` is
    copied, never modified."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    train, dev = _encoded(source, task, "train", device), _encoded(source, task, "dev", device)
    runs = []
    for s in range(cfg.seeds):
        pred = finetuned_predictions(model, train, dev[:2], source.num_classes(task), cfg,
                                     derive_seed(cfg.seed, "glue", s))
        runs.append(glue_scores(task, dev[2].cpu(), pred.cpu()))
    out = {}
    for metric in GLUE_METRICS[task]:
        values = np.array([r[metric] for r in runs])
        out[glue_key(task, metric)] = float(values.mean())
        out[f"{glue_key(task, metric)}_std"] = float(values.std(ddof=1)) if len(runs) > 1 else 0.0
    if hasattr(source, "glue_oov_fraction"):
        out[glue_key(task, "oov_fraction")] = source.glue_oov_fraction(task)
    return out
