"""Every linear probe of a checkpoint as one batched problem: the tasks x seeds x feature sets
(trained model, random-init model, lookup table) of ``measure.probe``, on features computed once.

A head is (feature set f, seed s, task k). ``probe.train_heads`` draws head s's initialisation
and then its minibatch orders from one generator seeded s, so what a head sees depends on the
seed, the number N of training sentences, the feature width D and the class count C: tasks that
keep the same sentences and have the same C see the same minibatches, and so do feature sets of
the same width. Those heads are one group and one problem (``train_heads_batched``):

    x (F, N, D) the standardised training features, y (K, N) the K tasks' classes,
    W (F, S, K, C, D) and b (F, S, K, C) every head side by side (a class's weights a row: the
    GEMMs run 2-4x faster than with W (D, C) at C = 9 on a CPU); per update
    gather x[:, idx_s] (F S, B, D) -> logits (F S, B, K, C) -> softmax over each task's C ->
    grad W = (p - onehot)^T x / B, clip per head (f, s, k), one fused AdamW step for all.

The gradient is written out as autograd gives it (exp(log_softmax) minus the one-hot, over the
batch size) and AdamW is torch's fused kernel: per head the arithmetic of ``train_heads`` in
another rounding order (tests/measure/test_probe_batched.py holds them within 1e-4; accuracies
agree to at most one test sentence in a thousand, where a near tie flips). On 1 CPU thread this
is 2-3x faster than ``train_heads`` task by task: one gather and one GEMM per update for the
group, and AdamW in one pass instead of eight (bench/checkpoint_cost.py).

Early stopping (``ProbeConfig.patience``; off by default, and the paper's fixed epochs are what
the ``paper`` and ``paper-code`` protocols run): ``ProbeConfig.val_fraction`` of the training
split is held out (seeded), each head is scored on it after every epoch and keeps its weights of
the best epoch; a head whose accuracy has not improved for ``patience`` epochs is done, and the
problem stops when every head is (each head's result is the one it would get trained alone).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from flatlm.core.schedules import learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.measure import EARLY_STOPPING_EPOCHS
from flatlm.measure.probe import (
    ProbeConfig,
    head_seeds,
    initial_heads,
    prepared_features,
    probe_statistics,
    split_indices,
)

BETAS = (0.9, 0.999)  # torch.optim.AdamW's defaults, which train_heads uses
EPS = 1e-8


@dataclass(frozen=True)
class Task:
    """One downstream task's labels over the downstream sentences."""

    name: str
    keep: torch.Tensor  # (n,) bool: the sentences labelled for this task
    classes: torch.Tensor  # (k,) int64 class ids of the kept sentences, k = keep.sum()
    num_classes: int


@torch.no_grad()
def probe_feature_sets(features: dict[str, torch.Tensor], tasks: Sequence[Task],
                       cfg: ProbeConfig, *, progress: bool = False) -> dict[str, dict]:
    """feature set -> task -> the ``linear_probe_accuracy`` result of its heads, for every
    feature set [n, D] (all on one device) and task, trained as few batched problems as the
    heads' minibatches allow (module docstring)."""
    out = {name: {} for name in features}
    device = next(iter(features.values())).device
    for keep, tasks_kept in tasks_by_sentences(tasks):
        keep = keep.to(device)
        train, test = split_indices(int(keep.sum()), cfg.test_fraction, cfg.seed)
        prepared = {name: prepared_features(_float(x[keep]), train.to(device), cfg)
                    for name, x in features.items()}  # once for all tasks on these sentences
        for group in _by_classes(tasks_kept):
            y = torch.stack([task.classes for task in group]).to(device)  # (K, n)
            for names in _same_width(prepared):
                x = _stacked([prepared[name] for name in names])  # (F, n, D)
                results = _probe_group(x, y, group[0].num_classes, train, test, cfg, progress)
                for f, name in enumerate(names):
                    out[name].update({task.name: results[f][k] for k, task in enumerate(group)})
    return out


def _stacked(xs: list[torch.Tensor]) -> torch.Tensor:
    """(F, n, D); one feature set as a view, not a copy (the paper's sizes are gigabytes)."""
    return xs[0][None] if len(xs) == 1 else torch.stack(xs)


