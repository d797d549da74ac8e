"""The loss function an update calls: ``mlm_loss_sum``, compiled where that pays.

``train.compile="auto"`` compiles on CUDA (small per-step work, where launch overhead dominates)
and not on the CPU (compiling takes longer than the tiny CPU runs it would speed up). A compile
failure (no C compiler, no Triton, an unsupported op) is not a failed run: the update falls back
to the eager function with one warning and stays on it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from flatlm.train.algorithms import mlm_loss_sum
from flatlm.train.config import TrainConfig, switch_on


def loss_function(cfg: TrainConfig, device: torch.device | str, *,
                  backend: str = "inductor") -> Callable:
    """``mlm_loss_sum``, compiled (with an eager fallback) when ``cfg.compile`` says so."""
    if not switch_on(cfg.compile, torch.device(device).type):
        return mlm_loss_sum
    return EagerFallback(mlm_loss_sum, backend=backend)


class EagerFallback:
    """``fn`` compiled by ``torch.compile``; the first compile error switches to ``fn`` itself.

    Compiling happens at the first call (and at a new input shape); the failed call is repeated
    eagerly, so the update is the same one (only its dropout draws may differ) computed more
    slowly. An out-of-memory error is no compile failure and is raised.
    """

    def __init__(self, fn: Callable, *, backend: str = "inductor"):
        self.fn = fn
        self.compiled: Callable | None = torch.compile(fn, backend=backend)

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.fn(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001 - any compiler error; eager raises real ones again
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            warnings.warn(f"train.compile: torch.compile failed ({type(e).__name__}: {why}); "
                          "training continues eagerly (set train.compile=false to skip "
                          "compiling)", RuntimeWarning, stacklevel=2)
            self.compiled = None
            return self.fn(*args, **kwargs)
