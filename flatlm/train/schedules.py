"""Learning-rate schedules: pure functions of the update index.

The paper warms up linearly and then holds the rate constant, so that checkpoints at different
steps can be compared and pre-training continued from any of them (A.5).

>>> [warmup_constant(s, peak=1.0, warmup_steps=4) for s in range(6)]
[0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
"""

from __future__ import annotations

from flatlm.schedules import learning_rate


def warmup_constant(step: int, *, peak: float, warmup_steps: int) -> float:
    """Rate for update ``step`` (0-based): ``peak * (step + 1) / warmup_steps`` while warming up,
    then ``peak``.

    The first update already moves (rate ``peak / warmup_steps``) and update ``warmup_steps - 1``
    is the first at the peak; ``warmup_steps = 0`` starts at the peak.
    """
    return learning_rate(step, peak=peak, warmup_steps=warmup_steps, total_steps=step + 1,
                         schedule="constant")
