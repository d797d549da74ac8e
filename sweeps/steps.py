"""Long runs checkpointed densely past convergence (paper Fig. 2 / 4): the loss stops moving but
flatness and downstream accuracy keep changing. No arguments: one seed of the testbed's smallest
model (d64-h4-l2-i256) on its grammar, on CPU (4 min 15 s on 2 cores, measured), 3000 steps
checkpointed every 500 from step 0 at the paper's constant rate: KL falls below 0.05 nats by step
1500 (0.047), then the run goes on to 0.034 at step 3000, still falling: the summary says so.
``--scale testbed`` runs it where the models saturate (10000 steps, KL <= 0.02), ``flatlm
replicate --scale testbed --experiment steps`` with 5 seeds.

    python sweeps/steps.py
    python sweeps/steps.py --scale gpu --address auto --gpus-per-trial 1
"""

import sys

from sweeps.cli import main


def build(args):
    """The steps experiment (``flatlm.experiments.paper``), the scale's seeds, as a Ray sweep;
    imports here keep ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    return sweep_of(experiment_of("steps", args), "steps")


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
