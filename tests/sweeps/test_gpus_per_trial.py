"""--gpus-per-trial: a fraction shares a GPU, a whole N > 1 trains each trial on N ranks."""

from argparse import Namespace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

from flatlm.experiments.paper import base_of  # noqa: E402
from sweeps.cli import apply_arguments  # noqa: E402
from sweeps.spec import Sweep  # noqa: E402


def _args(gpus, *overrides):
    return Namespace(overrides=list(overrides), name=None, cpus_per_trial=None,
                     gpus_per_trial=gpus, max_failures=None, kl_threshold=None)


@pytest.mark.parametrize("gpus, world_size", [(None, 1), (0.25, 1), (1, 1), (2, 2), (4.0, 4)])
def test_whole_gpus_above_one_set_the_world_size(gpus, world_size):
    sweep = apply_arguments(Sweep(name="t", base=base_of("sweep")), _args(gpus))
    assert sweep.base.train.world_size == world_size


@pytest.mark.parametrize("gpus, overrides, message", [
    (1.5, (), r"--gpus-per-trial 1\.5: above 1 use a whole number"),
    (2, ("train.world_size=4",), r"train\.world_size=4 with --gpus-per-trial 2"),
    (3, (), r"train\.world_size=3: .*sentences"),  # the tiny batch does not split in three
])
def test_gpus_that_cannot_be_ranks_are_refused(gpus, overrides, message):
    with pytest.raises(ValueError, match=message):
        apply_arguments(Sweep(name="t", base=base_of("sweep")), _args(gpus, *overrides))
