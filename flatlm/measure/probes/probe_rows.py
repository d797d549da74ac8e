"""The probe rows of one feature set: every task's linear probe (``measure.probe``, trained as
one batched problem by ``measure.probe_batched``, or task by task), its closed-form ridge twin
(``measure.ridge``) and the features' effective rank, under one stage's keys
(``<stage>/<task>/<stat>``, ``<stage>_ridge/<task>/<stat>``, ``<stage>/feature_rank``), and
each task's Bayes ceiling where its labels are not a function of the sentence
(``<stage>/<task>/bayes_ceiling``)."""

from __future__ import annotations

import torch

from flatlm.measure import BAYES_CEILING, probe_key
from flatlm.measure.probes.probe import (
    ProbeConfig,
    downstream_classes,
    linear_probe_accuracy,
    participation_ratio,
    probe_metrics,
    split_indices,
)
from flatlm.measure.probes.probe_batched import Draw, Task, probe_feature_sets
from flatlm.measure.probes.ridge import ridge_feature_sets, ridge_metrics
from flatlm.sources.base import Source


def downstream_tasks(source: Source, classes: dict[str, torch.Tensor]) -> list[Task]:
    """Each task's kept sentences and class ids (``probe.downstream_classes``)."""
    return [Task(name, *downstream_classes(source, y, name)) for name, y in classes.items()]


def probe_rows(features: torch.Tensor, source: Source, classes: dict[str, torch.Tensor],
               cfg: ProbeConfig, stage: str, *, draw: Draw | None = None,
               bayes: dict[str, torch.Tensor] | None = None,
               progress: bool = False) -> dict[str, float]:
    """Every key of ``stage`` for ``features`` [n, D] of the downstream sentences whose classes
    per task are ``classes`` (``Source.sample_downstream``'s ids, -1 = undefined). ``draw``:
    the same features with the encoder in train mode (``probe.train_mode_features``), which the
    heads train on when ``cfg.encoder_train_mode`` is on (``features`` are then the eval-mode
    ones they are evaluated on; the ridge probe and the rank read those too). ``bayes``: per
    task whose labels the sentence does not determine, each sentence's Bayes accuracy
    (``Source.bayes_accuracies``), averaged over the test split into its ceiling."""
    if cfg.encoder_train_mode and draw is None:
        raise ValueError(f"{stage}: probe.encoder_train_mode=true needs the train-mode features "
                         "(draw=probe.train_mode_features(model, ...))")
    tasks = downstream_tasks(source, classes)
    out = {f"{stage}/feature_rank": participation_ratio(features)}
    if cfg.batched:
        draws = {stage: draw} if cfg.encoder_train_mode else None
        results = probe_feature_sets({stage: features}, tasks, cfg, draws=draws,
                                     progress=progress)[stage]
    else:  # the reference implementation, task by task
        results = {task.name: linear_probe_accuracy(features[task.keep.to(features.device)],
                                                    task.classes, task.num_classes, cfg)
                   for task in tasks}
    for task in tasks:
        out.update(probe_metrics(stage, task.name, results[task.name], task.num_classes))
    out.update(bayes_ceilings(tasks, bayes or {}, cfg, stage))
    if cfg.ridge:
        out.update(ridge_metrics(stage, ridge_feature_sets({stage: features}, tasks, cfg)[stage]))
    return out


def bayes_ceilings(tasks: list[Task], bayes: dict[str, torch.Tensor], cfg: ProbeConfig,
                   stage: str) -> dict[str, float]:
    """``<stage>/<task>/bayes_ceiling`` of each task in ``bayes`` (per-sentence Bayes accuracies
    over all n downstream sentences): their mean over the test sentences of the split every
    probe of the task's kept sentences draws (``probe.split_indices``)."""
    out = {}
    for task in tasks:
        if task.name not in bayes:
            continue
        per_sentence = bayes[task.name].cpu()
        if per_sentence.shape != task.keep.shape:
            raise ValueError(f"{stage}: bayes[{task.name!r}] has shape "
                             f"{tuple(per_sentence.shape)}, the task's classes "
                             f"{tuple(task.keep.shape)}: give one Bayes accuracy per downstream "
                             "sentence (Source.bayes_accuracies of the same sentences)")
        kept = per_sentence[task.keep.cpu()]
        _, test = split_indices(len(kept), cfg.test_fraction, cfg.seed)
        out[probe_key(task.name, BAYES_CEILING, stage)] = float(kept[test].double().mean())
    return out
