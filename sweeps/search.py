"""Optuna (through Ray Tune's searcher) over optimizer and regularisation settings, for one or
several objectives. No arguments: 4 CPU trials of the testbed's 2-layer model (the ``sweep``
scale) maximising the probe accuracy of the first task measured (``probe/<task>/acc_mean``;
``measure.tasks``, else the source's tasks).

    python sweeps/search.py --objective probe/B/acc_mean:max --objective flat/trace_fisher:min
    python sweeps/search.py --scale gpu --address auto --gpus-per-trial 0.5 --samples 64
"""

import sys

from flatlm.core.flags import COUNT
from sweeps.cli import main


def objective(text: str) -> tuple[str, str]:
    metric, _, mode = text.rpartition(":")
    if mode not in ("min", "max") or not metric:
        raise ValueError(f"--objective {text!r}: write METRIC:min or METRIC:max")
    return metric, mode


def add_arguments(p) -> None:
    p.add_argument("--objective", action="append", default=[],
                   help="METRIC:min|max, repeatable (default: probe/<task>/acc_mean:max of "
                        "the first task measured)")
    p.add_argument("--samples", type=COUNT,
                   help="trials to draw (default 4 on a CPU scale, 64 on gpu)")


def build(args):
    """The search experiment (``flatlm.experiments.paper.SEARCH_SPACE``) drawn by Optuna;
    imports here keep ``--help`` fast."""
    from flatlm.experiments.scales import scale
    from sweeps.experiment import experiment_of, scale_and_protocol, sweep_of

    objectives = tuple(objective(o) for o in args.objective)  # () = spec.objectives' default
    cpu = scale(scale_and_protocol(args)[0]).gpus == 0
    return sweep_of(experiment_of("search", args), "search", searcher="optuna",
                    objectives=objectives, num_samples=args.samples or (4 if cpu else 64),
                    max_concurrent=2 if cpu else 8, gpus_per_trial=0.0 if cpu else 0.5)


if __name__ == "__main__":
    sys.exit(main(build, __doc__, add_arguments))
