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
    """The sweep (``sweeps.spec.Sweep``); imports here keep ``--help`` fast."""
    from flatlm.core.config import apply_overrides
    from flatlm.experiments.presets import TINY_KL_THRESHOLD, base_for
    from sweeps.rayenv import tune
    from sweeps.spec import Sweep

    if args.preset == "tiny":
        steps, every = 4500, 500
    else:
        steps, every = 200_000, 10_000
    base = apply_overrides(base_for(args.preset, getattr(args, "source", None)), {
        "train.steps": steps, "train.checkpoint_steps": list(range(every, steps + 1, every))})
    tiny = args.preset == "tiny"
    return Sweep(name="steps", base=base, space={"train.seed": tune.grid_search([0, 1, 2])},
                 gpus_per_trial=0.0 if tiny else 1.0,
                 **({"kl_threshold": TINY_KL_THRESHOLD} if tiny else {}))


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
