"""A training run's sizes checked against memory before anything is allocated.

:func:`check_fits` estimates a lower bound of what a training run holds at once (the model with
its gradients and AdamW state, one forward pass's hidden states (and attention weights under
eager attention), one batch of sentences) and raises a ValueError naming the setting that makes
it too large (``flatlm.core.memory.require``): a run it refuses could never have fitted.
"""

from __future__ import annotations

from flatlm.core.memory import require
from flatlm.models.architectures import counts_by_building
from flatlm.models.presets import parameter_count, shape_string
from flatlm.train.data import TRUTH_CHUNK

_FLOAT = 4  # bytes of a float32
_INT = 8  # bytes of an int64 token id
_ADAMW_COPIES = 4  # weights, gradients and AdamW's two moments


def model_parameters(model_cfg, n_words: int, max_length: int) -> int | None:
    """The parameter count of ``model_cfg`` over ``n_words`` words and ``max_length`` positions,
    computed without building the model; None for an architecture that can only count by
    building it (its model is then not checked: building it is the allocation to avoid)."""
    if counts_by_building(model_cfg):
        return None
    return parameter_count(model_cfg, n_words, max_length)


def check_fits(cfg, model_cfg, source, device) -> None:
    """Refuses a training run (``cfg`` a ``TrainConfig``) whose model, one forward pass or one
    batch cannot fit in memory, naming the setting to change (see the module docstring)."""
    n_words, length = source.V, source.max_length
    positions = length + 2
    params = model_parameters(model_cfg, n_words, length)
    if params is not None:
        require(params * _FLOAT * _ADAMW_COPIES,
                f"--model {shape_string(model_cfg)} with {n_words} words and {length} positions "
                f"({params:,} parameters, with gradients and AdamW state)",
                "give a smaller --model (width, layers, intermediate size), or a source with "
                "fewer words or shorter sentences", device=device)
    per_pass = cfg.micro_batch_size or cfg.sentences_per_pass
    width = model_cfg.d_model or model_cfg.d_hidden or 0
    heads = model_cfg.n_heads or 0
    # T x T attention weights: every layer's kept for backward under eager attention; at least
    # one layer's under SDPA, whose kernel for a padding mask materialises them (dyck:1000000
    # reached a 32 TB allocation that the estimate without them let through)
    attention = (model_cfg.n_layers if model_cfg.attention == "eager" else 1) * heads
    per_token = model_cfg.n_layers * width + attention * positions
    require(per_pass * positions * per_token * _FLOAT,
            f"one forward pass of {per_pass} sentences of {length} positions "
            f"(train.batch_size / train.micro_batch_size and the source's length)",
            "lower train.micro_batch_size (or train.batch_size), or use a source with shorter "
            "sentences", device=device)
    if cfg.targets == "truth":  # the batch's soft targets, and one chunk's exact conditionals
        per_sentence = (1 if cfg.mask == "one" else length) * n_words * _FLOAT
        chunk = min(cfg.batch_size, TRUTH_CHUNK) * length * n_words * 2 * _FLOAT
        require(cfg.batch_size * per_sentence + chunk,
                f"the soft targets of train.targets=truth: {n_words} words' conditionals at "
                f"{'each masked word' if cfg.mask == 'one' else f'each of {length} words'} of "
                f"train.batch_size={cfg.batch_size} sentences",
                "lower train.batch_size, use train.mask=one, or train.targets=sampled",
                device=device)
    require(cfg.batch_size * length * _INT * 2,
            f"one batch of train.batch_size={cfg.batch_size} sentences of the source's length "
            f"{length}", "lower train.batch_size, or use a source with shorter sentences")
