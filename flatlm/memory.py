"""Sizes checked against memory before anything is allocated.

A typo such as ``dyck:1000000`` (a million positions) or ``--model d1000000-h1-l1-i64`` would
otherwise fail deep in numpy or torch with an allocation traceback, or, worse, be killed by the
kernel after minutes. :func:`check_fits` estimates a lower bound of what a training run holds at
once (the model with its gradients and AdamW state, one forward pass's attention and hidden
states, one batch of sentences) and raises a ValueError naming the setting that makes it too
large. The estimate is a lower bound, so a run it refuses could never have fitted.

>>> require(2**20, "hmm vocab", "use a smaller vocabulary", available=2**30)
>>> require(2**40, "hmm vocab", "use a smaller vocabulary", available=2**30)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: hmm vocab needs at least 1024 GiB of memory, but 1.0 GiB is available: use a ...
"""

from __future__ import annotations

import os

from flatlm.models.presets import shape_string

_FLOAT = 4  # bytes of a float32
_INT = 8  # bytes of an int64 token id
_ADAMW_COPIES = 4  # weights, gradients and AdamW's two moments


def available_bytes(device=None) -> int:
    """Memory a new allocation can use: the GPU's free memory for a CUDA device, else the
    host's MemAvailable (Linux), else its physical memory."""
    if device is not None and getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def require(nbytes: float, what: str, fix: str, *, available: int | None = None,
            device=None) -> None:
    """Raises ValueError when ``nbytes`` exceed the memory available (on ``device``), naming
    ``what`` needs it and the ``fix``."""
    available = available_bytes(device) if available is None else available
    if nbytes > available:
        raise ValueError(f"{what} needs at least {_gib(nbytes)} of memory, but "
                         f"{_gib(available)} is available: {fix}")


def _gib(n: float) -> str:
    gib = n / 2**30
    return f"{gib:.0f} GiB" if gib >= 100 else f"{gib:.1f} GiB"


def model_parameters(model_cfg, n_words: int, max_length: int) -> int:
    """A lower bound of the parameter count of ``model_cfg`` over ``n_words`` words and
    ``max_length`` positions (embeddings, attention and MLP weights; biases and norms left
    out)."""
    if model_cfg.arch == "lstm":
        h = model_cfg.d_hidden
        return (n_words + 4) * h + model_cfg.n_layers * 2 * 4 * h * (2 * h + h)
    d, inter = model_cfg.d_model, model_cfg.d_inter
    embeddings = (n_words + 4 + max_length + 2) * d
    return embeddings + model_cfg.n_layers * (4 * d * d + 2 * d * inter)


def check_fits(cfg, model_cfg, source, device) -> None:
    """Refuses a training run whose model, one forward pass or one batch cannot fit in memory,
    naming the setting to change (see the module docstring)."""
    n_words, length = source.V, source.max_length
    positions = length + 2
    params = model_parameters(model_cfg, n_words, length)
    require(params * _FLOAT * _ADAMW_COPIES,
            f"--model {shape_string(model_cfg)} with {n_words} words and {length} positions "
            f"({params:,} parameters, with gradients and AdamW state)",
            "give a smaller --model (width, layers, intermediate size), or a source with "
            "fewer words or shorter sentences", device=device)
    per_pass = cfg.micro_batch_size or cfg.sentences_per_pass
    width = model_cfg.d_model or model_cfg.d_hidden
    eager_heads = model_cfg.n_heads if model_cfg.attention == "eager" else 0  # sdpa: no T x T
    per_token = model_cfg.n_layers * width + (eager_heads or 0) * positions  # kept for backward
    require(per_pass * positions * per_token * _FLOAT,
            f"one forward pass of {per_pass} sentences of {length} positions "
            f"(train.batch_size / train.micro_batch_size and the source's length)",
            "lower train.micro_batch_size (or train.batch_size), or use a source with shorter "
            "sentences", device=device)
    require(cfg.batch_size * length * _INT * 2,
            f"one batch of train.batch_size={cfg.batch_size} sentences of the source's length "
            f"{length}", "lower train.batch_size, or use a source with shorter sentences")
