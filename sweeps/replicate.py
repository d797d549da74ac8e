"""The paper's experiments as Ray Tune sweeps logged to MLflow, then the replication report.
No arguments: every experiment under the paper's protocol at the CPU sweeps' scale, on a local
Ray instance (the defaults of ``flatlm replicate``).

    python sweeps/replicate.py --protocol paper,paper-code        # both protocols
    python sweeps/replicate.py --experiment steps,sizes --diagnose      # one switch at a time
    python sweeps/replicate.py --experiment steps --print-config  # each trial's config, no Ray
    python sweeps/replicate.py --scale gpu --address auto --gpus-per-trial 1 \\
        --tracking-uri http://127.0.0.1:5000

Each (protocol, experiment) is one sweep and one MLflow experiment named
``replicate.<protocol>.<experiment>``; the trials are those of ``flatlm replicate`` (the same
configs, ``flatlm.experiments``). The report (``analysis/replication.py``) goes to
``WORKDIR/report/replication/`` and to MLflow (experiment ``replication``).
"""

import argparse
import os
import shlex
import sys
from pathlib import Path

from analysis import replication
from flatlm.commands.config import trial_config_lines
from flatlm.commands.replicate import add_selection_arguments, experiments_from_args, trial_layers
from flatlm.core.registry import load_command_plugins
from flatlm.experiments.scales import scale
from flatlm.tracking.tracker import default_tracking_uri
from sweeps.cli import apply_arguments, interrupted, parser
from sweeps.driver import run_sweep
from sweeps.experiment import grid_space
from sweeps.signals import Interrupted
from sweeps.spec import Sweep, shown_metrics

REPO = Path(__file__).resolve().parents[1]
PREFIX = "replicate"


def sweep_name(protocol: str, experiment: str) -> str:
    return f"{PREFIX}.{protocol}.{experiment}"


def build_sweeps(args: argparse.Namespace) -> list[Sweep]:
    """One sweep per (protocol, experiment), with the command line's resource flags."""
    gpus = scale(args.scale).gpus
    sweeps = []
    for exp in experiments_from_args(args):
        sweep = Sweep(name=sweep_name(exp.protocol, exp.name), base=exp.base,
                      space=grid_space(exp),
                      gpus_per_trial=gpus)
        # --set is already in the experiments (applied before their grids): resources only
        resources = argparse.Namespace(**{**vars(args), "overrides": []})
        sweeps.append(apply_arguments(sweep, resources))
    return sweeps


def main(argv=None) -> int:
    try:  # before the parser: --scale and --experiment may name a plug-in's
        load_command_plugins(sys.argv[1:] if argv is None else argv, os.environ)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    p = parser(__doc__, trial_options=False)
    add_selection_arguments(p)
    args = p.parse_args(argv)
    if args.verbose:  # read by the trials (local Ray workers inherit the environment)
        os.environ["FLATLM_VERBOSE"] = "1"
    workdir = Path(args.workdir).absolute()
    try:
        if args.print_config:  # the same trials as flatlm replicate's, so the same layers
            print("\n".join(trial_config_lines(trial_layers(args, experiments_from_args(args)))))
            return 0
        sweeps = build_sweeps(args)
        for sweep in sweeps:
            print(f"== {sweep.name}", flush=True)
            run_sweep(sweep, workdir=workdir, tracking_uri=args.tracking_uri,
                      address=args.address, resume=args.resume, show=shown_metrics(sweep),
                      trust_state=args.trust_state)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        return interrupted(e)
    return write_report(sweeps, workdir, args.tracking_uri)


def write_report(sweeps: list[Sweep], workdir: Path, tracking_uri: str | None) -> int:

    uri = tracking_uri or default_tracking_uri(workdir)
    return replication.main(["--experiments", ",".join(s.name for s in sweeps),
                             "--tracking-uri", uri,
                             "--out", str(workdir / "report" / "replication"),
                             "--command", shlex.join(["python", "sweeps/replicate.py",
                                                      *sys.argv[1:]])])


if __name__ == "__main__":
    sys.exit(main())
