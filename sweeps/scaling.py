"""Model size at fixed data and algorithm (paper Fig. 3 / 5: larger models, at the same
pre-training loss, transfer better and are flatter). The closing summary says how far apart
this sweep's losses are and compares the models at matched KL. No arguments: 3 tiny models on
a small PCFG on a local Ray instance (CPU, about 5 minutes on 2 cores), trained into the
saturated regime (the closing rule: KL < 0.05; at the paper's constant rate the smallest model
ends at KL 0.044 +- 0.002, measured; under a linear decay the three ended at 0.032 / 0.019 /
0.009 nats, ``flatlm.experiments.scales``).

On an HMM (``--source hmm:...``) the grid is BiLSTMs (paper A.4: two tiny ones, or 9M-110M
under ``--preset paper``), measured in their own shapes (growth, B.4, is for BERTs).

    python sweeps/scaling.py
    python sweeps/scaling.py --source hmm:seed=0,vocab=50,states=20   # BiLSTMs on an HMM
    python sweeps/scaling.py --preset paper --address auto --gpus-per-trial 1
"""

import sys

from sweeps.cli import main


def build(args):
    """The sizes experiment (``flatlm.experiments.paper``) as a Ray sweep; imports here keep
    ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    return sweep_of(experiment_of("sizes", args), "scaling", args)


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