def _float(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_floating_point() else x.float()


def tasks_by_sentences(tasks: Sequence[Task]) -> list[tuple[torch.Tensor, list[Task]]]:
    """(kept sentences, the tasks that keep them): one split and standardisation each."""
    groups: dict[bytes, list[Task]] = {}
    for task in tasks:
        groups.setdefault(task.keep.cpu().numpy().tobytes(), []).append(task)
    return [(group[0].keep, group) for group in groups.values()]


def _by_classes(tasks: Sequence[Task]) -> list[list[Task]]:
    """Tasks of one sentence set grouped by class count: a group's heads share minibatches."""
    groups: dict[int, list[Task]] = {}
    for task in tasks:
        groups.setdefault(task.num_classes, []).append(task)
    return list(groups.values())


def _same_width(prepared: dict[str, torch.Tensor]) -> list[list[str]]:
    widths: dict[int, list[str]] = {}
    for name, x in prepared.items():
        widths.setdefault(x.shape[1], []).append(name)
    return list(widths.values())


def _probe_group(x, y, num_classes: int, train, test, cfg: ProbeConfig, progress: bool):
    """[f][k] -> result of feature set f and task k; x (F, n, D), y (K, n)."""
    train, test = train.to(x.device), test.to(x.device)
    fit, val = _early_stopping_split(train, cfg)
    W, b, epochs = train_heads_batched(x[:, fit], y[:, fit], num_classes, head_seeds(cfg), cfg,
                                       val=(x[:, val], y[:, val]) if val is not None else None,
                                       progress=progress)
    right = {split: _correct(x[:, rows], W, b, y[:, rows]) for split, rows in
             (("train", fit), ("test", test))}  # (F, S, K, n)
    out = []
    for f in range(x.shape[0]):
        out.append([probe_statistics(right["train"][f, :, k], right["test"][f, :, k],
                                     y[k, fit], y[k, test], num_classes)
                    for k in range(y.shape[0])])
        if epochs is not None:
            for k, result in enumerate(out[-1]):
                result[EARLY_STOPPING_EPOCHS] = float(epochs[f, :, k].double().mean())
    return out


def _early_stopping_split(train: torch.Tensor, cfg: ProbeConfig):
    """(rows the heads train on, held-out rows that pick the epoch or None)."""
    if cfg.patience is None:
        return train, None
    n_val = min(max(1, round(len(train) * cfg.val_fraction)), len(train) - 1)
    g = torch.Generator().manual_seed(derive_seed(cfg.seed, "early-stopping"))
    order = torch.randperm(len(train), generator=g).to(train.device)
    return train[order[n_val:]], train[order[:n_val]]


def _correct(x, W, b, y) -> torch.Tensor:
    """(F, S, K, n) bool: head (f, s, k) predicts y[k] on x[f]; x (F, n, D), y (K, n)."""
    F, S, K, C, D = W.shape
    logits = torch.einsum("fnd,fscd->fsnc", x, W.reshape(F, S, K * C, D)) + b.view(F, S, 1, K * C)
    pred = logits.view(F, S, -1, K, C).argmax(-1)  # (F, S, n, K)
    return (pred == y.T).permute(0, 1, 3, 2)


class _Heads:
    """Every head's W, b and their gradients in one flat buffer each: one fused AdamW step."""

    def __init__(self, F: int, S: int, D: int, K: int, C: int, seeds, cfg: ProbeConfig,
                 device, dtype):
        self.shape = (F, S, K, C, D)
        n_w = F * S * K * C * D
        flat = torch.empty(n_w + F * S * K * C, device=device, dtype=dtype)
        self.param = torch.nn.Parameter(flat)
        self.param.grad = torch.zeros_like(flat)
        self.W, self.b = flat[:n_w].view(F, S, K, C, D), flat[n_w:].view(F, S, K, C)
        self.gW = self.param.grad[:n_w].view(F * S, K * C, D)
        self.gb = self.param.grad[n_w:].view(F * S, K * C)
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        W0, b0 = initial_heads(D, C, gens, device, dtype)  # (S, D, C), (S, C): train_heads' draw
        with torch.no_grad():
            self.W.copy_(W0.transpose(1, 2)[None, :, None])
            self.b.copy_(b0[None, :, None])
        self.gens = gens
        self._minus_cache: dict[int, torch.Tensor] = {}
        self.opt = torch.optim.AdamW([self.param], lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     betas=BETAS, eps=EPS, fused=True)

    def step(self, x, y, idx, lr: float, grad_clip: float | None) -> None:
        """One AdamW update of every head on its minibatch: x (F, N, D), y (K, N), idx (S, B)."""
        F, S, K, C, D = self.shape
        B = idx.shape[1]
        xb = x.index_select(1, idx.flatten()).view(F * S, B, D)
        logits = torch.baddbmm(self.b.view(F * S, 1, K * C), xb,
                               self.W.view(F * S, K * C, D).transpose(1, 2))  # (F S, B, K C)
        g = logits.view(F, S, B, K, C).log_softmax(-1).exp_().mul_(1.0 / B)  # d(mean CE)/dz
        target = y.index_select(1, idx.flatten()).view(K, S, B).permute(1, 2, 0)  # (S, B, K)
        g.scatter_add_(-1, target[None, ..., None].expand(F, S, B, K, 1),
                       self._minus(B, g).expand(F, S, B, K, 1))  # minus the one-hot / B
        g = g.view(F * S, B, K * C)
        torch.bmm(g.transpose(1, 2), xb, out=self.gW)  # (F S, K C, D)
        torch.sum(g, 1, out=self.gb)
        if grad_clip is not None:
            self._clip(grad_clip)
        self.opt.param_groups[0]["lr"] = lr
        self.opt.step()

    def _minus(self, B: int, like: torch.Tensor) -> torch.Tensor:
        """-1 / B as a one-element tensor, made once per batch size."""
        if B not in self._minus_cache:
            self._minus_cache[B] = torch.full((1,), -1.0 / B, device=like.device,
                                              dtype=like.dtype)
        return self._minus_cache[B]

    def _clip(self, max_norm: float) -> None:
        """Each head (f, s, k)'s gradient scaled to norm at most ``max_norm``, as
        ``probe._clip_per_head`` scales a head trained alone."""
        F, S, K, C, D = self.shape
        gW, gb = self.gW.view(F * S, K, C * D), self.gb.view(F * S, K, C)
        sq = torch.linalg.vector_norm(gW, dim=-1).square() + gb.square().sum(-1)  # (F S, K)
        norm = sq.sqrt()
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        gW.mul_(scale[:, :, None])
        gb.mul_(scale[:, :, None])


@torch.no_grad()
def train_heads_batched(
    x: torch.Tensor, y: torch.Tensor, num_classes: int, seeds: list[int], cfg: ProbeConfig, *,
    val: tuple[torch.Tensor, torch.Tensor] | None = None, progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Heads of every feature set x (F, N, D), seed and task y (K, N), each the head
    ``probe.train_heads(x[f], y[k], num_classes, [seed], cfg)`` trains, up to rounding:
    W (F, S, K, C, D) (head (f, s, k)'s W transposed), b (F, S, K, C) and, with ``val``
    (held-out x (F, M, D), y (K, M); early stopping), the epoch (F, S, K) each head's weights
    come from, else None."""
    F, N, D = x.shape
    K, C = y.shape[0], num_classes
    heads = _Heads(F, len(seeds), D, K, C, seeds, cfg, x.device, x.dtype)
    bs = N if cfg.batch_size is None else min(cfg.batch_size, N)
    per_epoch = math.ceil(N / bs)
    total = cfg.epochs * per_epoch
    stopper = _EarlyStopping(heads, val, cfg.patience) if val is not None else None

    with tqdm(total=total, desc="probe updates", unit="upd", leave=False,
              disable=not progress) as bar:
        for epoch in range(cfg.epochs):
            for j, idx in enumerate(_minibatches(heads.gens, N, bs, x.device)):
                lr = learning_rate(epoch * per_epoch + j, peak=cfg.lr,
                                   warmup_steps=cfg.warmup_steps, total_steps=total,
                                   schedule=cfg.schedule)
                heads.step(x, y, idx, lr, cfg.grad_clip)
            bar.update(per_epoch)
            if stopper is not None and stopper.done_after(epoch + 1):
                break
    if stopper is not None:
        return stopper.W, stopper.b, stopper.best_epoch
    return heads.W.detach().clone(), heads.b.detach().clone(), None


def _minibatches(gens, N: int, bs: int, device):
    """One epoch's minibatches, each (S, B) rows per head: head s's ``randperm(N)`` from its
    generator (as ``train_heads`` draws it), or all rows in order at full batch."""
    if bs == N:
        yield torch.arange(N, device=device).expand(len(gens), N)
        return
    perms = torch.stack([torch.randperm(N, generator=g) for g in gens]).to(device)
    for i in range(0, N, bs):
        yield perms[:, i : i + bs]


class _EarlyStopping:
    """Each head's best held-out accuracy, the weights and epoch it had then, and its patience."""

    def __init__(self, heads: _Heads, val, patience: int):
        self.heads, (self.x, self.y), self.patience = heads, val, patience
        F, S, K, C, D = heads.shape
        self.W, self.b = heads.W.clone(), heads.b.clone()
        self.best = torch.full((F, S, K), -1.0, device=self.W.device)
        self.best_epoch = torch.zeros((F, S, K), dtype=torch.int64, device=self.W.device)
        self.done = torch.zeros((F, S, K), dtype=torch.bool, device=self.W.device)

    def done_after(self, epoch: int) -> bool:
        """Scores every head after ``epoch`` epochs; True when none is left to improve."""
        acc = _correct(self.x, self.heads.W, self.heads.b, self.y).double().mean(-1)  # (F,S,K)
        better = (acc > self.best) & ~self.done
        self.best = torch.where(better, acc, self.best)
        self.best_epoch = torch.where(better, epoch, self.best_epoch)
        self.W.copy_(torch.where(better[..., None, None], self.heads.W, self.W))
        self.b.copy_(torch.where(better[..., None], self.heads.b, self.b))
        self.done |= epoch - self.best_epoch >= self.patience
        return bool(self.done.all())
