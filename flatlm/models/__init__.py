"""Masked LMs (BERT via transformers, bidirectional LSTM) on one shared token layout.

- ``flatlm.core.tokens`` (re-exported: every stage reads it): ``encode`` (word ids ->
  ``[CLS] x_1 .. x_L [SEP] [PAD]..``), ``mask_positions``.
- ``presets``: ``ModelConfig``, ``ModelSpec``, the paper's presets (Tables 3-4, A.4),
  ``parse_model``, counts.
- ``bert``: ``build_model`` and the architecture-agnostic helpers (``word_logits`` ...).
- ``lstm``: ``BiLSTMForMaskedLM``.
- ``checkpoint``: ``save_checkpoint`` / ``load_checkpoint`` (``save_pretrained`` + ``flatlm.json``).
"""

from __future__ import annotations

import importlib

# name -> module. Imported lazily so that ``flatlm.models.presets`` and ``flatlm.core.tokens`` (used
# when parsing sweep configs) do not pay for importing transformers (about 5 s).
_EXPORTS = {
    "flatlm.core.tokens": (
        "CLS_ID MASK_ID PAD_ID SEP_ID WORD_OFFSET SPECIAL_TOKENS TokenLayout encode "
        "mask_positions token_layout"
    ),
    "presets": (
        "PRESETS TABLE3 TABLE4 ModelConfig ModelSpec describe paper_parameter_count "
        "parameter_count parse_model shape_string"
    ),
    "bert": (
        "bert_config build_model cls_features count_parameters encoder_features is_transformer "
        "ln_mode model_layout position_ids pre_ln_config transformer_config transformer_parts "
        "sentence_features unwrap "
        "word_logits"
    ),
    "lstm": "BiLSTMForMaskedLM",
    "checkpoint": "load_checkpoint save_checkpoint",
}
_EXPORTS["growth"] = "Growth grow grow_checkpoint growth max_logit_difference random_inputs"
_EXPORTS = {m if m.startswith("flatlm.") else f"flatlm.models.{m}": names
            for m, names in _EXPORTS.items()}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'flatlm.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
