"""Pre-training algorithms at the same loss (paper Tables 1 / 2): AdamW, SAM, no regularisation
and the adversarial objective, with the lookup table (the probe on the true conditionals,
``lookup/<task>/acc_mean``; a row of Table 1 in the report) measured in every trial. Table 1
compares them at equal loss: each run's checkpoint closest to the lowest KL every run reached
(``analysis.checkpoints.loss_matched``), not at their last step; a run that never reaches the
saturation regime (the adversarial one, often) is named in the closing summary with its KL. The
summary reads the task the adversary attacks (``train.adversarial.task``: B, as Table 1). No
arguments: 4 CPU trials of the testbed's 2-layer model on its grammar, 2000 steps, one seed (6 min
13 s on 2 cores, measured; every run ends at KL 0.036-0.045, near saturation, not in it).

SGD is not in the default grid: at the shared learning rate it stays far from the others' loss
and would set the common loss for everyone; run it with its own rate
(``--algorithms sgd --set train.lr=0.3``), or ``sweeps/replicate.py`` (its ``sgd`` experiment).

    python sweeps/algorithms.py
    python sweeps/algorithms.py --algorithms adamw,noreg --set train.lr=2.5e-3 --name lr2.5e-3
    python sweeps/algorithms.py --scale gpu --address auto --gpus-per-trial 1
"""

import sys

from flatlm.experiments.grids import COMPARED_ALGORITHMS
from flatlm.train.config import ALGORITHMS
from sweeps.cli import main


def add_arguments(p) -> None:
    p.add_argument("--algorithms", default=",".join(COMPARED_ALGORITHMS),
                   help=f"comma-separated, from adamw, sgd, sam, noreg, adversarial "
                        f"(default {','.join(COMPARED_ALGORITHMS)})")


def build(args):
    """The algorithms experiment (``flatlm.experiments.paper``) as a Ray sweep; imports here keep
    ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown or not algorithms:
        raise ValueError(f"--algorithms {args.algorithms!r}: use a comma-separated list of "
                         f"{', '.join(ALGORITHMS)}")
    return sweep_of(experiment_of("algorithms", args, algorithms=tuple(algorithms)),
                    "algorithms")


if __name__ == "__main__":
    sys.exit(main(build, __doc__, add_arguments))
