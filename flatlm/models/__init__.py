"""Masked LMs (BERT via transformers, bidirectional LSTM, registered ones) on one token layout.

- ``flatlm.core.tokens`` (re-exported: every stage reads it): ``encode`` (word ids ->
  ``[CLS] x_1 .. x_L [SEP] [PAD]..``), ``mask_positions``.
- ``architectures``: the registry, one ``Architecture`` per ``ModelConfig.arch`` with its hooks;
  ``register_architecture`` adds one.
- ``presets``: ``ModelConfig``, ``ModelSpec``, the paper's presets (Tables 3-4, A.4),
  ``parse_model``, counts.
- ``masked_lm``: ``build_model`` and the architecture-agnostic helpers (``word_logits`` ...).
- ``bert``: the transformers (post- and pre-LN); ``lstm``: ``BiLSTMForMaskedLM``
  (``lstm_unrolled``: its forward in plain tensor ops).
- ``checkpoint``: ``save_checkpoint`` / ``load_checkpoint`` (``save_pretrained`` + ``flatlm.json``).
- ``growth``: function-preserving growth into a larger shape (paper B.4); ``reparameterise``:
  function-preserving maps within one shape (scalings, a permutation), for invariance tests.
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
    "architectures": "Architecture all_architectures architecture register_architecture",
    "masked_lm": (
        "architecture_of build_model cls_features count_parameters encoder_features "
        "find_architecture ln_mode_of model_layout non_finite_part sentence_features unwrap "
        "word_logits"
    ),
    "bert": (
        "bert_config is_transformer ln_mode position_ids pre_ln_config transformer_config "
        "transformer_parts"
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
