"""What differs between pre-training algorithms: the optimizer and one update. The loop is shared.

Each algorithm is one ``Algorithm`` in ``flatlm.train.registry`` (its defaults: optimizer, weight
decay, dropout, warmup; its update; its data-parallel update; ...); ``STEPS`` is the view mapping
it to its update:

- ``standard_step`` (adamw, sgd, noreg, grow, label_noise): gradient of the batch's mean MLM
  loss, one optimizer step (grow's growth: ``growth.py``; label_noise's targets: ``data.py``).
- ``sam_step`` (sam): the gradient of the first half of the batch gives the perturbation
  eps = rho g / ||g||; the gradient of the second half at theta + eps updates theta (A.5).
- ``adversarial_step`` (adversarial): the MLM loss minus lambda times the D2 loss of a linear
  head fitted in closed form on the features of D1 (A.5; ``ridge_head_loss``).

Every update accumulates gradients over micro-batches of ``cfg.micro_batch_size`` sentences,
weighted so that the result is the gradient of the mean over the batch's masked words; each
micro-batch is cut to its longest sentence when its lengths are known (``train.unpad``).
Step functions return their metrics as device tensors, so an update never waits on the device:

    train/loss                mean cross-entropy (nats) of the batch's masked words (sam: of the
                              first half, at theta)
    train/sam_loss_perturbed  sam: the second half's loss at theta + eps
    train/adv_d2_loss         adversarial: the closed-form head's squared loss on D2
    train/adv_d2_acc          adversarial: that head's accuracy on D2

The loop adds ``train/lr`` and averages each over its log window.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flatlm.models.bert import sentence_features, word_logits
from flatlm.train.config import ALGORITHMS, TrainConfig
from flatlm.train.data import MLMBatch, StepInputs
from flatlm.train.registry import Algorithm, RegistryView, algorithm_named, load_ref


def build_optimizer(cfg: TrainConfig, model: nn.Module, *, fused: bool = False):
    """The algorithm's optimizer over ``model``'s parameters (``cfg`` resolved): its own
    (``Algorithm.make_optimizer``: muon's), else AdamW or SGD as its defaults say.

    Weight decay applies to matrices and embeddings (dim >= 2), not to biases or LayerNorm
    weights, as in BERT and Izsak et al. (2021). The learning rate is set by the loop each update.
    ``fused`` selects the fused AdamW kernel (CUDA).
    """
    make = algorithm_named(cfg.algorithm).make_optimizer
    if make is not None:
        return load_ref(make)(cfg, model, fused=fused)
    groups = decay_groups(cfg, [p for p in model.parameters() if p.requires_grad])
    if ALGORITHMS[cfg.algorithm].optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=0.0)
    return adamw_optimizer(cfg, groups, fused=fused)


def decay_groups(cfg: TrainConfig, params: list[nn.Parameter]) -> list[dict]:
    """``params`` in two groups: matrices and embeddings (dim >= 2) decayed by
    ``cfg.weight_decay``, then the rest (biases, LayerNorms) undecayed."""
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw_optimizer(cfg: TrainConfig, groups: list[dict], *, fused: bool = False):
    """torch's AdamW over ``groups`` with the run's rate, betas and epsilon."""
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             fused=fused or None)


@dataclass
class StepContext:
    """The runtime objects an update works on (built by the loop)."""

    cfg: TrainConfig  # resolved
    model: nn.Module
    optimizer: torch.optim.Optimizer
    autocast: Callable[[], AbstractContextManager]  # a fresh autocast context per forward
    mlm_loss: Callable[[nn.Module, MLMBatch], torch.Tensor]  # mlm_loss_sum, maybe compiled
    n_classes: int = 0  # adversarial: classes of the downstream task


def mlm_loss_sum(model: nn.Module, batch: MLMBatch) -> torch.Tensor:
    """Summed cross-entropy (nats) of the masked words; the head runs only at those words."""
    logits = word_logits(model, batch.input_ids, batch.attention_mask, batch.positions)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32
    return masked_word_loss(logits, batch)


def masked_word_loss(logits: torch.Tensor, batch: MLMBatch) -> torch.Tensor:
    """Summed cross-entropy (nats) of the masked words' ``logits`` (n or k, V) against their
    targets (``masked_targets``): -log q(x_t), or -sum_c p(c) log q(c) = H(p) + KL(p || q)
    against the true conditional p (``train.targets="truth"``), whose gradient in the logits,
    q - p, is 0 at the truth."""
    targets = masked_targets(batch)
    if targets.is_floating_point():
        targets = targets.to(logits.dtype)
    return F.cross_entropy(logits, targets, reduction="sum")


def masked_targets(batch: MLMBatch) -> torch.Tensor:
    """The masked words' targets, in the order of their logits: word ids (n,) or (k,), or under
    ``train.targets="truth"`` the true conditionals (n, V) or (k, V) (``batch.soft_targets``)."""
    targets = batch.targets if batch.soft_targets is None else batch.soft_targets
    return targets[batch.positions] if batch.positions.dtype == torch.bool else targets


def accumulate_mlm(ctx: StepContext, batch: MLMBatch) -> torch.Tensor:
    """Adds the gradient of ``batch``'s mean MLM loss to ``.grad``; returns that loss, detached."""
    n = batch.n_targets()
    if isinstance(n, torch.Tensor):
        n = n.clamp(min=1)
    size = ctx.cfg.micro_batch_size or len(batch)
    total = torch.zeros((), device=batch.input_ids.device)
    for micro in batch.split(size):
        total += _micro_backward(ctx, micro, n)
    return total


def _micro_backward(ctx: StepContext, micro: MLMBatch, n) -> torch.Tensor:
    """Adds the gradient of ``micro``'s summed loss / ``n``; returns that loss, detached. A
    compiled loss compiles its backward at the first ``backward()``: a compiler error there
    switches the loss to eager (``EagerFallback.backward_failed``) and the micro-batch is redone
    (no gradient was written: the failure comes before the compiled graph's backward runs)."""
    with ctx.autocast():  # trimmed: cut to its longest sentence if its lengths are known
        loss = ctx.mlm_loss(ctx.model, micro.trimmed()) / n
    try:
        loss.backward()
    except Exception as e:
        backward_failed = getattr(ctx.mlm_loss, "backward_failed", None)
        if backward_failed is None or not backward_failed(e):
            raise
        return _micro_backward(ctx, micro, n)
    return loss.detach()


def standard_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    """One update on the gradient of the batch's mean MLM loss."""
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    ctx.optimizer.step()
    return {"train/loss": loss}


def sam_step(ctx: StepContext, inputs: StepInputs, *,
             gradient: Callable[[StepContext, MLMBatch], torch.Tensor] = accumulate_mlm,
             ) -> dict[str, torch.Tensor]:
    """SAM (Foret et al., 2020) with the batch split in two halves, as in A.5.

    g = grad L_first(theta); eps = rho g / ||g||_2 (all parameters as one vector);
    the optimizer then steps from theta with grad L_second(theta + eps). ``gradient`` puts a
    half's gradient in ``.grad`` and returns its loss (data-parallel: reduced over the ranks).
    """
    first, second = inputs.mlm.split(len(inputs.mlm) // 2)
    params = [p for p in ctx.model.parameters() if p.requires_grad]
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = gradient(ctx, first)
    with torch.no_grad():
        grads = [p.grad for p in params if p.grad is not None]
        scale = ctx.cfg.sam.rho / (torch.nn.utils.get_total_norm(grads) + 1e-12)
        theta = [p.detach().clone() for p in params]
        for p in params:
            if p.grad is not None:
                p.add_(p.grad * scale)  # theta + eps
    ctx.optimizer.zero_grad(set_to_none=True)
    loss_perturbed = gradient(ctx, second)
    with torch.no_grad():
        for p, saved in zip(params, theta, strict=True):
            p.copy_(saved)  # back to theta exactly (theta + eps - eps would round)
    ctx.optimizer.step()
    return {"train/loss": loss, "train/sam_loss_perturbed": loss_perturbed}


def ridge_head_loss(H1: torch.Tensor, y1: torch.Tensor, H2: torch.Tensor, y2: torch.Tensor,
                    n_classes: int, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The closed-form linear head of A.5: (its mean squared loss on D2, its accuracy on D2).

    phi_hat = argmin_phi ||(H1 - mu) phi - (Y1 - ybar)||^2 + r ||phi||^2, with one-hot labels Y,
    means mu, ybar of D1 (an unpenalised bias) and r = ``ridge`` * mean ||H1_i - mu||^2. Solved in
    the dual, phi = A^T (A A^T + r I)^-1 (Y1 - ybar) with A = H1 - mu, when D1 has fewer rows than
    features, else in the primal; both are differentiable in H1 and H2 (Liu et al., 2020).
    Loss: mean over D2 of ||(H2 - mu) phi_hat + ybar - Y2||^2. Computed in float32 or wider.
    """
    with torch.autocast(H1.device.type, enabled=False):
        dtype = torch.promote_types(H1.dtype, torch.float32)
        H1, H2 = H1.to(dtype), H2.to(dtype)
        Y1 = H1.new_zeros(len(y1), n_classes).scatter_(1, y1[:, None], 1.0)
        Y2 = H1.new_zeros(len(y2), n_classes).scatter_(1, y2[:, None], 1.0)
        mu, ybar = H1.mean(0), Y1.mean(0)
        A, B = H1 - mu, H2 - mu  # (n1, F), (n2, F)
        n1, n_features = A.shape
        r = ridge * A.pow(2).sum(1).mean().detach()
        if n1 <= n_features:
            K = A @ A.T  # (n1, n1)
            eye = torch.eye(n1, device=K.device, dtype=dtype)
            alpha = torch.linalg.solve_ex(K + r * eye, Y1 - ybar)[0]
            pred = (B @ A.T) @ alpha + ybar  # (n2, C)
        else:
            G = A.T @ A  # (F, F)
            eye = torch.eye(n_features, device=G.device, dtype=dtype)
            phi = torch.linalg.solve_ex(G + r * eye, A.T @ (Y1 - ybar))[0]
            pred = B @ phi + ybar
        loss = (pred - Y2).pow(2).sum(1).mean()
        acc = (pred.argmax(1) == y2).float().mean()
    return loss, acc.detach()


def adversarial_step(ctx: StepContext, inputs: StepInputs) -> dict[str, torch.Tensor]:
    """One update on L_MLM - lambda * L_D2(phi_hat(psi), psi) (A.5); D1, D2 in ``inputs.probe``."""
    probe = inputs.probe
    ctx.optimizer.zero_grad(set_to_none=True)
    loss = accumulate_mlm(ctx, inputs.mlm)
    with ctx.autocast():
        H = sentence_features(ctx.model, probe.input_ids, probe.attention_mask)  # (n1+n2, F)
    y, n1 = probe.labels, probe.n1
    d2_loss, d2_acc = ridge_head_loss(H[:n1], y[:n1], H[n1:], y[n1:], ctx.n_classes,
                                      ctx.cfg.adversarial.ridge)
    (-ctx.cfg.adversarial.lambda_ * d2_loss).backward()
    ctx.optimizer.step()
    return {"train/loss": loss, "train/adv_d2_loss": d2_loss.detach(), "train/adv_d2_acc": d2_acc}


Step = Callable[[StepContext, StepInputs], dict]
# algorithm -> its update, a view of the registry (flatlm.train.registry), which names them
STEPS: Mapping[str, Step] = RegistryView(Algorithm.update)
