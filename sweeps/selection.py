"""Does flatness pick better models than the pre-training loss does (paper App. D)? Trains runs
that differ in algorithm and seed into the saturation regime, then ranks every checkpoint there
by each flatness measure and by the loss, and reports, with cluster-bootstrap intervals over
runs, how well each ranking predicts downstream accuracy: Spearman / Kendall, the top-1 regret
(accuracy lost by picking the flattest instead of the best) and its gain over picking by the loss
(``analysis/selection.py``). The flatness measures compared: Tr(F), Tr(H) (population and
one-hot labels), the top eigenvalues of H and F and adaptive sharpness (worst case l_inf / l_2
and average). No arguments: adamw, sam and noreg x 2 seeds of one tiny model on CPU (6 trials);
more seeds give tighter intervals.

    python sweeps/selection.py
    python sweeps/selection.py --seeds 5 --algorithms adamw,sam,noreg --lrs 5e-3,2.5e-3
    python sweeps/selection.py --preset paper --address auto --gpus-per-trial 1
    python analysis/selection.py --experiment selection --kl-threshold 0.05 --out sel/
"""

import sys

from sweeps.cli import main

ALGORITHMS = "adamw,sam,noreg"
SELECTION_WHAT = ("eigen", "sharpness")  # measured beside the preset's loss, Tr(F), Tr(H)


def add_arguments(p) -> None:
    p.add_argument("--algorithms", default=ALGORITHMS,
                   help=f"comma-separated train.algorithm values (default {ALGORITHMS})")
    p.add_argument("--seeds", type=int, default=2, help="training seeds per algorithm (>= 1)")
    p.add_argument("--lrs", default=None,
                   help="comma-separated learning rates to vary too (default: the preset's)")


def _floats(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: use comma-separated numbers, e.g. 5e-3,2.5e-3")\
            from None


def build(args):
    """The sweep (``sweeps.spec.Sweep``); imports here keep ``--help`` fast."""
    from flatlm.core.config import apply_overrides
    from flatlm.experiments.presets import TINY_KL_THRESHOLD, base_for
    from flatlm.train.config import ALGORITHMS as KNOWN
    from sweeps.rayenv import tune
    from sweeps.spec import Sweep

    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms or any(a not in KNOWN for a in algorithms):
        raise ValueError(f"--algorithms {args.algorithms!r}: use a comma-separated list of "
                         f"{', '.join(KNOWN)}")
    if args.seeds < 1:
        raise ValueError(f"--seeds {args.seeds}: use at least 1")
    space = {"train.algorithm": tune.grid_search(algorithms),
             "train.seed": tune.grid_search(list(range(args.seeds)))}
    if args.lrs:
        space["train.lr"] = tune.grid_search(_floats(args.lrs, "--lrs"))
    tiny = args.preset == "tiny"
    base = base_for(args.preset, getattr(args, "source", None))  # --source (sweeps.cli.main)
    # several notions of flatness compete: the traces, the top eigenvalues, adaptive sharpness
    what = [*base.measure.what, *(w for w in SELECTION_WHAT if w not in base.measure.what)]
    base = apply_overrides(base, {"measure.what": what})
    return Sweep(name="selection", base=base, space=space, selection=True,
                 gpus_per_trial=0.0 if tiny else 1.0,
                 **({"kl_threshold": TINY_KL_THRESHOLD} if tiny else {}))


if __name__ == "__main__":
    sys.exit(main(build, __doc__, add_arguments))
