"""``flatlm replicate``: the paper's experiments on one host, without Ray or MLflow.

    flatlm replicate --out repl/                                   # every experiment, tiny, CPU
    flatlm replicate --experiment steps,sizes --protocol paper,paper-code --out repl/
    flatlm replicate --scale gpu --device cuda --minutes 9 --out repl/   # call again to go on
    flatlm replicate --diagnose --experiment steps,sizes --out repl/     # one switch at a time
    python analysis/replication.py --trials repl/ --out repl/report/     # the verdicts

Trials go to ``OUT/<protocol>/<experiment>/<trial>/`` and share their evaluation data in
``OUT/eval_cache/``. Running the same command again resumes: finished trials are skipped and an
interrupted one continues from its newest checkpoint. ``--minutes`` stops after the checkpoint
during which the budget ran out (exit status 4: call again to continue). A trial whose settings
changed since it started is an error, before any work.

Exit status: 0 all done; 2 bad input; 4 the time budget ran out first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from flatlm.core.config import parse_assignments
from flatlm.core.devices import resolve_device
from flatlm.experiments.paper import EXPERIMENTS, build
from flatlm.experiments.protocols import describe, diagnosis_protocols
from flatlm.experiments.scales import SCALES

OUT_OF_TIME_EXIT = 4


def register(subparsers) -> None:
    p = subparsers.add_parser("replicate", help="run the paper's experiments (no Ray)",
                              description=__doc__.split("\n\n")[0],
                              epilog=__doc__.split("\n\n", 1)[1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, type=Path, help="root of the trial directories")
    add_selection_arguments(p)
    p.add_argument("--minutes", type=float, default=None,
                   help="time budget; stops after the checkpoint that exceeds it (exit 4)")
    p.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:i (default: cpu)")
    p.add_argument("--dry-run", action="store_true", help="list the trials and stop")
    p.set_defaults(run=run)


def add_selection_arguments(p) -> None:
    """The options that choose the experiments (shared with ``sweeps/replicate.py``)."""
    p.add_argument("--experiment", default="all",
                   help=f"comma-separated, of {', '.join(EXPERIMENTS)} (default: all)")
    p.add_argument("--protocol", default="paper,paper-code",
                   help="comma-separated protocols: paper, paper-code, or a base with +switches "
                        "(paper+inside-labels); default: paper,paper-code")
    p.add_argument("--diagnose", action="store_true",
                   help="instead of --protocol: paper and paper with each switch alone")
    p.add_argument("--scale", default="tiny", choices=sorted(SCALES),
                   help="tiny: CPU minutes; testbed: a CPU scale where the models saturate"
                        "; gpu: the paper's sizes (default: tiny)")
    p.add_argument("--seeds", type=int, default=None,
                   help="training seeds per grid point (default: the scale's: "
                        + ", ".join(f"{s.name} {len(s.seeds)}" for s in SCALES.values()) + ")")
    p.add_argument("--models", default=None,
                   help="comma-separated models of the sizes experiment, smallest first "
                        "(default: the scale's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any trial config key for every trial, e.g. train.steps=600")


def experiments_from_args(args) -> list:
    """Every (protocol, experiment) the options name, built and checked before any work."""
    names = list(EXPERIMENTS) if args.experiment == "all" else args.experiment.split(",")
    protocols = diagnosis_protocols() if args.diagnose else args.protocol.split(",")
    seeds = None if args.seeds is None else tuple(range(args.seeds))
    if seeds == ():
        raise ValueError("--seeds must be >= 1")
    overrides = parse_assignments(args.overrides)
    models = None if args.models is None else tuple(args.models.split(","))
    return [build(name, scale=args.scale, protocol=protocol, seeds=seeds, models=models,
                  overrides=overrides)
            for protocol in protocols for name in names]


def run(args) -> int:
    from flatlm.experiments.runner import Budget, run_experiment

    device = str(resolve_device(args.device))
    experiments = experiments_from_args(args)
    for protocol in dict.fromkeys(exp.protocol for exp in experiments):
        print(f"{protocol}: {describe(protocol)}")
        for exp in (e for e in experiments if e.protocol == protocol):
            print(f"  {exp.name}: {len(exp.trials())} trials")
    if args.dry_run:
        for exp in experiments:
            for name, _ in exp.trials():
                print(f"  {exp.protocol}/{exp.name}/{name}")
        return 0
    budget = Budget(None if args.minutes is None else 60 * args.minutes)
    start = time.monotonic()
    for exp in experiments:
        def tell(name, state, exp=exp):
            print(f"[{(time.monotonic() - start) / 60:5.1f} min] {exp.protocol}/{exp.name}/"
                  f"{name}: {state}", flush=True)
        if not run_experiment(exp, args.out, device=device, budget=budget, on_trial=tell):
            print(f"time budget of {args.minutes} min spent; run the same command again to "
                  "continue", file=sys.stderr)
            return OUT_OF_TIME_EXIT
    print(f"all trials done under {args.out}; the report: python analysis/replication.py "
          f"--trials {args.out} --out {args.out / 'report'}")
    return 0
