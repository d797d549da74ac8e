"""The updates of a pack (``flatlm.train.pack``): each packable algorithm's step for K members at
once, the member axis leading every tensor.

An update here is its algorithm's update (``flatlm.train.algorithms``) applied to every member,
in the same order of operations and of dropout draws, so that member k's update is its unpacked
twin's: the gradient of each micro-batch's summed loss / n (n the member's masked words in the
whole batch), each micro-batch's losses added in order, then one optimizer step per member at
its own learning rate. Metrics are ``(K,)`` tensors, one value per member.

- ``packed_standard_step`` (adamw, sgd, noreg, label_noise): ``standard_step``.
- ``packed_sam_step`` (sam): ``sam_step`` with each member's own perturbation
  eps_k = rho_k g_k / ||g_k|| (the norm over the member's parameters alone).

The adversarial objective (a closed-form head fitted on each member's own D1 each update) and
grow (the shape changes mid-run) are not packed: they train unpacked (``Algorithm.packed_step``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flatlm.models.packed import PackedBert
from flatlm.train.config import TrainConfig
from flatlm.train.data import MLMBatch, StepInputs
from flatlm.train.packed_optim import PackedOptimizer


@dataclass(frozen=True)
class PackedBatch:
    """K members' masked batches stacked: every field of ``MLMBatch`` with a leading K axis."""

    input_ids: torch.Tensor  # (K, n, T+2)
    attention_mask: torch.Tensor  # (K, n, T+2)
    positions: torch.Tensor  # (K, n) int64, or (K, n, T) bool at a masking rate
    targets: torch.Tensor  # (K, n) or (K, n, T)

    @classmethod
    def stack(cls, batches: Sequence[MLMBatch]) -> PackedBatch:
        widths = {b.input_ids.shape[1] for b in batches}
        if len(widths) > 1:
            raise ValueError(f"pack: the members' batches have different widths {widths}; a "
                             "pack trains members whose sentences share one padded length")
        return cls(*(torch.stack([getattr(b, f) for b in batches])
                     for f in ("input_ids", "attention_mask", "positions", "targets")))

    def split(self, size: int) -> list[PackedBatch]:
        """Consecutive sub-batches of ``size`` sentences of every member (``MLMBatch.split``)."""
        parts = [t.split(size, dim=1) for t in (self.input_ids, self.attention_mask,
                                                 self.positions, self.targets)]
        return [PackedBatch(*p) for p in zip(*parts, strict=True)]

    def __len__(self) -> int:
        return self.input_ids.shape[1]

    def n_targets(self) -> torch.Tensor | int:
        """Each member's masked words ((K,) at a rate, else the sentence count)."""
        if self.positions.dtype != torch.bool:
            return len(self)
        return self.positions.flatten(1).sum(1).clamp(min=1)


def stack_inputs(inputs: Sequence[StepInputs]) -> PackedBatch:
    """The members' update inputs as one ``PackedBatch`` (probe batches are not packed)."""
    return PackedBatch.stack([x.mlm for x in inputs])


@dataclass
class PackContext:
    """What a packed update works on: the pack's model, optimizer and per-member settings."""

    cfgs: list[TrainConfig]  # resolved, one per member in the pack's current order
    model: PackedBert
    optimizer: PackedOptimizer
    generators: list[torch.Generator]  # each member's dropout stream
    autocast: Callable[[], AbstractContextManager]

    @property
    def dropout(self) -> list[float]:
        return [c.dropout for c in self.cfgs]

    def keep(self, members: Sequence[int]) -> None:
        """Keeps only ``members`` (indices into the current order)."""
        self.model.keep(members)
        self.optimizer.keep(members, list(self.model.params))
        self.cfgs = [self.cfgs[k] for k in members]
        self.generators = [self.generators[k] for k in members]


def member_loss_sums(ctx: PackContext, micro: PackedBatch) -> torch.Tensor:
    """(K,) summed cross-entropy of each member's masked words (``mlm_loss_sum`` per member)."""
    with ctx.autocast():
        logits = ctx.model.word_logits(micro.input_ids, micro.attention_mask, micro.positions,
                                       dropout=ctx.dropout, generators=ctx.generators)
    if micro.positions.dtype == torch.bool:
        targets = [t[p] for t, p in zip(micro.targets, micro.positions, strict=True)]
    else:
        targets = list(micro.targets)
    # one call per member: the reduction's order is then the single model's
    return torch.stack([
        F.cross_entropy(x.to(torch.promote_types(x.dtype, torch.float32)), t, reduction="sum")
        for x, t in zip(logits, targets, strict=True)])


def accumulate_packed(ctx: PackContext, batch: PackedBatch) -> torch.Tensor:
    """Adds each member's gradient of its batch's mean MLM loss to ``.grad``; returns the (K,)
    losses, detached (``accumulate_mlm`` per member)."""
    n = batch.n_targets()
    size = ctx.cfgs[0].micro_batch_size or len(batch)
    total = torch.zeros(ctx.model.k, device=batch.input_ids.device)
    for micro in batch.split(size):
        loss = member_loss_sums(ctx, micro) / n  # (K,)
        loss.sum().backward()  # members share no parameter: each gets its own gradient
        total += loss.detach()
    return total


def packed_standard_step(ctx: PackContext, batch: PackedBatch,
                         lrs: Sequence[float]) -> dict[str, torch.Tensor]:
    """``standard_step`` for every member: one update on its batch's mean MLM loss."""
    ctx.optimizer.zero_grad()
    loss = accumulate_packed(ctx, batch)
    ctx.optimizer.step(lrs)
    return {"train/loss": loss}


def packed_sam_step(ctx: PackContext, batch: PackedBatch,
                    lrs: Sequence[float]) -> dict[str, torch.Tensor]:
    """``sam_step`` for every member: eps_k = rho_k g_k / ||g_k||_2 from the first half, the
    update from the gradient of the second half at theta_k + eps_k."""
    first, second = batch.split(len(batch) // 2)
    params = list(ctx.model.params)
    ctx.optimizer.zero_grad()
    loss = accumulate_packed(ctx, first)
    with torch.no_grad():
        scale = torch.stack([  # each member's norm as sam_step takes it: over its own tensors
            c.sam.rho / (torch.nn.utils.get_total_norm([p.grad[k] for p in params]) + 1e-12)
            for k, c in enumerate(ctx.cfgs)])  # (K,)
        theta = [p.detach().clone() for p in params]
        for p in params:
            p.add_(p.grad * scale.view(-1, *[1] * (p.dim() - 1)))  # theta + eps
    ctx.optimizer.zero_grad()
    loss_perturbed = accumulate_packed(ctx, second)
    with torch.no_grad():
        for p, saved in zip(params, theta, strict=True):
            p.copy_(saved)
    ctx.optimizer.step(lrs)
    return {"train/loss": loss, "train/sam_loss_perturbed": loss_perturbed}
