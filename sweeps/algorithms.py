"""Pre-training algorithms at the same loss (paper Tables 1 / 2): AdamW, SGD, SAM, no
regularisation and the adversarial objective, with the lookup table (the probe on the true
conditionals, ``lookup/<task>/acc_mean``; a row of Table 1 in the report) measured in every
trial. No arguments: 5 tiny CPU trials.

    python sweeps/algorithms.py
    python sweeps/algorithms.py --preset paper --address auto --gpus-per-trial 1
"""

import sys

from _cli import main

ALL = ["adamw", "sgd", "sam", "noreg", "adversarial"]


def build(args):
    """The sweep (``_spec.Sweep``); imports here keep ``--help`` fast."""
    from _rayenv import tune
    from _spec import Sweep
    from presets import base_for

    from flatlm.config import apply_overrides

    algorithms = ALL
    base = base_for(args.preset)
    if args.preset == "tiny":  # the adversary attacks the probed task, on a small pool
        base = apply_overrides(base, {"train.adversarial.task": "B", "train.adversarial.d1": 32,
                                      "train.adversarial.d2": 32, "train.adversarial.pool": 256})
    return Sweep(name="algorithms", base=base,
                 space={"train.algorithm": tune.grid_search(algorithms)},
                 gpus_per_trial=0.0 if args.preset == "tiny" else 1.0)


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
