"""Per-example squared gradient norms by ``torch.func.vmap(grad)``: the BiLSTM's route.

Ghost norms (``measure.ghost``) need every parameter in a Linear / Embedding / LayerNorm; the
BiLSTM's recurrent weights live in a fused ``nn.LSTM``, which ``vmap`` cannot batch either (its
kernel has no batching rule, and packed sequences are data-dependent). So the LSTM is unrolled
here in plain tensor ops, with the same parameters and the same packed-sequence semantics:

    gates_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh = (i, f, g, o)
    c_t = sigma(f) c_{t-1} + sigma(i) tanh(g),   h_t = sigma(o) tanh(c_t)

The backward direction zeroes its state on padding, so it starts from zero at each sentence's
[SEP] exactly as ``pack_padded_sequence`` does; the forward direction never reads padding before
a real word. ``vmap(grad)`` over this function gives per-example gradients, in chunks of
``chunk`` examples (memory: chunk x parameters).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from flatlm.core.tokens import WORD_OFFSET
from flatlm.models.bert import unwrap
from flatlm.models.lstm import BiLSTMForMaskedLM


def supports(model: nn.Module) -> bool:
    return isinstance(unwrap(model), BiLSTMForMaskedLM)


def _lstm_direction(x, real, w_ih, w_hh, b_ih, b_hh, reverse: bool,
                    saved: list | None = None) -> torch.Tensor:
    """One direction of one layer: x (B, T, in), real (B, T) bool -> (B, T, h). With ``saved``,
    appends (x, the previous states (B, T, h), the list of gate pre-activations (B, 4h) per
    step): what ``measure.lstm_ghost``'s norms read."""
    B, T, _ = x.shape
    h = x.new_zeros(B, w_hh.shape[1])
    c = torch.zeros_like(h)
    xp = x @ w_ih.T + b_ih  # (B, T, 4h)
    out, prev, gates = [None] * T, [None] * T, [None] * T
    for t in (reversed(range(T)) if reverse else range(T)):
        prev[t] = h
        gates[t] = xp[:, t] + h @ w_hh.T + b_hh  # (B, 4h)
        i, f, g, o = gates[t].chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        if reverse:  # padding after the sentence: restart from zero at its [SEP]
            keep = real[:, t, None].to(h.dtype)
            h, c = h * keep, c * keep
        out[t] = h
    if saved is not None:
        saved.append((x.detach(), torch.stack(prev, 1).detach(), gates))
    return torch.stack(out, 1)


def lstm_layers_unrolled(lstm: nn.LSTM, x: torch.Tensor, real: torch.Tensor,
                         saved: list | None = None) -> torch.Tensor:
    """Every layer of the bidirectional ``lstm`` on x (B, T, in) -> (B, T, 2h); ``saved`` as in
    ``_lstm_direction``, per layer and direction in parameter-name order."""
    if lstm.proj_size or not lstm.bidirectional or not lstm.batch_first:
        raise TypeError("unrolled LSTM: batch_first, bidirectional, no projection")
    for layer in range(lstm.num_layers):
        x = torch.cat([
            _lstm_direction(x, real, *(getattr(lstm, f"{name}_l{layer}{sfx}") for name in (
                "weight_ih", "weight_hh", "bias_ih", "bias_hh")), reverse=bool(sfx), saved=saved)
            for sfx in ("", "_reverse")], -1)
    return x


def lstm_encode_unrolled(model: BiLSTMForMaskedLM, input_ids, attention_mask) -> torch.Tensor:
    """``model.encode`` (eval mode) in plain tensor ops: (B, T+2) -> (B, T+2, 2h); padded
    positions hold the forward direction's state instead of zeros (never read)."""
    return lstm_layers_unrolled(model.lstm, model.embed(input_ids), attention_mask.bool())


def lstm_word_logits_unrolled(model, input_ids, attention_mask, positions) -> torch.Tensor:
    """``word_logits`` at one word per sentence (B, V) through ``lstm_encode_unrolled``."""
    hidden = lstm_encode_unrolled(model, input_ids, attention_mask)  # (B, T+2, 2h)
    rows = torch.arange(len(positions), device=hidden.device)
    return model.head(hidden[rows, positions + 1])[:, WORD_OFFSET:]  # (B, V)


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
