"""Model size at fixed data and algorithm (paper Fig. 3 / 5): larger models reach the same
pre-training loss but transfer better. No arguments: a 3-trial CPU sweep on a local Ray instance.

    python sweeps/scaling.py
    python sweeps/scaling.py --preset paper --address auto --gpus-per-trial 1
"""

import sys

from _cli import main
from _rayenv import tune
from _spec import Sweep
from presets import PAPER_MODELS, TINY_MODELS, base_for


def build(args) -> Sweep:
    models = TINY_MODELS if args.preset == "tiny" else PAPER_MODELS
    return Sweep(name="scaling", base=base_for(args.preset),
                 space={"model": tune.grid_search(list(models))},
                 gpus_per_trial=0.0 if args.preset == "tiny" else 1.0)


if __name__ == "__main__":
    sys.exit(main(build, __doc__.splitlines()[0]))
