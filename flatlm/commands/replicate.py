"""``flatlm replicate``: the paper's experiments on one host, without Ray or MLflow.

    flatlm replicate --out repl/                                   # every experiment, CPU
    flatlm replicate --experiment steps,sizes --protocol paper,paper-code --out repl/
    flatlm replicate --scale gpu --device cuda --minutes 9 --out repl/   # call again to go on
    flatlm replicate --diagnose --experiment steps,sizes --out repl/     # one switch at a time
    flatlm replicate --experiment steps --print-config --out repl/  # each trial's config, stop
    flatlm replicate --experiment algorithms --pack 4 --out repl/  # 4 trials as one model
    python analysis/replication.py --trials repl/ --out repl/report/     # the verdicts

``--pack K`` trains up to K trials of one shape together as one model, each measured and
recorded as it would be alone (``flatlm.runs.pack``); default 1 on a CPU, 16 on CUDA.

Trials go to ``OUT/<protocol>/<experiment>/<trial>/`` and share their evaluation data in
``OUT/eval_cache/``. Running the same command again resumes: finished trials are skipped and an
interrupted one continues from its newest checkpoint. ``--minutes`` stops after the checkpoint
during which the budget ran out (exit status 4: call again to continue). A trial whose settings
changed since it started is an error, before any work.

Exit status: 0 all done; 2 bad input; 3 a trial diverged (recorded in its ``diverged.json``,
reported, skipped on reruns; the other trials ran); 4 the time budget ran out first; 5 a
checkpoint could not be written (a full disk); 6 a worker of --jobs was killed (its trial
resumes on a rerun); 7 trials left that another process holds.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from flatlm.commands import (
    DEFAULT_DEVICE,
    DEFAULT_PROTOCOL,
    DEFAULT_SCALE,
    DIVERGED_EXIT,
    WORKER_DIED_EXIT,
    add_command,
)
from flatlm.commands.config import trial_config_lines
from flatlm.core.config import parse_assignments
from flatlm.core.devices import resolve_device
from flatlm.core.flags import COUNT, POSITIVE
from flatlm.core.safe_io import check_output_dir
from flatlm.experiments.costs import experiment_minutes
from flatlm.experiments.layers import base_layers, grid_layers
from flatlm.experiments.paper import EXPERIMENT_BUILDERS, EXPERIMENTS, build
from flatlm.experiments.protocols import describe, diagnosis_protocols
from flatlm.experiments.runner import DIVERGED
from flatlm.experiments.scales import SCALES
from flatlm.runs.console import Console
from flatlm.runs.pack import check_pack_request
from flatlm.runs.pack_size import DEFAULT_RULE, PACK_SIZE, default_pack_size
from flatlm.storage.diverged import divergence
from flatlm.storage.metrics_log import METRICS_FILE, read_metrics
from flatlm.train.config import ALGORITHMS  # every registered algorithm

OUT_OF_TIME_EXIT = 4
BUSY_EXIT = 7  # trials left that another process holds (not 5: flatlm.cli's full disk)
LOG_PROGRESS = "FLATLM_LOG_PROGRESS"  # set for the workers of --jobs: progress as lines
# A worker's environment: one thread for torch's and numpy's kernels (OpenBLAS and MKL read these
# at import); a rerun of a trial (bench/selection_v2.py) uses the same.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def register(subparsers) -> None:
    p = add_command(subparsers, "replicate", __doc__)
    p.add_argument("--out", required=True, type=Path, help="root of the trial directories")
    add_selection_arguments(p)
    p.add_argument("--minutes", type=POSITIVE, default=None,
                   help="time budget; stops after the checkpoint that exceeds it (exit 4)")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help=f"auto, cpu, cuda or cuda:i (default: {DEFAULT_DEVICE})")
    p.add_argument("--jobs", type=COUNT, default=1,
                   help="worker processes sharing the trials, one torch thread each on a "
                        "CPU (default: 1)")
    p.add_argument("--pack", type=PACK_SIZE, default=None, metavar="K",
                   help="train up to K trials of one shape together as one model (flatlm.runs"
                        f".pack; 1: each alone); {DEFAULT_RULE}")
    p.add_argument("--dry-run", action="store_true", help="list the trials and stop")
    p.add_argument("--print-config", action="store_true",
                   help="print every trial's resolved config, each key with the layer that set "
                        "it (as flatlm config), and stop")
    p.set_defaults(run=run)


def add_selection_arguments(p) -> None:
    """The options that choose the experiments (shared with ``sweeps/replicate.py``)."""
    p.add_argument("--experiment", default="all",
                   help="comma-separated registered experiments: "
                        f"{', '.join(EXPERIMENT_BUILDERS)} (a plug-in's too, by --plugin; a "
                        "search needs a searcher: python sweeps/search.py); default: all = "
                        f"{','.join(EXPERIMENTS)}, the paper's")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL,
                   help="comma-separated protocols: paper, paper-code, or a base with +switches "
                        f"(paper+inside-labels); default: {DEFAULT_PROTOCOL} (both: "
                        "paper,paper-code)")
    p.add_argument("--diagnose", action="store_true",
                   help="instead of --protocol: paper and paper with each switch alone")
    p.add_argument("--scale", default=DEFAULT_SCALE, choices=sorted(SCALES),
                   help=f"sweep: the CPU sweeps' (default {DEFAULT_SCALE}); tiny: CPU minutes; "
                        "testbed: a CPU scale where the models saturate; gpu: the paper's sizes")
    p.add_argument("--seeds", type=COUNT, default=None,
                   help="training seeds per grid point (default: the scale's: "
                        + ", ".join(f"{s.name} {_default_seeds(s)}" for s in SCALES.values())
                        + ")")
    p.add_argument("--models", default=None,
                   help="comma-separated models of the sizes experiment, smallest first "
                        "(default: the scale's)")
    p.add_argument("--algorithms", default=None,
                   help="comma-separated algorithms of the algorithms and selection grids "
                        f"(default: theirs), of {', '.join(ALGORITHMS)}")
    p.add_argument("--without-selection-measures", action="store_true",
                   help="only the protocol's measurements: not the scale's selection measures "
                        "(testbed: eigen, sharpness, precond, critical, noise, llc, cka_truth, "
                        "for the leaderboard), about a quarter of a testbed trial's time")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any trial config key for every trial, e.g. train.steps=600")


def _default_seeds(sc) -> str:
    per = ", ".join(f"{n} for {e}" for e, n in sc.replication_seeds.items())
    return f"({per})" if per else str(len(sc.seeds))


def experiments_from_args(args) -> list:
    """Every (protocol, experiment) the options name, built and checked before any work."""
    names = list(EXPERIMENTS) if args.experiment == "all" else args.experiment.split(",")
    for name in names:
        if name not in EXPERIMENT_BUILDERS:
            raise ValueError(f"--experiment {name!r}: use one of the registered experiments, "
                             f"{', '.join(EXPERIMENT_BUILDERS)} (add one with "
                             f"{EXPERIMENT_BUILDERS.how_to_add})")
    algorithms = None if args.algorithms is None else tuple(args.algorithms.split(","))
    for algorithm in algorithms or ():
        if algorithm not in ALGORITHMS:
            raise ValueError(f"--algorithms {algorithm!r}: use one of {', '.join(ALGORITHMS)}")
    protocols = diagnosis_protocols() if args.diagnose else args.protocol.split(",")
    overrides = parse_assignments(args.overrides)
    models = None if args.models is None else tuple(args.models.split(","))
    experiments = [build(name, scale=args.scale, protocol=protocol, seeds=_seeds(args, name),
                         models=models, algorithms=algorithms, overrides=overrides,
                         selection_measures=not args.without_selection_measures)
                   for protocol in protocols for name in names]
    for exp in experiments:
        if exp.space:  # its trials are drawn, not listed: a grid alone would run the base
            raise ValueError(f"--experiment {exp.name!r} is a search ({', '.join(exp.space)} "
                             "drawn by a searcher): run it with python sweeps/search.py")
    return experiments


def trial_layers(args, experiments) -> list[tuple[str, list]]:
    """(``protocol/experiment/trial``, its layers) of every trial of ``experiments`` (built from
    ``args``): the experiment's base without ``--set`` (built again without it), ``--set``, then
    the grid point (``flatlm.experiments.layers``)."""
    bare = experiments_from_args(argparse.Namespace(**{**vars(args), "overrides": []}))
    out = []
    for exp, plain in zip(experiments, bare, strict=True):
        head = [*base_layers(exp.scale, exp.protocol), (f"experiment {exp.name}", plain.base)]
        trials = exp.trials()
        out += [(f"{exp.protocol}/{exp.name}/{name}", layers) for (name, _), layers in
                zip(trials, grid_layers(head, exp.base, trials), strict=True)]
    return out


def _seeds(args, experiment: str) -> tuple[int, ...] | None:
    """--seeds, else the scale's replication seeds of ``experiment``, else None (its seeds)."""
    if args.seeds is not None:
        return tuple(range(args.seeds))
    return SCALES[args.scale].seeds_of(experiment)


