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

The released probe (``probe.RELEASED``) adds three things, each a ``ProbeConfig`` setting:
feature dropout (one (S, B, D) mask per update, the one ``train_heads`` draws, shared by the
feature sets and tasks of a group), the N(0, 0.02) head (``initial_heads``) and the encoder in
train mode while the heads train (``encoder_train_mode``): then the features differ every epoch,
so ``probe_feature_sets`` takes a ``draws`` function per feature set and the heads train on a
fresh train-mode forward pass over the training split every epoch (``epochs`` forward passes
instead of one, per set of kept sentences; seeded by the probe's seed and the epoch; one draw per
epoch shared by the seeds and tasks: each head sees every sentence once an epoch under a fresh
dropout draw, as a lone run would, but the heads' draws are not independent). Evaluation, the
ridge probe and the early-stopping scores read the eval-mode features.

Early stopping (``ProbeConfig.patience``; off by default, and the paper's fixed epochs are what
the ``paper`` and ``paper-code`` protocols run): ``ProbeConfig.val_fraction`` of the training
split is held out (seeded), each head is scored on it after every epoch and keeps its weights of
the best epoch; a head whose accuracy has not improved for ``patience`` epochs is done, and the
problem stops when every head is (each head's result is the one it would get trained alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from flatlm.core.schedules import learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.measure import EARLY_STOPPING_EPOCHS
from flatlm.measure.probes.probe import (
    ProbeConfig,
    dropout_multipliers,
    feature_dropout,
    feature_preparation,
    head_seeds,
    initial_heads,
    probe_statistics,
    split_indices,
)

# (rows of the downstream sentences, epoch) -> their features drawn with the encoder in train
# mode (``probe.train_mode_features``)
Draw = Callable[[torch.Tensor, int], torch.Tensor]

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
                       cfg: ProbeConfig, *, draws: dict[str, Draw] | None = None,
                       progress: bool = False) -> dict[str, dict]:
    """feature set -> task -> the ``linear_probe_accuracy`` result of its heads, for every
    feature set [n, D] (all on one device) and task, trained as few batched problems as the
    heads' minibatches allow (module docstring).

    ``draws``: feature set -> its features with the encoder in train mode
    (``ProbeConfig.encoder_train_mode``, ``probe.train_mode_features``): the heads of that set
    train on a fresh draw every epoch, prepared as ``features`` (its eval-mode features, which
    the heads are evaluated on) are. Each epoch costs one forward pass over the training split
    per set of sentences the tasks keep."""
    draws = draws or {}
    out = {name: {} for name in features}
    device = next(iter(features.values())).device
    for keep, tasks_kept in tasks_by_sentences(tasks):
        keep = keep.to(device)
        train, test = split_indices(int(keep.sum()), cfg.test_fraction, cfg.seed)
        prepare = {name: feature_preparation(_float(x[keep]), train.to(device), cfg)
                   for name, x in features.items()}  # once for all tasks on these sentences
        prepared = {name: prepare[name](_float(x[keep])) for name, x in features.items()}
        rows = keep.nonzero().squeeze(1)  # the kept sentences among all n
        for group in _by_classes(tasks_kept):
            y = torch.stack([task.classes for task in group]).to(device)  # (K, n)
            for names in _same_width(prepared):
                x = _stacked([prepared[name] for name in names])  # (F, n, D)
                redraw = _redraw(names, prepared, prepare, draws, rows)
                results = _probe_group(x, y, group[0].num_classes, train, test, cfg, progress,
                                       redraw)
                for f, name in enumerate(names):
                    out[name].update({task.name: results[f][k] for k, task in enumerate(group)})
    return out


def _redraw(names, prepared, prepare, draws: dict[str, Draw], rows: torch.Tensor):
    """``(epoch, fit) -> (F, N, D)``: the training features of epoch ``epoch`` at rows ``fit`` of
    the kept sentences, drawn afresh for the feature sets in ``draws``; None if none is."""
    if not any(name in draws for name in names):
        return None

    def features(epoch: int, fit: torch.Tensor) -> torch.Tensor:
        return _stacked([prepare[name](_float(draws[name](rows[fit], epoch)))
                         if name in draws else prepared[name][fit] for name in names])

    return features


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


def _probe_group(x, y, num_classes: int, train, test, cfg: ProbeConfig, progress: bool,
                 redraw=None):
    """[f][k] -> result of feature set f and task k; x (F, n, D), y (K, n); ``redraw`` as
    ``_redraw`` gives it."""
    train, test = train.to(x.device), test.to(x.device)
    fit, val = _early_stopping_split(train, cfg)
    W, b, epochs = train_heads_batched(
        x[:, fit], y[:, fit], num_classes, head_seeds(cfg), cfg,
        val=(x[:, val], y[:, val]) if val is not None else None, progress=progress,
        epoch_features=(lambda epoch: redraw(epoch, fit)) if redraw is not None else None)
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
        W0, b0 = initial_heads(D, C, gens, device, dtype,
                               cfg.head_init_std)  # (S, D, C), (S, C): train_heads' draw
        with torch.no_grad():
            self.W.copy_(W0.transpose(1, 2)[None, :, None])
            self.b.copy_(b0[None, :, None])
        self.gens = gens
        # feature dropout: train_heads' masks, one (S, B, D) per update, shared by the feature
        # sets and tasks (each head's are those it would draw trained alone)
        self.drop, self.p = feature_dropout(cfg, device), cfg.feature_dropout
        self._minus_cache: dict[int, torch.Tensor] = {}
        self.opt = torch.optim.AdamW([self.param], lr=cfg.lr, weight_decay=cfg.weight_decay,
                                     betas=BETAS, eps=EPS, fused=True)

    def step(self, x, y, idx, lr: float, grad_clip: float | None) -> None:
        """One AdamW update of every head on its minibatch: x (F, N, D), y (K, N), idx (S, B)."""
        F, S, K, C, D = self.shape
        B = idx.shape[1]
        xb = x.index_select(1, idx.flatten()).view(F * S, B, D)
        if self.drop is not None:  # xb is index_select's own copy: scaled in place
            xb.view(F, S, B, D).mul_(dropout_multipliers(self.drop, (S, B, D), self.p,
                                                         xb.device, xb.dtype))
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
    epoch_features: Callable[[int], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Heads of every feature set x (F, N, D), seed and task y (K, N), each the head
    ``probe.train_heads(x[f], y[k], num_classes, [seed], cfg)`` trains, up to rounding:
    W (F, S, K, C, D) (head (f, s, k)'s W transposed), b (F, S, K, C) and, with ``val``
    (held-out x (F, M, D), y (K, M); early stopping), the epoch (F, S, K) each head's weights
    come from, else None. ``epoch_features(epoch)`` (F, N, D), when given, replaces x for that
    epoch's updates (the encoder in train mode: a fresh dropout draw every epoch)."""
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
            if epoch_features is not None:
                x = epoch_features(epoch)
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
