r"""The loss barrier on the straight line between two models (linear mode connectivity; after
Juneja, Bansal, Cho, Sedoc, Saphra, *Linear Connectivity Reveals Generalization Strategies*,
ICLR 2023, and Frankle et al. 2020):

.. math::
    B(a, b) = \max_{t \in [0, 1]} L((1 - t) a + t b) - ((1 - t) L(a) + t L(b)),

the largest rise of the loss on the segment above the chord between its ends, over ``points``
evenly spaced t (ends included, where the rise is 0, so B >= 0). Every floating-point entry of
the state dict (parameters and buffers) is interpolated; the rest (integer buffers such as
position ids) must agree. For a quadratic L(w) = 1/2 w^T A w the rise is
-t (1 - t) / 2 (a - b)^T A (a - b): 0 at the ends, and where (a - b)^T A (a - b) < 0 (the
segment crosses a ridge) the barrier -1/8 (a - b)^T A (a - b), at t = 1/2.
``analysis/barriers.py`` measures it between the final checkpoints of a sweep's runs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Barrier:
    """``barrier`` = max of ``rise``; the curve as t, L(t) and L(t) minus the chord."""

    barrier: float
    t_max: float  # the t where the rise is largest
    t: tuple[float, ...]
    loss: tuple[float, ...]
    rise: tuple[float, ...]


def _endpoint_states(model_a: nn.Module, model_b: nn.Module) -> tuple[dict, dict]:
    """Both state dicts, detached copies, checked to be of one shape."""
    a = {k: v.detach().clone() for k, v in model_a.state_dict().items()}
    b = {k: v.detach().clone() for k, v in model_b.state_dict().items()}
    if a.keys() != b.keys():
        raise ValueError(f"loss_barrier: entries {sorted(a.keys() ^ b.keys())[:5]} are in one "
                         "model only; interpolate models of one architecture and shape")
    for k in a:
        if a[k].shape != b[k].shape:
            raise ValueError(f"loss_barrier: {k} has shape {tuple(a[k].shape)} and "
                             f"{tuple(b[k].shape)}; interpolate models of one shape")
        if not a[k].is_floating_point() and not torch.equal(a[k], b[k].to(a[k].device)):
            raise ValueError(f"loss_barrier: the integer entry {k} differs between the models")
    return a, b


def interpolated_state(a: dict, b: dict, t: float) -> dict:
    """(1 - t) a + t b for floating-point entries, a's entry for the others. ``torch.lerp``
    (a + t (b - a) below t = 1/2, b - (1 - t) (b - a) above) is exactly a at t = 0, b at t = 1
    and a everywhere when b == a, which (1 - t) a + t b is not: its roundings put identical
    endpoints a few ulps apart along the path."""
    return {k: torch.lerp(v, b[k].to(v.device), t) if v.is_floating_point() else v
            for k, v in a.items()}


def chord(loss_a: float, loss_b: float, ts: np.ndarray) -> np.ndarray:
    """(1 - t) L(a) + t L(b) by ``torch.lerp`` too: exact at the ends and constant when
    L(a) == L(b), so that equal endpoints rise by exactly 0."""
    t = torch.as_tensor(ts, dtype=torch.float64)
    return torch.lerp(torch.full_like(t, loss_a), torch.full_like(t, loss_b), t).numpy()


def loss_barrier(model_a: nn.Module, model_b: nn.Module, loss_fn: Callable[[nn.Module], float],
                 points: int = 11) -> Barrier:
    """The barrier (module docstring) over ``points`` >= 3 evenly spaced t in [0, 1];
    ``loss_fn(model)`` -> the loss. The models are left as they were: the path runs on a copy
    of ``model_a``."""
    if points < 3:
        raise ValueError(f"loss_barrier: points={points}; use >= 3 (the ends and one between)")
    a, b = _endpoint_states(model_a, model_b)
    path = copy.deepcopy(model_a)
    ts = np.linspace(0.0, 1.0, points)
    losses = []
    for t in ts:
        path.load_state_dict(interpolated_state(a, b, float(t)))
        losses.append(float(loss_fn(path)))
    rise = np.asarray(losses) - chord(losses[0], losses[-1], ts)
    i = int(np.argmax(rise))
    return Barrier(float(rise[i]), float(ts[i]), tuple(ts.tolist()), tuple(losses),
                   tuple(rise.tolist()))
