"""``flatlm trial``: one trial (pre-train, and measure at every checkpoint) without Ray or MLflow.

    flatlm trial --out t/                                  # the CPU sweeps' base trial
    flatlm trial --out t/ --set model=d16-h1-l1-i64 --set train.steps=600
    flatlm trial --out t/ --scale tiny --protocol paper-code --source dyck:8
    flatlm trial --out t/ --scale gpu --device cuda        # a paper-scale trial on one GPU
    flatlm trial --out t/ --quick --set train.steps=200    # loss and KL only: seconds a checkpoint
    flatlm trial --out t/ --quick --measure-in background  # measured beside, training never waits

The trial is the base of a scale under a protocol (``flatlm.experiments``: the same trial the
sweeps and ``flatlm replicate`` start from), on ``--source`` with its kind's settings, then the
``--set`` keys (the trial config's, as everywhere: ``train.lr=3e-3``, ``measure.probe.seeds=5``).
It writes ``OUT/config.json``, ``OUT/metrics.jsonl`` and ``OUT/checkpoints/step-N/``, and resumes
from its newest checkpoint when run again with the same ``--out``; a trial that diverged (exit 3)
records it in ``OUT/diverged.json`` and is not trained again. While it runs, one line says
where it is (the step, steps/s and the time left, or the measurement part under way); each
checkpoint prints the sweeps' short line (loss, KL, Tr(F), a probe's accuracy; every metric is in
metrics.jsonl); it ends with where its files are and what they show.

Measuring dominates a short run: at the sweep scale a checkpoint's measurements take minutes on a
CPU (the first one also the evaluation data and the reference probes). ``--quick`` measures the
loss and the KL only (``measure.what=loss``: no Tr(F) or Tr(H), no probes, no lookup-table or
random-init references). The evaluation data and the reference rows, which do not depend on the
trial's training, are kept in ``--eval-cache`` (default: ``eval_cache/`` beside ``OUT``), so the
trials of one directory draw them once.

``--measure-in background`` trains without stopping at checkpoints: a second process (``flatlm
measure --follow OUT``, started here and waited for at the end) measures each checkpoint as it
is saved and writes the same metrics.jsonl rows (``flatlm.runs.follow``). On a GPU both share
the device; on a CPU they share its cores.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from functools import partial
from pathlib import Path

from flatlm.commands import DEFAULT_DEVICE, DEFAULT_PROTOCOL, DEFAULT_SCALE, add_command
from flatlm.core.config import apply_overrides, parse_assignments
from flatlm.core.safe_io import check_output_dir
from flatlm.core.workers import WorkerDied
from flatlm.experiments.costs import budget_line, measure_prior_s
from flatlm.runs.console import Console
from flatlm.storage.dirlock import writer_lock


def register(subparsers) -> None:
    p = add_command(subparsers, "trial", __doc__)
    p.add_argument("--out", required=True, type=Path, help="the trial directory")
    p.add_argument("--scale", default=DEFAULT_SCALE,
                   help=f"sweep (the CPU sweeps'; default {DEFAULT_SCALE}), tiny (the "
                        "replication's CPU minutes), testbed (a CPU scale where the models "
                        "saturate) or gpu (the paper's sizes)")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL,
                   help=f"paper, paper-code, or paper+switch (default {DEFAULT_PROTOCOL})")
    p.add_argument("--source", help="the language, with its kind's settings (default: the "
                                    "scale's PCFG)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any trial config key, e.g. train.lr=3e-3 (repeatable)")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help=f"auto, cpu, cuda or cuda:i (default: {DEFAULT_DEVICE})")
    p.add_argument("--quick", action="store_true",
                   help="measure the loss and KL only (measure.what=loss): no flatness, no "
                        "probes, no references; seconds a checkpoint instead of minutes")
    p.add_argument("--eval-cache", default=None, metavar="DIR",
                   help="where the evaluation data and reference rows are kept and reused "
                        "(default: eval_cache/ beside --out; 'none': this trial alone)")
    p.add_argument("--measure-in", default="process", choices=("process", "background"),
                   help="process (default): measure each checkpoint here, training waiting; "
                        "background: a second process measures the checkpoints as they appear")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress line (the checkpoints' lines and the summary stay)")
    p.set_defaults(run=run)


def trial_config(args):
    """The trial the options describe, checked (a ValueError names a bad field)."""
    from flatlm.experiments.paper import base_of
    from flatlm.runs.closing import QUICK_WHAT
    from flatlm.runs.trial import validate_trial

    quick = [f"measure.what={','.join(QUICK_WHAT)}"] if getattr(args, "quick", False) else []
    cfg = apply_overrides(base_of(args.scale, args.protocol, args.source),
                          parse_assignments([*quick, *args.overrides]))
    validate_trial(cfg)
    return cfg


def run(args) -> int:
    from flatlm.core.devices import resolve_device
    from flatlm.runs.closing import closing_lines
    from flatlm.runs.trial import printer, run_trial_once

    cfg = trial_config(args)
    device = resolve_device(args.device)
    args.out = check_output_dir(args.out)  # a link, a file or an unwritable place: a message
    print(f"trial {cfg.model} on {cfg.source} ({args.scale} scale, {args.protocol}) -> "
          f"{args.out}", flush=True)
    budget = budget_line(cfg, device)
    if budget is not None:  # measuring can dominate a short run: said before it starts
        hint = "" if args.quick else "; --quick measures only the loss and KL"
        print(f"expected: {budget}{hint}", flush=True)
    cache = eval_cache_dir(args.eval_cache, args.out)
    if cache is not None:
        print(f"evaluation data and reference rows: {cache} (shared by the trials beside it)",
              flush=True)
    console = None if args.no_progress else Console()
    report = partial(printer, task=cfg.train.adversarial.task,
                     say=console.say if console else None)
    if args.measure_in == "background":
        rows = _train_and_follow(cfg, args, device, cache)
    else:
        with console.ticking() if console else contextlib.nullcontext():
            rows = run_trial_once(cfg, args.out, report, device=device, eval_cache=cache,
                                  on_progress=console.show if console else None,
                                  measure_prior_s=measure_prior_s(cfg, device))
    print("\n".join(closing_lines(args.out, rows, cfg.measure.what, args.quick)), flush=True)
    return 0


def _train_and_follow(cfg, args, device, cache) -> dict:
    """Trains here while ``flatlm measure --follow OUT`` measures in a second process; waits
    for it, and returns the rows it wrote. The trial's lock is taken before the follower starts,
    so it sees a training under way."""
    from flatlm.runs.trial import read_metrics, run_trial_once

    command = [sys.executable, "-m", "flatlm", "measure", "--follow", str(args.out),
               "--device", str(device), "--cache", str(cache) if cache else "none"]
    with writer_lock(args.out):
        follower = subprocess.Popen(command)
        try:
            run_trial_once(cfg, args.out, device=device, eval_cache=cache,
                           measure_in="background")
        except BaseException:
            follower.terminate()
            follower.wait()
            raise
    if follower.wait() != 0:  # the training is whole; a rerun measures what is left
        raise WorkerDied(f"the measuring process (flatlm measure --follow {args.out})",
                         follower.returncode)
    return read_metrics(args.out)


def eval_cache_dir(option: str | None, out: Path) -> Path | None:
    """``--eval-cache``: a directory, ``none`` (no cache), or by default ``eval_cache/`` beside
    the trial directory (``flatlm replicate`` keeps its trials' in ``OUT/eval_cache``).

    >>> eval_cache_dir(None, Path("/w/t1")), eval_cache_dir("none", Path("/w/t1"))
    (PosixPath('/w/eval_cache'), None)
    """
    if option is None:
        return Path(out).absolute().parent / "eval_cache"
    return None if option.lower() == "none" else Path(option)