def run(args) -> int:
    device = str(resolve_device(args.device))
    experiments = experiments_from_args(args)
    if args.print_config:
        print("\n".join(trial_config_lines(trial_layers(args, experiments))))
        return 0
    if args.pack is not None:  # a K given: checked against every trial before any work
        check_pack_request([cfg for exp in experiments for _, cfg in exp.trials()], args.pack)
    args.pack = default_pack_size(device) if args.pack is None else args.pack
    done = finished_under(args.out, experiments)
    for protocol in dict.fromkeys(exp.protocol for exp in experiments):
        print(f"{protocol}: {describe(protocol)}")
        for exp in (e for e in experiments if e.protocol == protocol):
            left = [t for t in exp.trials() if (exp.protocol, exp.name, t[0]) not in done]
            print(f"  {exp.name}: {len(exp.trials())} trials{finished_words(exp, left)}"
                  f"{cost_words(left) if left else ''}")
    print(total_cost_words(experiments, done))
    if args.dry_run:
        for exp in experiments:
            for name, _ in exp.trials():
                print(f"  {exp.protocol}/{exp.name}/{name}")
        return 0
    args.out = check_output_dir(args.out)  # a link or a file: refused before any trial
    code = run_workers(args) if args.jobs > 1 else _run_here(args, experiments, device)
    if code == 0:
        print(f"all trials done under {args.out}; the report: python analysis/replication.py "
              f"--trials {args.out} --out {args.out / 'report'}")
    return code


