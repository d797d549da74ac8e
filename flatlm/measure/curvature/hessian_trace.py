r"""Tr(H), the trace of the Hessian of the masked-LM loss with soft labels q, by Hutchinson.

.. math::
    L_q(\theta) = E_{x_{-t}} \sum_c q(c | x_{-t}) (-\log p_\theta(c | x_{-t})), \qquad
    H = \nabla^2 L_q = F + E_{x_{-t}} \sum_k (p_k - q_k) \nabla^2 z_k

(z the word logits, F the Fisher of ``measure.fisher``). With q the source's true conditional,
L_q is the population pre-training loss and H its Hessian (``flat/trace_hessian``). With q the
one-hot data label, H is the Hessian the paper's released code and PyHessian measure
(``flat/trace_hessian_data``): it differs from Tr(F) by the residual term, which has no sign.
With q = p_theta (labels drawn from the model) the residual vanishes and H = F (Lemma 3.2).

Hutchinson: for a Rademacher v in parameter space, E[v^T H v] = Tr(H). Each batch of B inputs
gives v^T (sum_i H_i) v from a double backward; batches are i.i.d. units for the standard error.
The gap Tr(H) - Tr(F) is estimated directly, as Hutchinson on the residual sum_k r_k grad^2 z_k
with r = p - q held fixed: its noise scales with |p - q|, so it shrinks with the KL, unlike the
difference of two independent estimates.

Double backward needs eager attention (the SDPA kernels have no second derivative, also on
CUDA): a BERT (post- or pre-LN) is switched to ``attn_implementation="eager"`` for the
measurement and back. The
function differentiated is the architecture's ``second_order_logits`` (``flatlm.models.
architectures``): the BiLSTM runs unrolled in plain tensor ops (``models.lstm_unrolled``), since
the fused cuDNN LSTM has no second derivative either.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from flatlm.measure.curvature.common import (
    FlatnessConfig,
    eval_mode,
    grouped_mean_se,
    masked_inputs,
    model_device_dtype,
    selected_parameters,
)
from flatlm.measure.precision import computing_in
from flatlm.models.masked_lm import find_architecture, model_layout, unwrap, word_logits


@contextlib.contextmanager
def eager_attention(model: nn.Module):
    """BERT with ``attn_implementation="eager"`` inside the block (double backward and forward-
    mode AD through attention); the previous implementation is restored after. A model without
    a transformers attention implementation (the BiLSTM) passes through."""
    inner = unwrap(model)
    old = getattr(getattr(inner, "config", None), "_attn_implementation", None)
    if old is None or old == "eager":
        yield model
        return
    inner.set_attn_implementation("eager")
    try:
        yield model
    finally:
        inner.set_attn_implementation(old)


def rademacher_like(params: list[torch.Tensor], g: torch.Generator) -> list[torch.Tensor]:
    """A random +-1 tensor shaped like each parameter, drawn from ``g``: Hutchinson's probe
    vector (``measure.blocks`` draws the same ones, so its blocks add up to Tr(H))."""
    return [torch.randint(0, 2, p.shape, generator=g, device=p.device).to(p.dtype) * 2 - 1
            for p in params]


def second_order_logits(model: nn.Module):
    """The word-logit function with a second derivative: the architecture's
    ``second_order_logits`` (the unrolled LSTM for a BiLSTM), else ``word_logits``."""
    arch = find_architecture(model)
    hook = arch.second_order_logits if arch is not None else None
    return hook if hook is not None else word_logits


def hessian_vector(grads, v, params) -> tuple:
    """(d grads / d params) v by a second backward, per parameter (None where it is 0);
    ``grads`` built with ``create_graph=True``, kept for more products."""
    gv = sum((gr * vi).sum() for gr, vi in zip(grads, v, strict=True))
    return torch.autograd.grad(gv, params, retain_graph=True, allow_unused=True)


def quadratic(grads, v, params) -> torch.Tensor:
    """v^T (d grads / d params) v by a second backward."""
    hv = hessian_vector(grads, v, params)
    return sum((h * vi).sum() for h, vi in zip(hv, v, strict=True) if h is not None).double()


def stacked_quadratics(grads, vs: list[list[torch.Tensor]], params) -> torch.Tensor:
    """(k,) float64: v^T (d grads / d params) v for each of the k vectors ``vs``, from one
    batched second backward (autograd's ``is_grads_batched``: vmap over the vectors).

    Each H v is the vector-Jacobian product of ``grads`` with v (H is symmetric), so stacking the
    vectors as grad_outputs gives all k products at once; it sums in another order than k calls
    of ``quadratic`` (equal to rounding)."""
    stacked = [torch.stack(parts) for parts in zip(*vs, strict=True)]  # per param (k, *shape)
    hv = torch.autograd.grad(grads, params, grad_outputs=stacked, retain_graph=True,
                             allow_unused=True, is_grads_batched=True)
    return sum((h * v).flatten(1).sum(1) for h, v in zip(hv, stacked, strict=True)
               if h is not None).double()


def _probe_terms(grad_sets, params, g, n_probes: int, stack: int) -> list[list[torch.Tensor]]:
    """Per gradient set (the loss's, the residual's), the n_probes quadratic forms as 0-d float64
    tensors on the device (no host synchronisation), the vectors drawn from ``g`` in order and
    shared by the sets: one product at a time (``stack`` 1) or ``stack`` at a time."""
    terms = [[] for _ in grad_sets]
    for start in range(0, n_probes, stack):
        vs = [rademacher_like(params, g) for _ in range(min(stack, n_probes - start))]
        for out, grads in zip(terms, grad_sets, strict=True):
            out += ([quadratic(grads, vs[0], params)] if stack == 1
                    else list(stacked_quadratics(grads, vs, params)))
    return terms


def _in_order(values: list[torch.Tensor]) -> torch.Tensor:
    """Their sum, added left to right (as a Python float loop adds them), on the device."""
    total = values[0]
    for value in values[1:]:
        total = total + value
    return total


def hutchinson_batch(
    model: nn.Module, params: list[nn.Parameter], batch, q: torch.Tensor, n_probes: int,
    g: torch.Generator, *, with_gap: bool = False, stack: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(v^T H_b v, v^T R_b v) for one batch, averaged over ``n_probes`` vectors v, as 0-d float64
    tensors on the model's device (read them once, after the last batch: no synchronisation per
    batch); H_b and R_b are summed over the batch's inputs (R_b the residual, H_b - F_b; 0
    without ``with_gap``). ``stack``: vectors per batched product (``stacked_quadratics``); the
    gap's vectors are the same as H's, drawn once."""
    z = second_order_logits(model)(model, batch.input_ids, batch.attention_mask,
                                   batch.positions)  # (B, V)
    log_p = z.log_softmax(-1)
    loss = -(q.to(z.dtype) * log_p).sum()
    grad_sets = [torch.autograd.grad(loss, params, create_graph=True)]
    if with_gap:
        r = (log_p.exp() - q.to(z.dtype)).detach()  # (B, V) p - q, held fixed
        grad_sets.append(torch.autograd.grad((r * z).sum(), params, create_graph=True))
    sums = [_in_order(terms) / n_probes
            for terms in _probe_terms(grad_sets, params, g, n_probes, stack)]
    if not with_gap:
        sums.append(torch.zeros((), dtype=torch.float64, device=sums[0].device))
    return sums[0], sums[1]


def trace_hessian(
    model: nn.Module,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: FlatnessConfig,
    *,
    soft_labels: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    device: str | torch.device | None = None,
    with_gap: bool = False,
) -> dict:
    """Hutchinson estimate of Tr(H) of the loss with labels ``soft_labels`` over the first
    ``cfg.n_inputs`` sentences, one masked word each.

    ``soft_labels`` (n, V): the label distribution at each input's masked word (rows sum to 1),
    e.g. the source's ``conditionals`` at ``positions``; None: the one-hot data labels.
    ``positions`` (n,): the masked words; None draws them from ``cfg.seed`` exactly as
    ``trace_fisher`` does, so both measure the same inputs.
    Returns ``{"mean", "se", "n", "n_batches"}``, and ``"gap_mean", "gap_se"`` (an estimate of
    Tr(H) - Tr(F), see the module docstring) with ``with_gap``.
    """
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs, positions=positions)
    if soft_labels is not None and soft_labels.shape[0] != len(x):
        raise ValueError(f"soft_labels has {soft_labels.shape[0]} rows for {len(x)} inputs")
    device = device or model_device_dtype(model)[0]
    params = list(selected_parameters(model, cfg.exclude).values())
    g = torch.Generator(device=device).manual_seed(cfg.seed + 2)
    h_vals, r_vals, counts = [], [], []
    with eval_mode(model), eager_attention(model), \
            computing_in(cfg.hessian_precision, device):
        for start in range(0, len(x), cfg.hutchinson_batch_size):
            batch = x.batch(start, start + cfg.hutchinson_batch_size, device)
            if soft_labels is None:
                q = nn.functional.one_hot(batch.targets, model_layout(model).n_words)
            else:
                q = soft_labels[start : start + cfg.hutchinson_batch_size].to(device)
            h, r = hutchinson_batch(model, params, batch, q, cfg.hutchinson_probes, g,
                                    with_gap=with_gap, stack=cfg.hutchinson_stack)
            h_vals.append(h)
            r_vals.append(r)
            counts.append(len(batch))
    # one transfer to the host for the whole pass, not one per batch
    h_vals, r_vals = (torch.stack(v).tolist() if v else [] for v in (h_vals, r_vals))
    mean, se = grouped_mean_se(h_vals, cfg.se_groups, counts=counts)
    out = {"mean": mean, "se": se, "n": len(x), "n_batches": len(counts)}
    if with_gap:
        out["gap_mean"], out["gap_se"] = grouped_mean_se(r_vals, cfg.se_groups, counts=counts)
    return out
