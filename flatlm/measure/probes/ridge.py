"""The closed-form ridge probe: a cheap, seedless reference beside the paper's AdamW probe.

On the probe's own inputs (the split, projection and standardisation of ``measure.probe``), least
squares onto the one-hot classes with an L2 penalty, predicting the largest score:

    W = (X^T X + alpha n I)^{-1} X^T (Y - ybar),    class(x) = argmax(x W + ybar),

X the n standardised training features, Y their one-hot classes and ybar its column means.
alpha is the one of ``ALPHAS`` with the best accuracy on a held-out ``VAL_FRACTION`` of the
training split (seeded; fitted on the rest), then W is refitted on the whole training split. One
Cholesky factor per alpha (float64; the Gram matrix in the features' float32) serves every task
on the same sentences. Reported (keys ``<stage>_ridge/<task>/<stat>``, ``flatlm.measure``):
``acc_mean`` (one fit: no seeds), ``acc_se`` (binomial, over test sentences), ``train_acc`` and
``alpha``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from flatlm.core.seeds import derive_seed
from flatlm.measure import probe_key, ridge_stage
from flatlm.measure.probes.probe import ProbeConfig, prepared_features, split_indices
from flatlm.measure.probes.probe_batched import Task, tasks_by_sentences

log = logging.getLogger(__name__)

ALPHAS = tuple(10.0**k for k in range(-3, 3))  # the penalty's grid, times n_train
VAL_FRACTION = 0.1  # of the training split, held out to pick alpha


@torch.no_grad()
def ridge_feature_sets(features: dict[str, torch.Tensor], tasks: Sequence[Task],
                       cfg: ProbeConfig) -> dict[str, dict[str, dict]]:
    """feature set -> task -> ``acc_mean``, ``acc_se``, ``train_acc``, ``alpha`` of the ridge
    probe (module docstring) on every feature set [n, D] and task."""
    out = {name: {} for name in features}
    for keep, group in tasks_by_sentences(tasks):
        train, test = split_indices(int(keep.sum()), cfg.test_fraction, cfg.seed)
        for name, x in features.items():
            device = x.device
            x = prepared_features(x[keep.to(device)].float(), train.to(device), cfg)
            y = [task.classes.to(device) for task in group]
            results = _ridge_tasks(x, y, [task.num_classes for task in group],
                                   train.to(device), test.to(device), cfg.seed)
            out[name].update({task.name: r for task, r in zip(group, results, strict=True)})
    return out


def _ridge_tasks(x, ys, num_classes, train, test, seed: int) -> list[dict]:
    """The ridge statistics of every task (classes ``ys[k]`` [n]) on standardised ``x``; NaN
    (with a warning) where a feature is not finite: no least squares exists then."""
    if not bool(torch.isfinite(x).all()):
        log.warning("the ridge probe is not fitted: %d feature values are not finite",
                    int((~torch.isfinite(x)).sum()))
        return [{"acc_mean": math.nan, "acc_se": math.nan, "train_acc": math.nan,
                 "alpha": math.nan} for _ in ys]
    fit, val = _val_split(train, seed)
    gram_fit, gram_val = _gram(x[fit]), _gram(x[val])
    alphas = _best_alphas(gram_fit, x[fit], [y[fit] for y in ys], x[val],
                          [y[val] for y in ys], num_classes)
    out = []
    for y, C, alpha in zip(ys, num_classes, alphas, strict=True):
        rhs, ybar = _targets(x[train], [y[train]], [C])
        W = _cholesky_solve(gram_fit + gram_val, rhs, alpha * len(train)).to(x.dtype)
        right = {split: ((x[rows] @ W + ybar).argmax(1) == y[rows]).double().mean()
                 for split, rows in (("train", train), ("test", test))}
        acc = float(right["test"])
        out.append({"acc_mean": acc, "acc_se": math.sqrt(acc * (1 - acc) / len(test)),
                    "train_acc": float(right["train"]), "alpha": alpha})
    return out


def _val_split(train: torch.Tensor, seed: int):
    n_val = min(max(1, round(len(train) * VAL_FRACTION)), len(train) - 1)
    g = torch.Generator().manual_seed(derive_seed(seed, "ridge"))
    order = torch.randperm(len(train), generator=g).to(train.device)
    return train[order[n_val:]], train[order[:n_val]]


def _best_alphas(gram, x_fit, ys_fit, x_val, ys_val, num_classes) -> list[float]:
    """Per task, the alpha of ``ALPHAS`` whose fit on (x_fit, ys_fit[k]) (Gram matrix
    ``gram``) classifies x_val best (the smaller alpha on a tie); one factorisation per alpha
    for all tasks."""
    rhs, ybar = _targets(x_fit, ys_fit, num_classes)
    edges = [0, *torch.tensor(num_classes).cumsum(0).tolist()]
    acc = torch.zeros(len(ALPHAS), len(ys_fit), dtype=torch.float64)  # (alphas, K)
    for a, alpha in enumerate(ALPHAS):
        W = _cholesky_solve(gram, rhs, alpha * len(x_fit)).to(x_val.dtype)  # (D, sum C)
        scores = x_val @ W + ybar
        for k, y in enumerate(ys_val):
            pred = scores[:, edges[k] : edges[k + 1]].argmax(1)
            acc[a, k] = (pred == y).double().mean()
    return [ALPHAS[int(a)] for a in acc.argmax(0)]  # argmax: the first of the best


def _gram(x: torch.Tensor) -> torch.Tensor:
    return (x.T @ x).double()  # (D, D)


def _targets(x, ys, num_classes):
    """(X^T (Y - ybar) (D, sum C) in float64, ybar (sum C,)) of the tasks side by side."""
    Y = torch.cat([torch.nn.functional.one_hot(y, C).to(x.dtype)
                   for y, C in zip(ys, num_classes, strict=True)], 1)  # (n, sum C)
    ybar = Y.mean(0)
    return (x.T @ (Y - ybar)).double(), ybar


def _cholesky_solve(gram, rhs, penalty: float) -> torch.Tensor:
    """(gram + penalty I)^{-1} rhs by a Cholesky factor; where that fails (the Gram, summed in
    float32, slightly indefinite: features of very different scales, as an SGD run's can be), on
    the Gram's positive semi-definite part (eigenvalues clamped at 0), the matrix it rounds."""
    eye = torch.eye(len(gram), dtype=gram.dtype, device=gram.device)
    factor, info = torch.linalg.cholesky_ex(gram + penalty * eye)
    if int(info) == 0:
        return torch.cholesky_solve(rhs, factor)
    values, vectors = torch.linalg.eigh(gram)
    return vectors @ ((vectors.T @ rhs) / (values.clamp(min=0) + penalty)[:, None])


def ridge_metrics(stage: str, results: dict[str, dict]) -> dict[str, float]:
    """``<stage>_ridge/<task>/<stat>`` for every task's ridge result (keys in
    ``flatlm.measure``)."""
    return {probe_key(task, stat, ridge_stage(stage)): float(value)
            for task, result in results.items() for stat, value in result.items()}
