"""Model size at fixed data and algorithm (paper Fig. 3 / 5: larger models, at the same
pre-training loss, transfer better and are flatter): the experiment ``sizes`` (``flatlm replicate
--experiment sizes``) as a Ray sweep named ``scaling``. The closing summary says how far apart
this sweep's losses are and compares the models at matched KL. No arguments: the testbed's
three BERTs (2 / 3 / 4 layers) on its grammar, one seed, on a local Ray instance (CPU, 8 min 19 s
on 2 cores, measured), 2000 steps of 256 sentences: near the saturated regime (the closing rule:
KL < 0.05; they end at 0.045 / 0.040 / 0.034), not in it (``--scale testbed``: 10000 steps, KL
<= 0.02; ``flatlm.experiments.scales.SWEEP``).

On an HMM (``--source hmm:...``) the grid is BiLSTMs (paper A.4: two tiny ones, or 9M-110M
under ``--scale gpu``), measured in their own shapes (growth, B.4, is for BERTs).

    python sweeps/scaling.py
    python sweeps/scaling.py --print-config   # each trial's config and each key's layer; stops
    python sweeps/scaling.py --source hmm:seed=0,vocab=50,states=20   # BiLSTMs on an HMM
    python sweeps/scaling.py --scale gpu --address auto --gpus-per-trial 1
"""

import sys

from sweeps.cli import main


def build(args):
    """The sizes experiment (``flatlm.experiments.paper``) as a Ray sweep; imports here keep
    ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    return sweep_of(experiment_of("sizes", args), "scaling")


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
