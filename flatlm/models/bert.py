"""BERT, the transformers masked LMs: arch "bert" of ``flatlm.models.architectures``.

``build_bert`` makes a ``transformers.BertForMaskedLM`` (post-LN, the paper's) or, for
``ln_mode="pre"``, a ``RobertaPreLayerNormForMaskedLM``, both on ``encode``'s layout
(``flatlm.core.tokens``): V + 4 token ids, T + 2 positions, one token type, decoder tied to the
token embeddings, no pooler. The rest are the hooks the registry calls (``bert_parts``,
``bert_layout``, ``load_bert``, ``transformer_classes``) and what BERT-only code reads
(``transformer_parts``, ``position_ids``, ``ln_mode``, ``row_word_logits``: sentences packed
end to end into rows, ``train.sequence_packing="rows"``). Architecture-agnostic helpers
(``build_model``, ``word_logits``, ...) live in ``flatlm.models.masked_lm``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    PretrainedConfig,
    PreTrainedModel,
    RobertaPreLayerNormConfig,
    RobertaPreLayerNormForMaskedLM,
)

from flatlm.core.tokens import CLS_ID, PAD_ID, SEP_ID, WORD_OFFSET, TokenLayout, token_layout
from flatlm.models.masked_lm import build_model as build_model  # re-exported: train/ and
from flatlm.models.masked_lm import sentence_features as sentence_features  # measure/run.py
from flatlm.models.masked_lm import unwrap  # import them from here; their home is masked_lm
from flatlm.models.masked_lm import word_logits as word_logits
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


def build_bert(cfg: ModelConfig, vocab_size: int, max_length: int) -> PreTrainedModel:
    """BERT's ``build`` hook: the class of ``cfg.ln_mode`` with ``cfg.attention`` as its attention
    implementation, initialised from torch's global RNG (``build_model`` seeds it)."""
    config = transformer_config(cfg, vocab_size, max_length)
    return TRANSFORMERS[cfg.ln_mode]._from_config(config, attn_implementation=cfg.attention)


def transformer_classes() -> dict[str, type]:
    """BERT's ``classes`` hook: ``ln_mode`` -> transformers class."""
    return TRANSFORMERS


def load_bert(model_dir: str | Path, cfg: ModelConfig) -> PreTrainedModel:
    """BERT's ``load`` hook: from local files only, with the saved attention implementation."""
    return TRANSFORMERS[cfg.ln_mode].from_pretrained(
        model_dir, attn_implementation=cfg.attention, local_files_only=True
    )


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


def bert_parts(model: nn.Module) -> tuple[Callable, nn.Module]:
    """BERT's ``parts`` hook: (ids, mask -> last hidden states (n, T+2, d), the MLM head)."""
    base, head = transformer_parts(model)

    def encoder(ids, mask):
        return base(input_ids=ids, attention_mask=mask).last_hidden_state

    return encoder, head


def bert_layout(model: nn.Module) -> TokenLayout:
    """BERT's ``layout`` hook: the token layout, from the model's config."""
    config = unwrap(model).config
    extra = PRE_LN_EXTRA_POSITIONS if ln_mode(model) == "pre" else 0
    return token_layout(config.vocab_size - WORD_OFFSET,
                        config.max_position_embeddings - 2 - extra)


def row_word_logits(model: nn.Module, input_ids: torch.Tensor, attend: torch.Tensor,
                    within: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Logits over the V words (k, V) at ``slots`` of sentences packed end to end into rows.

    ``input_ids`` (R, L): several ``encode``d sentences per row, each [CLS] .. [SEP];
    ``attend`` (R, L, L) bool: query slot i may read key slot j (block-diagonal: a sentence
    reads only itself); ``within`` (R, L): each slot's position in its own sentence, 0 at its
    [CLS]; ``slots`` (k,): flat indices into the R * L slots where the head runs. Each sentence's
    states equal those it gets alone in a padded row (the same position ids, the same keys), up
    to the order of float sums. Attention dropout stays: SDPA takes the mask and ``dropout_p``
    (on CUDA its memory-efficient kernel, which supports both); under eager attention the mask
    is made additive.
    """
    base, head = transformer_parts(model)
    offset = PAD_ID + 1 if ln_mode(model) == "pre" else 0  # RoBERTa's ids start past padding
    mask = attend[:, None]  # (R, 1, L, L): one mask for every head
    if unwrap(model).config._attn_implementation != "sdpa":
        mask = torch.zeros(mask.shape, dtype=base.embeddings.word_embeddings.weight.dtype,
                           device=mask.device).masked_fill(~mask, torch.finfo(torch.float32).min)
    hidden = base(input_ids=input_ids, attention_mask=mask,
                  position_ids=within + offset).last_hidden_state  # (R, L, d)
    return head(hidden.flatten(0, 1)[slots])[..., WORD_OFFSET:]  # (k, V)
