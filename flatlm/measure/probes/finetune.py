"""Fine-tuning on a downstream task (paper 2.1, A.5, following Devlin et al. 2018).

For each seed: a deep copy of the pre-trained model plus a fresh linear head on its [CLS] state
(``cls_features``; no pooler), the whole model trained with AdamW (lr 1e-4, 200 linear warmup
steps, 10 epochs, minibatches of 32) with its dropout on, then the test accuracy with dropout off.
The pre-trained model is never modified. Reported: mean and std (ddof=1; 0 for one seed) over
the seeds.

After warmup the rate decays linearly (Devlin et al.'s protocol; ``schedule="linear"``, the
default) or stays constant (``schedule="constant"``); ``flatlm.core.schedules.learning_rate`` gives
the table. Not stated in the paper, chosen here: weight decay 0.01 (BERT's), 2 seeds by default, a
trial's budget (A.5 reports 5 for the probe: ``measure.finetune.seeds=5``). Labels and the split are
those of ``measure.probe`` (``downstream_sentences``, ``split_indices`` with ``seed``), so a
fine-tuned model and its linear probe are tested on the same sentences. Seed s fixes the head, the
batch order and the dropout masks (the global RNG is forked, so the caller's is untouched).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn

from flatlm.core.schedules import SCHEDULES, learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.core.tokens import encode
from flatlm.measure import finetune_keys
from flatlm.measure.probes.probe import downstream_sentences, split_indices
from flatlm.models.masked_lm import cls_features, unwrap
from flatlm.sources.base import Source


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    """Fine-tuning; the model, the sentences and the device are arguments."""

    lr: float = 1e-4  # AdamW peak learning rate; paper 1e-4
    warmup_steps: int = 200  # updates of linear warmup from lr / warmup_steps; paper 200
    epochs: int = 10  # passes over the training split; paper 10
    batch_size: int = 32  # sentences per update; Devlin et al. use 32
    weight_decay: float = 0.01  # AdamW decoupled weight decay; not stated in the paper
    schedule: str = "linear"  # after warmup: "linear" decay (Devlin et al.) or "constant"
    seeds: int = 2  # fine-tuning runs (each its own head, batch order, dropout); paper 5
    seed: int = 0  # base seed: the split and the runs' seeds derive from it
    test_fraction: float = 0.2  # share of the labelled sentences held out; (0, 1)
    eval_batch_size: int = 256  # sentences per forward pass when testing

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"finetune.schedule={self.schedule!r}: use one of {SCHEDULES}")
        if min(self.epochs, self.batch_size, self.seeds, self.eval_batch_size) < 1:
            raise ValueError("finetune.epochs, batch_size, seeds and eval_batch_size must be >= 1")
        if self.warmup_steps < 0 or self.lr <= 0:
            raise ValueError("finetune.warmup_steps must be >= 0 and finetune.lr > 0")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"finetune.test_fraction={self.test_fraction}: use a value in (0, 1)")


@torch.no_grad()
def predict(model, head, ids, mask, batch_size: int) -> torch.Tensor:
    """Predicted classes [n] of the fine-tuned ``model`` + ``head`` (dropout off)."""
    model.eval()
    return torch.cat([head(cls_features(model, ids[i : i + batch_size],
                                        mask[i : i + batch_size])).argmax(-1)
                      for i in range(0, len(ids), batch_size)])


def finetuned_predictions(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    num_classes: int,
    cfg: FinetuneConfig,
    seed: int,
) -> torch.Tensor:
    """Test predictions [n_test] after one fine-tuning run from ``seed`` on (input_ids,
    attention_mask, classes) tensors already on the model's device; ``test`` is (input_ids,
    attention_mask). ``model`` is copied, never modified."""
    device = train[0].device
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        tuned = copy.deepcopy(unwrap(model)).to(device).train()  # uncompiled
        with torch.no_grad():
            d = cls_features(tuned.eval(), train[0][:1], train[1][:1]).shape[-1]
        tuned.train()
        head = nn.Linear(d, num_classes).to(device)
        opt = torch.optim.AdamW([*tuned.parameters(), *head.parameters()], lr=cfg.lr,
                                weight_decay=cfg.weight_decay)
        n = len(train[2])
        total = cfg.epochs * math.ceil(n / cfg.batch_size)
        g = torch.Generator().manual_seed(seed)
        step = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=g).to(device)
            for i in range(0, n, cfg.batch_size):
                idx = order[i : i + cfg.batch_size]  # (B,)
                for group in opt.param_groups:
                    group["lr"] = learning_rate(step, peak=cfg.lr, warmup_steps=cfg.warmup_steps,
                                              total_steps=total, schedule=cfg.schedule)
                logits = head(cls_features(tuned, train[0][idx], train[1][idx]))  # (B, C)
                loss = nn.functional.cross_entropy(logits, train[2][idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                step += 1
        return predict(tuned, head, *test, cfg.eval_batch_size)


def finetuned_accuracy(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    num_classes: int,
    cfg: FinetuneConfig,
    seed: int,
) -> float:
    """Test accuracy after one fine-tuning run from ``seed`` (``finetuned_predictions``)."""
    pred = finetuned_predictions(model, train, test[:2], num_classes, cfg, seed)
    return float((pred == test[2]).double().mean())


def finetune_accuracy(
    model: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    classes: torch.Tensor,
    task: str,
    cfg: FinetuneConfig,
    device: str | torch.device | None = None,
) -> dict[str, float]:
    """``finetune/<task>/acc_mean`` and ``finetune/<task>/acc_std`` over ``cfg.seeds`` runs on the
    downstream sentences with their class ids (``sample_downstream``). Runs on ``device``
    (default: the model's); run s is seeded derive_seed(cfg.seed, "finetune", s)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    tokens, lengths, classes, num_classes = downstream_sentences(source, tokens, lengths,
                                                                 classes, task)
    ids, mask = encode(tokens.to(device), lengths.to(device))  # (k, T+2)
    y = classes.to(device)
    train_idx, test_idx = split_indices(len(y), cfg.test_fraction, cfg.seed)
    train_idx, test_idx = train_idx.to(device), test_idx.to(device)
    train = (ids[train_idx], mask[train_idx], y[train_idx])
    test = (ids[test_idx], mask[test_idx], y[test_idx])
    accs = torch.tensor([
        finetuned_accuracy(model, train, test, num_classes, cfg,
                           derive_seed(cfg.seed, "finetune", s))
        for s in range(cfg.seeds)
    ], dtype=torch.float64)
    mean_key, std_key = finetune_keys(task)
    return {mean_key: float(accs.mean()), std_key: float(accs.std()) if len(accs) > 1 else 0.0}
