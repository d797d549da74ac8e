"""The loss function an update calls: ``mlm_loss_sum`` (or ``row_loss_sum`` when sentences are
laid out in rows, ``train.sequence_packing="rows"``), compiled where that pays. Either compiles
to one graph, forward and backward (tests/train/test_compiled_graph.py).

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
from flatlm.train.config import TrainConfig, sequence_packing_for, switch_on
from flatlm.train.rows import row_loss_sum


def loss_function(cfg: TrainConfig, device: torch.device | str, *,
                  backend: str = "inductor") -> Callable:
    """The summed MLM loss of the run's layout (``row_loss_sum`` for rows, else
    ``mlm_loss_sum``), compiled (with an eager fallback) when ``cfg.compile`` says so."""
    device_type = torch.device(device).type
    loss = row_loss_sum if sequence_packing_for(cfg, device_type) == "rows" else mlm_loss_sum
    if not switch_on(cfg.compile, device_type):
        return loss
    # Dynamo caches compiled graphs per code object, one per shape and dropout rate, and past
    # its recompile limit (8) runs the function eagerly without a word: a process that trains
    # many runs (the replication runner) would silently stop compiling. Each run starts afresh.
    torch._dynamo.reset()
    return EagerFallback(loss, backend=backend)


class EagerFallback:
    """``fn`` compiled by ``torch.compile``; the first compile error switches to ``fn`` itself.

    Compiling happens at the first call (and at a new input shape), the backward graph's at the
    first ``backward()`` through it (``backward_failed``, called by the update); the failed call
    is repeated eagerly, so the update is the same one (only its dropout draws may differ)
    computed more slowly. An out-of-memory error is no compile failure and is raised.
    """

    def __init__(self, fn: Callable, *, backend: str = "inductor"):
        self.fn = fn
        self.compiled: Callable | None = torch.compile(fn, backend=backend)

    def __call__(self, *args, **kwargs):
        if self.compiled is None:
            return self.fn(*args, **kwargs)
        try:
            return self.compiled(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any compiler error; eager raises real ones again
            if not self.backward_failed(e):
                raise
            return self.fn(*args, **kwargs)

    def backward_failed(self, error: Exception) -> bool:
        """Whether ``error`` (raised by a compiled call, or by the first backward through one,
        where the backward graph compiles) is a compile failure: then warns once and switches to
        eager. Out of memory is not one, nor anything once eager."""
        if self.compiled is None or isinstance(error, torch.OutOfMemoryError):
            return False
        why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        warnings.warn(f"train.compile: torch.compile failed ({type(error).__name__}: {why}); "
                      "training continues eagerly (set train.compile=false to skip compiling)",
                      RuntimeWarning, stacklevel=3)
        self.compiled = None
        return True
