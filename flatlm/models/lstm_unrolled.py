"""The BiLSTM's forward in plain tensor ops: what the fused ``nn.LSTM`` cannot give.

cuDNN's LSTM has no double backward (and no backward in eval mode), and ``vmap`` cannot batch the
fused kernel (no batching rule; packed sequences are data-dependent). So Tr(H), sharpness, the
vmap route and the LSTM ghost norms (``flatlm.measure``) run the LSTM unrolled here, with the same
parameters and the same packed-sequence semantics:

    gates_t = W_ih x_t + b_ih + W_hh h_{t-1} + b_hh = (i, f, g, o)
    c_t = sigma(f) c_{t-1} + sigma(i) tanh(g),   h_t = sigma(o) tanh(c_t)

The backward direction zeroes its state on padding, so it starts from zero at each sentence's
[SEP] exactly as ``pack_padded_sequence`` does; the forward direction never reads padding before
a real word. ``lstm_word_logits_unrolled`` is the BiLSTM's ``second_order_logits`` hook
(``flatlm.models.architectures``).
"""

from __future__ import annotations

import torch
from torch import nn

from flatlm.core.tokens import WORD_OFFSET
from flatlm.models.lstm import BiLSTMForMaskedLM


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
