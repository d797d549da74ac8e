"""Learning-rate schedules shared by pre-training, the probe and fine-tuning: pure functions of the
update index.

Linear warmup, then either a constant rate (the paper's pre-training, so that checkpoints at
different steps can be compared and training continued from any of them) or a linear decay to zero
at the last update (the released code's "time" schedule, its probe's polynomial decay of power 1,
and fine-tuning).

>>> [learning_rate(s, peak=1.0, warmup_steps=2, total_steps=6) for s in range(6)]
[0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
>>> [learning_rate(s, peak=1.0, warmup_steps=2, total_steps=6, schedule="constant")
...  for s in range(6)]
[0.5, 1.0, 1.0, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

SCHEDULES = ("constant", "linear")


def learning_rate(step: int, *, peak: float, warmup_steps: int, total_steps: int,
                  schedule: str = "linear") -> float:
    """Rate of update ``step`` (0-based) of ``total_steps``: ``peak * (step + 1) / warmup_steps``
    while warming up, then ``peak`` ("constant") or ``peak * (total - step) / (total - warmup)``
    ("linear", never above ``peak``, last update at ``peak / (total - warmup)``).

    The first update already moves (rate ``peak / warmup_steps``) and update ``warmup_steps - 1``
    is the first at the peak; ``warmup_steps = 0`` starts at the peak.
    """
    if step < 0:
        raise ValueError(f"step={step}: updates are numbered from 0")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: use one of {', '.join(SCHEDULES)}")
    if step + 1 < warmup_steps:
        return peak * (step + 1) / warmup_steps
    if schedule == "constant":
        return peak
    return peak * min(1.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def warmup_constant(step: int, *, peak: float, warmup_steps: int) -> float:
    """The paper's schedule (A.5) for update ``step`` (0-based): ``peak * (step + 1) /
    warmup_steps`` while warming up, then ``peak``, so that checkpoints at different steps can be
    compared and pre-training continued from any of them.

    The first update already moves (rate ``peak / warmup_steps``) and update ``warmup_steps - 1``
    is the first at the peak; ``warmup_steps = 0`` starts at the peak.

    >>> [warmup_constant(s, peak=1.0, warmup_steps=4) for s in range(6)]
    [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    """
    return learning_rate(step, peak=peak, warmup_steps=warmup_steps, total_steps=step + 1,
                         schedule="constant")
