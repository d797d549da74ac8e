"""The learning-rate schedule, by a table of expected values."""

import pytest

from flatlm.core.schedules import warmup_constant

# (step, warmup_steps, expected rate at peak 1e-3)
TABLE = [
    (0, 4, 0.25e-3),  # the first update already moves: 1/4 of the peak
    (1, 4, 0.50e-3),
    (2, 4, 0.75e-3),
    (3, 4, 1.00e-3),  # update warmup_steps - 1 is the first at the peak
    (4, 4, 1.00e-3),  # constant after: checkpoints at any step are comparable (A.5)
    (10_000, 4, 1.00e-3),
    (0, 0, 1.00e-3),  # no warmup
    (0, 1, 1.00e-3),
    (499, 1000, 0.5e-3),  # the paper's 1000-step warmup, half way
    (999, 1000, 1.00e-3),
]


@pytest.mark.parametrize(("step", "warmup", "expected"), TABLE)
def test_warmup_constant_table(step, warmup, expected):
    assert warmup_constant(step, peak=1e-3, warmup_steps=warmup) == pytest.approx(expected,
                                                                                 rel=1e-12)


def test_negative_step_is_an_error():
    with pytest.raises(ValueError, match="step=-1"):
        warmup_constant(-1, peak=1e-3, warmup_steps=10)
