"""Per-example squared gradient norms of the BiLSTM from one batched backward ("ghost norms").

The LSTM is unrolled as in ``flatlm.models.lstm_unrolled`` (the same parameters and packed-sequence
semantics), keeping every step's gate pre-activations gates_t = W_ih x_t + b_ih + W_hh h_{t-1} +
b_hh (B, 4h). One backward of sum_i <u_i, z_i> gives, per example, delta_t = d s_i / d gates_t
(examples do not interact), and then

- W_ih: ||sum_t delta_t x_t^T||^2, W_hh: ||sum_t delta_t h_{t-1}^T||^2 (``ghost``'s Gram or
  outer-product form); b_ih and b_hh: ||sum_t delta_t||^2 each;
- the head at the one masked position: ``proj`` and ``norm`` from their output gradients, and
  the embedding matrix, which the decoder reads too (tied), from its per-example gradient
  (B, V+4, h): the embedded words' gradients scattered by id plus the decoder's u z^T; the
  decoder bias ||u||^2.

Padding needs no special case: no gradient reaches a padded position (the forward direction's
padding is never read by a real word, the backward direction restarts from zero at [SEP]), and
the [PAD] row of the embedding gets none (``padding_idx``).
"""

from __future__ import annotations

import torch
from torch import nn

from flatlm.core.tokens import WORD_OFFSET
from flatlm.measure.curvature.ghost import linear_weight_sq
from flatlm.measure.curvature.per_example import supports
from flatlm.models.lstm import BiLSTMForMaskedLM
from flatlm.models.lstm_unrolled import lstm_layers_unrolled
from flatlm.models.masked_lm import unwrap


class _Forward:
    """The unrolled forward at one word per sentence, with what the norms need kept."""

    def __init__(self, model: BiLSTMForMaskedLM, input_ids, attention_mask, positions):
        self.ids = input_ids
        self.embedded = model.embed(input_ids)  # (B, T+2, h)
        self.saved: list = []  # per layer and direction, in parameter-name order
        x = lstm_layers_unrolled(model.lstm, self.embedded, attention_mask.bool(), self.saved)
        rows = torch.arange(len(positions), device=x.device)
        self.hidden = x[rows, positions + 1]  # (B, 2h)
        self.projected = model.proj(self.hidden)  # (B, h)
        self.activated = nn.functional.gelu(self.projected)
        self.z = model.norm(self.activated)  # (B, h)
        self.logits = nn.functional.linear(self.z, model.embed.weight, model.bias)  # (B, V+4)

    def targets(self) -> list[torch.Tensor]:
        return [self.embedded, self.projected, self.z,
                *(g for _, _, gates in self.saved for g in gates)]


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Per-example squared norm (B,) of a (B, ...) tensor, in float64."""
    return t.double().square().flatten(1).sum(1)


def _lstm_norms(fwd: _Forward, grads: list) -> dict[str, torch.Tensor]:
    """Per-example squared norms (B,) of the LSTM's parameters by name."""
    out = {}
    T = fwd.embedded.shape[1]
    for j, (x, prev, _) in enumerate(fwd.saved):
        layer, sfx = divmod(j, 2)
        name = f"lstm.{{}}_l{layer}{'_reverse' if sfx else ''}"
        delta = torch.stack(grads[j * T:(j + 1) * T], 1)  # (B, T, 4h)
        bias_sq = _sq(delta.sum(1))
        out.update({name.format("weight_ih"): linear_weight_sq(x, delta).double(),
                    name.format("weight_hh"): linear_weight_sq(prev, delta).double(),
                    name.format("bias_ih"): bias_sq, name.format("bias_hh"): bias_sq})
    return out


def _head_norms(model, fwd: _Forward, g_embedded, g_projected, g_z, u_ids):
    """Per-example squared norms (B,) of the head and the tied embedding matrix."""
    xhat = nn.functional.layer_norm(fwd.activated, model.norm.normalized_shape,
                                    eps=model.norm.eps).detach()  # (B, h)
    emb = model.embed
    g_e = g_embedded * (fwd.ids != emb.padding_idx)[..., None]  # (B, T+2, h)
    per_example = g_e.new_zeros(len(g_e), emb.num_embeddings, g_e.shape[-1])
    per_example.scatter_add_(1, fwd.ids[..., None].expand_as(g_e), g_e)
    per_example += u_ids[:, :, None] * fwd.z.detach()[:, None, :]  # the decoder's u z^T
    return {"embed.weight": _sq(per_example), "bias": _sq(u_ids),
            "proj.weight": _sq(g_projected) * _sq(fwd.hidden.detach()),
            "proj.bias": _sq(g_projected), "norm.weight": _sq(g_z * xhat), "norm.bias": _sq(g_z)}


def per_example_sq_norms(model: nn.Module, params: dict[str, nn.Parameter], input_ids,
                         attention_mask, positions, directions: torch.Tensor) -> torch.Tensor:
    """(k, B) ||grad_theta <u_j, z(x_i)>||^2 over ``params`` for word-logit directions u
    (k, B, V), from one forward and k batched backward passes."""
    model = unwrap(model)
    if not supports(model):
        raise TypeError(f"LSTM ghost norms cover BiLSTMForMaskedLM, not {type(model)}")
    by_id = {id(p): name for name, p in model.named_parameters()}
    wanted = [by_id[id(p)] for p in params.values()]
    with torch.enable_grad():
        fwd = _Forward(model, input_ids, attention_mask, positions)
        targets = fwd.targets()
        out = directions.new_zeros(directions.shape[:2], dtype=torch.float64)
        for j, u in enumerate(directions):
            u_ids = torch.nn.functional.pad(u.to(fwd.logits.dtype), (WORD_OFFSET, 0))  # (B, V+4)
            grads = torch.autograd.grad(fwd.logits, targets, u_ids, retain_graph=True)
            norms = {**_lstm_norms(fwd, grads[3:]),
                     **_head_norms(model, fwd, *grads[:3], u_ids)}
            out[j] = sum(norms[name] for name in wanted)
    return out
