"""Any masked LM from ``build_model``: building one by config, and the helpers training and
measurement code call on it, whatever its architecture (``flatlm.models.architectures``).

``build_model`` returns what the architecture's ``build`` hook makes: a
``transformers.BertForMaskedLM`` (arch "bert", post-LN), a ``RobertaPreLayerNormForMaskedLM``
("bert", ``ln_mode="pre"``), a ``BiLSTMForMaskedLM`` ("lstm") or a registered one; all read
``encode``'s layout (``flatlm.core.tokens``). The helpers ask the registry for the model's encoder
and head (``architecture_of``), so callers never branch on the architecture:

- ``encoder_features`` -> (n, T+2, d) final-layer states (d = d_model, or 2 d_hidden for the LSTM);
- ``cls_features`` -> (n, d), the states at [CLS];
- ``word_logits`` -> logits over the V words only (head columns 4..V+3), at every position or only
  at one masked word per sentence, where the head runs only on the gathered states.

>>> import torch
>>> from flatlm.models.presets import parse_model
>>> from flatlm.core.tokens import encode
>>> model = build_model(parse_model("d64-h1-l1-i256"), vocab_size=10, max_length=5, seed=0)
>>> ids, mask = encode(torch.tensor([[3, 1, -1, -1, -1]]), torch.tensor([2]))
>>> word_logits(model, ids, mask).shape, word_logits(model, ids, mask, torch.tensor([0])).shape
(torch.Size([1, 7, 10]), torch.Size([1, 10]))
>>> architecture_of(model).name, ln_mode_of(model)
('bert', 'post')
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flatlm.core.tokens import WORD_OFFSET, TokenLayout, encode
from flatlm.models.architectures import Architecture, all_architectures, architecture
from flatlm.models.presets import ModelConfig


def build_model(
    cfg: ModelConfig, vocab_size: int, max_length: int, *, seed: int | None = None
) -> nn.Module:
    """A fresh masked LM for ``vocab_size`` words (V) and sentences of at most ``max_length`` (T),
    made by the ``build`` hook of ``cfg.arch`` (a BERT: with ``cfg.attention`` as its attention
    implementation, no pooler, decoder tied to the token embeddings).

    ``seed`` fixes the initialisation without touching the global RNG; None draws from it.
    The model is on the CPU in train mode.
    """
    arch = architecture(cfg)
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        return arch.build(cfg, vocab_size, max_length).train()


def count_by_building(cfg: ModelConfig, vocab_size: int, max_length: int) -> int:
    """The default ``Architecture.parameter_count``: build the model (fixed seed) and count."""
    return count_parameters(build_model(cfg, vocab_size, max_length, seed=0))


def unwrap(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (``model`` itself when it is not compiled).

    A compiled module's submodules (bert, cls) are the uncompiled originals, so code that reads
    parameters, names or types works on the unwrapped module.
    """
    return getattr(model, "_orig_mod", model)


def find_architecture(model: nn.Module) -> Architecture | None:
    """The registered architecture whose classes ``model`` (or what it wraps) is of, else None."""
    inner = unwrap(model)
    for arch in all_architectures():
        if isinstance(inner, tuple(arch.classes().values())):
            return arch
    return None


def architecture_of(model: nn.Module) -> Architecture:
    """``find_architecture`` for a model from ``build_model``; a TypeError for any other."""
    arch = find_architecture(model)
    if arch is None:
        raise TypeError(f"expected a model from build_model, got {type(unwrap(model)).__name__}")
    return arch


def ln_mode_of(model: nn.Module) -> str:
    """The ``ModelConfig.ln_mode`` a model from ``build_model`` was built with."""
    inner = unwrap(model)
    for mode, model_class in architecture_of(inner).classes().items():
        if isinstance(inner, model_class):
            return mode
    raise AssertionError("unreachable: architecture_of matched one of these classes")


def _encoder_and_head(model: nn.Module) -> tuple[Callable, Callable]:
    inner = unwrap(model)
    parts = architecture_of(inner).parts
    return parts(inner) if parts is not None else (inner.encode, inner.head)


def encoder_features(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Final-layer hidden states (n, T+2, d), before the MLM head."""
    encoder, _ = _encoder_and_head(model)
    return encoder(input_ids, attention_mask)


def sentence_features(model: nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> torch.Tensor:
    """Final-layer states of every position, concatenated: (n, (T+2) d), zero on padding.

    The linear probe's representation (A.5: "we concatenate embeddings of all the tokens"), and
    the adversarial algorithm's head's.
    """
    h = encoder_features(model, input_ids, attention_mask)  # (n, T+2, d)
    return (h * attention_mask[..., None].to(h.dtype)).flatten(1)


def cls_features(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """States at [CLS] (n, d). For the BiLSTM only its backward half has read the sentence."""
    return encoder_features(model, input_ids, attention_mask)[:, 0]


def word_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits over the V words: (n, T+2, V) everywhere, (n, V) at word ``positions`` [n], or
    (k, V) at the k True entries of a bool ``positions`` [n, T] (row-major order).

    ``positions`` are 0-based word positions (input position + 1). With them the encoder states are
    gathered first and the MLM head runs on n (or k) vectors instead of n (T+2): for a large
    vocabulary the head is a large share of the cost. Column c is word c (input id c + 4).
    """
    encoder, head = _encoder_and_head(model)
    hidden = encoder(input_ids, attention_mask)  # (n, T+2, d)
    if positions is not None and positions.dtype == torch.bool:
        hidden = hidden[:, 1:-1][positions.to(hidden.device)]  # (k, d)
    elif positions is not None:
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        hidden = hidden[rows, positions.to(hidden.device) + 1]  # (n, d)
    return head(hidden)[..., WORD_OFFSET:]  # (n, [T+2,] V) or (k, V)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters; the tied decoder weight counts once."""
    return sum(p.numel() for p in model.parameters())


def non_finite_part(model: nn.Module) -> str | None:
    """"weights" or "outputs (logits)" where ``model`` has a value that is not finite, else None:
    the one finiteness check of training (a diverged update) and measurement (a diverged
    checkpoint reads NaN). The outputs are read too because finite weights can still overflow
    the logits (weights x1e30, or one update at lr 1e20), which breaks an estimator as NaN
    weights do. They are read on one fixed input (the longest sentence, words 0, 1, ..),
    without gradients and in eval mode (no dropout draws: the RNG is untouched)."""
    if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):
        return "weights"
    layout = model_layout(model)
    device = next(model.parameters()).device
    words = torch.arange(layout.max_length, device=device)[None] % layout.n_words
    input_ids, attention_mask = encode(words, torch.tensor([layout.max_length], device=device))
    training = model.training
    try:
        with torch.no_grad():
            logits = word_logits(model.eval(), input_ids, attention_mask)
    finally:
        model.train(training)
    return None if bool(torch.isfinite(logits).all()) else "outputs (logits)"


def model_layout(model: nn.Module) -> TokenLayout:
    """The token layout a built model reads, from its own sizes."""
    inner = unwrap(model)
    layout = architecture_of(inner).layout
    return layout(inner) if layout is not None else inner.layout
