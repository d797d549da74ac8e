"""Muon's settings (``train.muon.*``), torch-free: the registry reads them when configs are
parsed, before any torch is imported; the optimizer itself is ``flatlm.train.muon``."""

from __future__ import annotations

import math
from dataclasses import dataclass

ADJUST_LR = ("original", "match_rms_adamw")  # torch.optim.Muon's adjust_lr_fn


@dataclass(frozen=True, kw_only=True)
class MuonConfig:
    """Muon's settings (``algorithm="muon"``), keys ``train.muon.<key>``; the defaults are those
    of Muon's reference code (KellerJordan/Muon: lr 0.02, momentum 0.95, Nesterov, 5 steps;
    weight decay 0.01 as its example and as adamw's)."""

    lr: float = 0.02  # Muon's peak rate (the schedule's shape is the run's); > 0
    momentum: float = 0.95  # decay of the gradient's momentum, in [0, 1)
    nesterov: bool = True  # step along g + momentum * buffer (Nesterov), else the buffer
    weight_decay: float = 0.01  # decoupled, on the Muon matrices only (the rest: train.
    #   weight_decay); >= 0
    ns_steps: int = 5  # Newton-Schulz iterations per step; 1..99 (torch's bound)
    adjust_lr: str = "original"  # the rate per matrix shape (A, B): "original" (Jordan's:
    #   lr sqrt(max(1, A/B))) or "match_rms_adamw" (Moonshot's: 0.2 lr sqrt(max(A, B)))

    def __post_init__(self):
        for name in ("lr", "momentum", "weight_decay"):
            value = getattr(self, name)
            _check(isinstance(value, int | float) and math.isfinite(value), name, value,
                   "use a finite number")
        _check(self.lr > 0, "lr", self.lr, "use a rate > 0 (Muon's reference: 0.02)")
        _check(0.0 <= self.momentum < 1.0, "momentum", self.momentum,
               "use a decay in [0, 1) (Muon's reference: 0.95)")
        _check(isinstance(self.nesterov, bool), "nesterov", self.nesterov, "use true or false")
        _check(self.weight_decay >= 0, "weight_decay", self.weight_decay, "use a value >= 0")
        _check(isinstance(self.ns_steps, int) and not isinstance(self.ns_steps, bool)
               and 1 <= self.ns_steps < 100, "ns_steps", self.ns_steps,
               "use an integer in 1..99 (Muon's reference: 5)")
        _check(self.adjust_lr in ADJUST_LR, "adjust_lr", self.adjust_lr,
               f"use one of {', '.join(ADJUST_LR)}")


def _check(ok: bool, key: str, value, fix: str) -> None:
    if not ok:
        raise ValueError(f"train.muon.{key}={value!r}: {fix}")