def finished_under(out: Path, experiments) -> set[tuple[str, str, str]]:
    """(protocol, experiment, trial) of the trials whose records under ``out`` are complete:
    their last checkpoint measured, or a divergence recorded. A run skips them (it resumes each,
    and a complete one has nothing left), so the plan's minutes leave them out."""
    done = set()
    for exp in experiments:
        for name, cfg in exp.trials():
            trial = Path(out) / exp.protocol / exp.name / name
            if divergence(trial) is not None or (
                    (trial / METRICS_FILE).is_file()
                    and max(cfg.train.checkpoint_steps, default=0) in read_metrics(trial)):
                done.add((exp.protocol, exp.name, name))
    return done


def finished_words(exp, left) -> str:
    finished = len(exp.trials()) - len(left)
    if not finished:
        return ""
    return ", all done under --out" if not left else \
        f", {finished} done under --out, {len(left)} left"


def cost_words(trials) -> str:
    """``, about 120 CPU-min (measured)`` and the GPU's where the committed benchmarks have
    it (``flatlm.experiments.costs``); what is not known is said, not guessed."""
    cpu, how, unknown = experiment_minutes(trials, "cpu")
    if unknown == len(trials):
        return ", CPU time unknown (no committed benchmark of these models)"
    words = f", about {cpu:.0f} CPU-min ({how}{f'; {unknown} unknown' if unknown else ''})"
    gpu, gpu_how, gpu_unknown = experiment_minutes(trials, "gpu")
    if gpu_unknown == 0:  # a sum over some of the trials would read as the whole
        words += f", {gpu:.0f} GPU-process-min ({gpu_how}; 15 processes sharing one H200)"
    return words


def total_cost_words(experiments, done: set = frozenset()) -> str:
    """The whole selection's CPU-minutes and its wall time on 2, 8 and 16 cores (one torch
    thread a trial, as ``--jobs`` runs them), the trials ``done`` already left out."""
    every = [t for exp in experiments for t in exp.trials()]
    trials = [t for exp in experiments for t in exp.trials()
              if (exp.protocol, exp.name, t[0]) not in done]
    if not trials:
        return (f"in all: {len(every)} trials, every one done under --out: nothing left to run "
                "(the report reads them)")
    cpu, how, unknown = experiment_minutes(trials, "cpu")
    longest = max((experiment_minutes([t], "cpu")[0] for t in trials), default=0.0)
    walls = ", ".join(f"{max(cpu / cores, longest):.0f} min on {cores} cores"
                      for cores in (2, 8, 16))
    left = f"; {unknown} trial(s) without an estimate" if unknown else ""
    skipped = f" ({len(every) - len(trials)} done under --out), {len(trials)} left" \
        if len(trials) < len(every) else ""
    return (f"in all: {len(every)} trials{skipped}, about {cpu:.0f} CPU-minutes ({how}{left}): "
            f"{walls} (--jobs N; estimates from flatlm/experiments/data/trial_costs.json, the "
            "committed trials' own timings, python bench/trial_costs.py)")


