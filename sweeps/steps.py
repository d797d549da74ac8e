"""Long runs checkpointed densely past convergence (paper Fig. 2 / 4): the loss stops moving but
flatness and downstream accuracy keep changing. No arguments: 3 seeds of one tiny model on CPU
(about 8 minutes on 2 cores), 4500 steps checkpointed every 500: KL falls below 0.05 nats by
step 2000, then the run goes on for 2500 more.

    python sweeps/steps.py
    python sweeps/steps.py --preset paper --address auto --gpus-per-trial 1
"""

import sys

from sweeps.cli import main


def build(args):
    """The steps experiment (``flatlm.experiments.paper``), three seeds, as a Ray sweep; imports
    here keep ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    return sweep_of(experiment_of("steps", args, seeds=(0, 1, 2)), "steps", args)


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
