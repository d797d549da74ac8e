"""Model size at fixed data and algorithm (paper Fig. 3 / 5): larger models reach the same
pre-training loss but transfer better. No arguments: a 3-trial CPU sweep on a local Ray instance.

    python sweeps/scaling.py
    python sweeps/scaling.py --preset paper --address auto --gpus-per-trial 1
"""

import sys

from _cli import main


def build(args):
    """The sweep (``_spec.Sweep``); imports here keep ``--help`` fast."""
    from _rayenv import tune
    from _spec import Sweep
    from presets import base_for, models_for

    from flatlm.config import apply_overrides
    from flatlm.measure.grown import lcm_shape
    from flatlm.models.presets import shape_string

    models = models_for(args.preset)
    # Tr(F) of models of different sizes is compared in one parameterisation: each checkpoint is
    # also measured grown into the least common shape (flat/*_grown, paper Fig. 5, Table 4)
    grown = shape_string(lcm_shape(models))
    base = apply_overrides(base_for(args.preset), {"measure.grow_to": grown})
    return Sweep(name="scaling", base=base, space={"model": tune.grid_search(list(models))},
                 gpus_per_trial=0.0 if args.preset == "tiny" else 1.0)


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
