"""Per-example squared gradient norms by ``torch.func.vmap(grad)``: the BiLSTM's vmap route.

Ghost norms (``measure.ghost``) need every parameter in a Linear / Embedding / LayerNorm; the
BiLSTM's recurrent weights live in a fused ``nn.LSTM``, which ``vmap`` cannot batch either. So
``vmap(grad)`` runs over the LSTM unrolled in plain tensor ops (``flatlm.models.lstm_unrolled``:
the same parameters and packed-sequence semantics) and gives per-example gradients, in chunks of
``chunk`` examples (memory: chunk x parameters).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from flatlm.models.lstm import BiLSTMForMaskedLM
from flatlm.models.lstm_unrolled import lstm_word_logits_unrolled
from flatlm.models.masked_lm import unwrap


def supports(model: nn.Module) -> bool:
    """Whether the unrolled routes (this one and ``measure.lstm_ghost``) cover the model."""
    return isinstance(unwrap(model), BiLSTMForMaskedLM)


def per_example_sq_norms(
    model: nn.Module, params: dict[str, nn.Parameter], input_ids, attention_mask, positions,
    directions: torch.Tensor, *, chunk: int | None = None,
) -> torch.Tensor:
    """(k, B) ||grad_theta <u_j, z(x_i)>||^2 over ``params`` for directions u (k, B, V).

    ``chunk`` examples at a time (default: as many as keep the per-example gradients near 2^27
    numbers, 0.5 GB in float32)."""
    model = unwrap(model)
    if not supports(model):
        raise TypeError(f"vmap route covers BiLSTMForMaskedLM, not {type(model)}")
    wrapper = _UnrolledLSTM(model)
    theta = {f"m.{name}": p.detach() for name, p in params.items()}

    def score(theta, ids, mask, pos, u):  # one example; batch dimension 1 inside
        z = functional_call(wrapper, theta, (ids[None], mask[None], pos[None]), strict=False)
        return (z[0] * u).sum()

    per_grad = vmap(grad(score), in_dims=(None, 0, 0, 0, 0))
    if chunk is None:
        chunk = max(1, 2**27 // sum(p.numel() for p in params.values()))
    out = directions.new_zeros(directions.shape[:2], dtype=torch.float64)
    for j in range(len(directions)):
        for s in range(0, len(positions), chunk):
            sl = slice(s, s + chunk)
            grads = per_grad(theta, input_ids[sl], attention_mask[sl], positions[sl],
                             directions[j, sl])
            out[j, sl] = sum(g.flatten(1).double().square().sum(1) for g in grads.values())
    return out


class _UnrolledLSTM(nn.Module):
    """(ids, mask, positions) -> unrolled word logits; holds the model as ``m`` so that
    ``functional_call`` can swap its parameters."""

    def __init__(self, model: BiLSTMForMaskedLM):
        super().__init__()
        self.m = model

    def forward(self, input_ids, attention_mask, positions):
        return lstm_word_logits_unrolled(self.m, input_ids, attention_mask, positions)
