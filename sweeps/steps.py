"""Long runs checkpointed densely past convergence (paper Fig. 2 / 4): the loss stops moving but
flatness and downstream accuracy keep changing. No arguments: 3 seeds of one tiny model on CPU.

    python sweeps/steps.py
    python sweeps/steps.py --preset paper --address auto --gpus-per-trial 1
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _tune import Sweep, main, tune  # noqa: E402
from presets import base_for  # noqa: E402

from flatlm.config import apply_overrides  # noqa: E402


def build(args) -> Sweep:
    if args.preset == "tiny":
        steps, every = 300, 50
    else:
        steps, every = 200_000, 10_000
    base = apply_overrides(base_for(args.preset), {
        "train.steps": steps, "train.checkpoint_steps": list(range(every, steps + 1, every))})
    return Sweep(name="steps", base=base, space={"train.seed": tune.grid_search([0, 1, 2])},
                 gpus_per_trial=0.0 if args.preset == "tiny" else 1.0)


if __name__ == "__main__":
    sys.exit(main(build, __doc__.splitlines()[0]))
