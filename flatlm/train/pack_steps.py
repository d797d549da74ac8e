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
- ``packed_adversarial_step`` (adversarial): ``adversarial_step``, each member's closed-form
  head fitted on its own D1 (its own pool and draws), one ``ridge_head_loss`` per member.

grow (the shape changes mid-run) is not packed: it trains unpacked (``Algorithm.packed_step``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flatlm.models.packed import PackedBert
from flatlm.train.algorithms import ridge_head_loss
from flatlm.train.config import TrainConfig
from flatlm.train.data import MLMBatch, ProbeBatch, StepInputs
from flatlm.train.packed_optim import PackedOptimizer


@dataclass(frozen=True)
class PackedProbe:
    """K members' D1 + D2 (``ProbeBatch``) stacked: the first ``n1`` of each member are D1."""

    input_ids: torch.Tensor  # (K, n1 + n2, T+2)
    attention_mask: torch.Tensor  # (K, n1 + n2, T+2)
    labels: torch.Tensor  # (K, n1 + n2)
    n1: int


@dataclass(frozen=True)
class PackedBatch:
    """K members' masked batches stacked: every field of ``MLMBatch`` with a leading K axis."""

    input_ids: torch.Tensor  # (K, n, T+2)
    attention_mask: torch.Tensor  # (K, n, T+2)
    positions: torch.Tensor  # (K, n) int64, or (K, n, T) bool at a masking rate
    targets: torch.Tensor  # (K, n) or (K, n, T)
    probe: PackedProbe | None = None  # adversarial: each member's D1 + D2

    @classmethod
    def stack(cls, batches: Sequence[MLMBatch]) -> PackedBatch:
        widths = {b.input_ids.shape[1] for b in batches}
        if len(widths) > 1:
            raise ValueError(f"pack: the members' batches have different widths {widths}; a "
                             "pack trains members whose sentences share one padded length")
        return cls(*(torch.stack([getattr(b, f) for b in batches])
                     for f in ("input_ids", "attention_mask", "positions", "targets")))

    def with_probe(self, probes: Sequence[ProbeBatch]) -> PackedBatch:
        shapes = {(p.input_ids.shape, p.n1) for p in probes}
        if len(shapes) > 1:
            raise ValueError(f"pack: the members' D1 + D2 differ in shape {shapes}; a pack's "
                             "members share train.adversarial.d1 and d2")
        probe = PackedProbe(*(torch.stack([getattr(p, f) for p in probes])
                              for f in ("input_ids", "attention_mask", "labels")), probes[0].n1)
        return dataclasses.replace(self, probe=probe)

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
    """The members' update inputs as one ``PackedBatch``."""
    batch = PackedBatch.stack([x.mlm for x in inputs])
    return batch.with_probe([x.probe for x in inputs]) if inputs[0].probe is not None else batch


@dataclass
class PackContext:
    """What a packed update works on: the pack's model, optimizer and per-member settings."""

    cfgs: list[TrainConfig]  # resolved, one per member in the pack's current order
    model: PackedBert
    optimizer: PackedOptimizer
    generators: list[torch.Generator]  # each member's dropout stream
    autocast: Callable[[], AbstractContextManager]
    n_classes: list[int] = dataclasses.field(default_factory=list)  # adversarial: classes of
    #   each member's downstream task

    @property
    def dropout(self) -> list[float]:
        return [c.dropout for c in self.cfgs]

    def keep(self, members: Sequence[int]) -> None:
        """Keeps only ``members`` (indices into the current order)."""
        self.model.keep(members)
        self.optimizer.keep(members, list(self.model.params))
        self.cfgs = [self.cfgs[k] for k in members]
        self.generators = [self.generators[k] for k in members]
        self.n_classes = [self.n_classes[k] for k in members] if self.n_classes else []


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
            c.sam.rho
            / (torch.nn.utils.get_total_norm([p.grad[k] for p in params]) + 1e-12)
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


def packed_adversarial_step(ctx: PackContext, batch: PackedBatch,
                            lrs: Sequence[float]) -> dict[str, torch.Tensor]:
    """``adversarial_step`` for every member: L_MLM - lambda_k L_D2(phi_hat_k), member k's head
    fitted in closed form on its own D1 (``batch.probe``)."""
    probe = batch.probe
    ctx.optimizer.zero_grad()
    loss = accumulate_packed(ctx, batch)
    with ctx.autocast():  # sentence_features per member: (K, n1 + n2, (T+2) d)
        h = ctx.model.encoder(probe.input_ids, probe.attention_mask, ctx.dropout,
                              ctx.generators)
        H = (h * probe.attention_mask[..., None].to(h.dtype)).flatten(2)
    n1, y = probe.n1, probe.labels
    heads = [ridge_head_loss(H[k, :n1], y[k, :n1], H[k, n1:], y[k, n1:], ctx.n_classes[k],
                             c.adversarial.ridge) for k, c in enumerate(ctx.cfgs)]
    sum(-c.adversarial.lambda_ * d2 for c, (d2, _) in zip(ctx.cfgs, heads, strict=True)
        ).backward()
    ctx.optimizer.step(lrs)
    return {"train/loss": loss,
            "train/adv_d2_loss": torch.stack([d2.detach() for d2, _ in heads]),
            "train/adv_d2_acc": torch.stack([acc for _, acc in heads])}
