"""Building masked LMs by config, and the helpers training and measurement code call on them.

``build_model`` returns a ``transformers.BertForMaskedLM`` (arch "bert", post-LN), a
``transformers.RobertaPreLayerNormForMaskedLM`` (arch "bert", ``ln_mode="pre"``) or a
``BiLSTMForMaskedLM`` (arch "lstm"); all read ``encode``'s layout (``flatlm.core.tokens``).
The helpers work on any of them, so callers never branch on the architecture:

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
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    PretrainedConfig,
    RobertaPreLayerNormConfig,
    RobertaPreLayerNormForMaskedLM,
)

from flatlm.core.tokens import CLS_ID, PAD_ID, SEP_ID, WORD_OFFSET, TokenLayout, token_layout
from flatlm.models.lstm import BiLSTMForMaskedLM, build_lstm
from flatlm.models.presets import PRE_LN_EXTRA_POSITIONS, ModelConfig

# the transformer classes build_model makes, by ModelConfig.ln_mode
TRANSFORMERS = {"post": BertForMaskedLM, "pre": RobertaPreLayerNormForMaskedLM}
assert PRE_LN_EXTRA_POSITIONS == PAD_ID + 1  # RoBERTa position ids start at padding_idx + 1


def _shared_fields(cfg: ModelConfig, layout) -> dict:
    """The config fields both transformer classes take alike."""
    return dict(vocab_size=layout.vocab_size, hidden_size=cfg.d_model,
                num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                intermediate_size=cfg.d_inter, hidden_act="gelu",
                hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout,
                type_vocab_size=1,  # single sentences: no sentence-B embedding to learn
                pad_token_id=PAD_ID, tie_word_embeddings=True)


def bert_config(cfg: ModelConfig, vocab_size: int, max_length: int) -> BertConfig:
    """The ``BertConfig`` for ``cfg``: V + 4 ids, T + 2 positions, one token type, tied decoder."""
    layout = token_layout(vocab_size, max_length)
    return BertConfig(**_shared_fields(cfg, layout), max_position_embeddings=layout.n_positions)


def pre_ln_config(cfg: ModelConfig, vocab_size: int, max_length: int) -> RobertaPreLayerNormConfig:
    """The ``RobertaPreLayerNormConfig`` for ``cfg``: as ``bert_config``, except that position
    ids run from PAD_ID + 1 (RoBERTa's convention), so it has T + 2 + PAD_ID + 1 positions."""
    layout = token_layout(vocab_size, max_length)
    return RobertaPreLayerNormConfig(
        **_shared_fields(cfg, layout), bos_token_id=CLS_ID, eos_token_id=SEP_ID,
        max_position_embeddings=layout.n_positions + PRE_LN_EXTRA_POSITIONS)


def transformer_config(cfg: ModelConfig, vocab_size: int, max_length: int) -> PretrainedConfig:
    """``bert_config`` or ``pre_ln_config``, by ``cfg.ln_mode``."""
    make = pre_ln_config if cfg.ln_mode == "pre" else bert_config
    return make(cfg, vocab_size, max_length)


def build_model(
    cfg: ModelConfig, vocab_size: int, max_length: int, *, seed: int | None = None
) -> nn.Module:
    """A fresh masked LM for ``vocab_size`` words (V) and sentences of at most ``max_length`` (T).

    arch "bert": ``BertForMaskedLM``, or ``RobertaPreLayerNormForMaskedLM`` for
    ``cfg.ln_mode="pre"`` (no pooler; decoder tied to the token embeddings) with
    ``cfg.attention`` as its attention implementation. arch "lstm": ``BiLSTMForMaskedLM``.
    ``seed`` fixes the initialisation without touching the global RNG; None draws from it.
    The model is on the CPU in train mode.
    """
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        if cfg.arch == "lstm":
            return build_lstm(cfg, vocab_size, max_length)
        config = transformer_config(cfg, vocab_size, max_length)
        model_class = TRANSFORMERS[cfg.ln_mode]
        return model_class._from_config(config, attn_implementation=cfg.attention).train()


def unwrap(model: nn.Module) -> nn.Module:
    """The module ``torch.compile`` wrapped (``model`` itself when it is not compiled).

    A compiled module's submodules (bert, cls) are the uncompiled originals, so code that reads
    parameters, names or types works on the unwrapped module.
    """
    return getattr(model, "_orig_mod", model)


def is_transformer(model: nn.Module) -> bool:
    """Whether ``model`` (or what it wraps) is one of ``build_model``'s transformers."""
    return isinstance(unwrap(model), tuple(TRANSFORMERS.values()))


def ln_mode(model: nn.Module) -> str:
    """"post" or "pre" for a transformer from ``build_model``."""
    inner = unwrap(model)
    for mode, model_class in TRANSFORMERS.items():
        if isinstance(inner, model_class):
            return mode
    raise TypeError(f"expected a transformer from build_model, got {type(inner).__name__}")


def transformer_parts(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """(encoder, MLM head) of a transformer: (``bert``, ``cls``) post-LN, or
    (``roberta_prelayernorm``, ``lm_head``) pre-LN. The encoder's ``last_hidden_state`` is what
    the head reads (pre-LN: after the final LayerNorm)."""
    inner = unwrap(model)
    if ln_mode(inner) == "pre":
        return inner.roberta_prelayernorm, inner.lm_head
    return inner.bert, inner.cls


def position_ids(model: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """(n, T+2) position ids the transformer reads for ``encode``d ``input_ids``: 0, 1, .. for
    BERT; RoBERTa's PAD_ID + 1, PAD_ID + 2, .. on real tokens and PAD_ID on padding for pre-LN
    (what each computes when given none, but with the batch dimension BERT's default lacks)."""
    if ln_mode(model) == "pre":
        embeddings = transformer_parts(model)[0].embeddings
        return embeddings.create_position_ids_from_input_ids(input_ids, PAD_ID)
    n, width = input_ids.shape
    return torch.arange(width, device=input_ids.device).expand(n, width).contiguous()


def _encoder_and_head(model: nn.Module) -> tuple[Callable, Callable]:
    model = unwrap(model)
    if is_transformer(model):
        base, head = transformer_parts(model)

        def encoder(ids, mask):
            return base(input_ids=ids, attention_mask=mask).last_hidden_state

        return encoder, head
    if isinstance(model, BiLSTMForMaskedLM):
        return model.encode, model.head
    raise TypeError(f"expected a model from build_model, got {type(model).__name__}")


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


def model_layout(model: nn.Module) -> TokenLayout:
    """The token layout a built model reads, from its own sizes."""
    model = unwrap(model)
    if isinstance(model, BiLSTMForMaskedLM):
        return model.layout
    if is_transformer(model):
        config = model.config
        extra = PRE_LN_EXTRA_POSITIONS if ln_mode(model) == "pre" else 0
        return token_layout(config.vocab_size - WORD_OFFSET,
                            config.max_position_embeddings - 2 - extra)
    raise TypeError(f"expected a model from build_model, got {type(model).__name__}")
