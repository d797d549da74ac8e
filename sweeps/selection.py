"""Does flatness pick better models than the pre-training loss does (paper App. D)? Trains runs
that differ in algorithm and seed into the saturation regime, then ranks every checkpoint there
by each flatness measure and by the loss, and reports, with cluster-bootstrap intervals over
runs, how well each ranking predicts downstream accuracy: Spearman / Kendall, the top-1 regret
(accuracy lost by picking the flattest instead of the best) and its gain over picking by the loss
(``analysis/selection.py``). The flatness measures compared: Tr(F), Tr(H) (population and
one-hot labels), the top eigenvalues of H and F and adaptive sharpness (worst case l_inf / l_2
and average). No arguments: adamw, sam and noreg x 2 seeds of the testbed's 2-layer model on
CPU (6 trials, the ``sweep`` scale); more seeds give tighter intervals.

    python sweeps/selection.py
    python sweeps/selection.py --seeds 5 --algorithms adamw,sam,noreg --lrs 5e-3,2.5e-3
    python sweeps/selection.py --scale gpu --address auto --gpus-per-trial 1
    python analysis/selection.py --experiment selection --kl-threshold 0.05 --out sel/
"""

import sys
from dataclasses import replace

from flatlm.core.flags import COUNT
from flatlm.experiments.grids import SELECTION_ALGORITHMS
from flatlm.train.config import ALGORITHMS
from sweeps.cli import main


def add_arguments(p) -> None:
    default = ",".join(SELECTION_ALGORITHMS)
    p.add_argument("--algorithms", default=default,
                   help=f"comma-separated train.algorithm values (default {default})")
    p.add_argument("--seeds", type=COUNT, default=2, help="training seeds per algorithm (>= 1)")
    p.add_argument("--lrs", default=None,
                   help="comma-separated learning rates to vary too (default: the scale's)")


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: use comma-separated numbers, e.g. 5e-3,2.5e-3")\
            from None


def build(args):
    """The selection experiment (``flatlm.experiments.paper``) as a Ray sweep; imports here keep
    ``--help`` fast."""
    from sweeps.experiment import experiment_of, sweep_of

    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms or any(a not in ALGORITHMS for a in algorithms):
        raise ValueError(f"--algorithms {args.algorithms!r}: use a comma-separated list of "
                         f"{', '.join(ALGORITHMS)}")
    exp = experiment_of("selection", args, algorithms=tuple(algorithms),
                        seeds=tuple(range(args.seeds)))
    if args.lrs:  # the learning rate varied too: a grid dimension of the sweep's own
        exp = replace(exp, grid={**exp.grid, "train.lr": _floats(args.lrs, "--lrs")})
    return sweep_of(exp, "selection", selection=True)


if __name__ == "__main__":
    sys.exit(main(build, __doc__, add_arguments))