def _run_here(args, experiments, device: str) -> int:
    threads = torch.get_num_threads()
    if device == "cpu":  # as a worker of --jobs runs (ONE_THREAD): one record, one rerun
        torch.set_num_threads(1)
    try:
        return _run_experiments(args, experiments, device)
    finally:
        torch.set_num_threads(threads)


def _run_experiments(args, experiments, device: str) -> int:
    from flatlm.experiments.runner import Budget, run_experiment

    budget = Budget(None if args.minutes is None else 60 * args.minutes)
    start = time.monotonic()
    done, diverged = True, []
    order = [(exp.protocol, exp.name, name) for exp in experiments for name, _ in exp.trials()]
    # a worker of --jobs shares its terminal with the others: lines, not a redrawn one
    console = Console(n_trials=len(order), tty=False if os.environ.get(LOG_PROGRESS) else None)
    for exp in experiments:
        def tell(name, state, exp=exp):
            console.say(f"[{(time.monotonic() - start) / 60:5.1f} min] {exp.protocol}/"
                        f"{exp.name}/{name}: {state}")
            if state.startswith(DIVERGED):
                diverged.append(f"{exp.protocol}/{exp.name}/{name}")

        def progress_of(name, exp=exp):  # trial n of N over every experiment of the command
            console.trial = order.index((exp.protocol, exp.name, name)) + 1
            return console.show
        with console.ticking():
            done = run_experiment(exp, args.out, device=device, budget=budget,
                                  on_trial=tell, on_progress=progress_of,
                                  pack=args.pack) and done
        if budget.spent():
            print(f"time budget of {args.minutes} min spent; run the same command again to "
                  "continue", file=sys.stderr)
            return OUT_OF_TIME_EXIT
    if diverged:  # every other trial ran; these are recorded and skipped on reruns
        print(f"{len(diverged)} trial(s) diverged: {', '.join(diverged)}", file=sys.stderr)
        return DIVERGED_EXIT
    return 0 if done else BUSY_EXIT


def run_workers(args) -> int:
    """``args.jobs`` copies of this command, each with ``--jobs 1`` and one torch thread (as
    ``--jobs 1`` runs on a CPU: the kernels' reduction order follows the thread count, so a trial
    recorded on one thread reruns bit for bit on one, ``bench/rerun_trial.py``'s default): a
    worker skips a trial another one holds (its directory lock), so each trial runs once.
    The worst exit status wins; a worker that saw only busy trials left is done."""
    argv = [sys.executable, "-m", "flatlm", "replicate", *worker_arguments(args)]
    env = {**os.environ, **ONE_THREAD, LOG_PROGRESS: "1"}
    workers = [subprocess.Popen(argv, env=env) for _ in range(args.jobs)]
    codes = [w.wait() for w in workers]
    for worker, code in zip(workers, codes, strict=True):
        if code < 0:  # killed: its trial keeps its checkpoints and resumes on the next run
            print(f"flatlm replicate: worker {worker.pid} was killed by "
                  f"{signal.Signals(-code).name}; its trial resumes from its newest "
                  "checkpoint: run the same command again", file=sys.stderr)
    codes = [WORKER_DIED_EXIT if c < 0 else 0 if c == BUSY_EXIT else c for c in codes]
    return max(codes, key=lambda c: (c != 0, c))


def worker_arguments(args) -> list[str]:
    """The options of ``args`` again, with ``--jobs 1``."""
    out = ["--out", str(args.out), "--experiment", args.experiment, "--scale", args.scale,
           "--device", args.device, "--jobs", "1"]
    out += ["--diagnose"] if args.diagnose else ["--protocol", args.protocol]
    if args.without_selection_measures:
        out.append("--without-selection-measures")
    for flag, value in (("--seeds", args.seeds), ("--models", args.models),
                        ("--algorithms", args.algorithms), ("--minutes", args.minutes),
                        ("--pack", args.pack)):
        if value is not None:
            out += [flag, str(value)]
    for assignment in args.overrides:
        out += ["--set", assignment]
    return out
