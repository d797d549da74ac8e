"""The selection measures on testbed v2's committed trainings (issues 50, 54): each trial trained
again from its own ``config.json`` and measured at its checkpoints with the loss and the first
testbed's selection measures (``TESTBED.selection_what``: the top eigenvalues, adaptive and
average sharpness, the preconditioned and the critical sharpness, the noise scales, the LLC, the
CKA with the truth), so that the leaderboard can rank them at matched loss.

    python bench/selection_v2.py --trials bench/results/replication_testbed_v2/trials \\
        --runs /tmp/sel-v2 --records bench/results/selection_v2/trials --jobs 2

The replication ran ``--without-selection-measures`` (their cost on 2 cores); training is a small
share of a v2 trial, so measuring the same trainings again is cheaper than a second replication,
and its records stay apart: ``<protocol>/algorithms-selection/<trial>`` beside nothing else.
``analysis.same_training`` merges the two trials of one training into one run (the same model,
source and training settings), their rows at one step into one. That they trained the same model
is checked here, not assumed: the loss and KL at every checkpoint equal the committed trial's to
a thousandth of their s.e. (``SAME_MODEL_SE_SHARE``), or the program exits 1 naming the trial and
the differences (one torch thread a trial in ``flatlm replicate``'s worker environment,
``ONE_THREAD``, as the records were made; on another machine a rerun can still differ in the 8th
digit, hence the tolerance).

``--runs`` keeps the checkpoints, so a killed run resumes where it stopped; ``--records`` gets
each finished trial's ``config.json`` and ``metrics.jsonl`` as it lands. ``--experiments``
(default algorithms) and ``--arms`` (default: all, in path order) choose the committed trials and
their order.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from analysis.trials import copy_records, finished_trials
from flatlm.commands.replicate import ONE_THREAD
from flatlm.core.config import from_dict
from flatlm.core.flags import COUNT
from flatlm.experiments.scales import TESTBED
from flatlm.measure import KL, LOSS, se_key
from flatlm.storage.metrics_log import read_metrics

EXPERIMENT_SUFFIX = "-selection"  # outside the paper's experiments: the leaderboard copies them
SELECTION_WHAT = ("loss", *TESTBED.selection_what)
SAME_MODEL_KEYS = (LOSS, KL)
# How far a rerun's loss or KL may sit from the committed record and still be the same model: a
# thousandth of that checkpoint's own standard error. Float32 training on another machine (or
# build) rounds differently: measured up to 5e-8 nats after 3500 steps (1.2e-5 s.e.), where a
# model that trained otherwise (Muon's rerun; its Newton-Schulz runs in bfloat16) differs by
# 3e-3 nats, about one s.e.
SAME_MODEL_SE_SHARE = 1e-3


def selection_config(config: dict) -> dict:
    """``config`` (a committed trial's) measuring ``SELECTION_WHAT`` only; nothing it trains
    changes."""
    return {**config, "measure": {**config["measure"], "what": list(SELECTION_WHAT)}}


def planned(trials: Path, experiments: list[str], arms: list[str] | None) -> list[Path]:
    """The committed finished trials of ``experiments``; with ``arms`` only those of the arms
    named (``adamw``: the trial names before ``_seed``, in every protocol;
    ``paper+soft-targets/adamw``: in that protocol only), in the order named."""
    done, _ = finished_trials(trials, experiments)
    if arms is None:
        return done

    def rank(trial: Path) -> int | None:
        protocol, arm = trial.relative_to(trials).parts[0], trial.name.split("_seed")[0]
        hits = [i for i, a in enumerate(arms) if a in (arm, f"{protocol}/{arm}")]
        return hits[0] if hits else None

    chosen = [t for t in done if rank(t) is not None]
    return sorted(chosen, key=rank)  # stable: seeds in order within an arm


def target_of(trial: Path, trials: Path, runs: Path) -> Path:
    protocol, experiment, name = trial.relative_to(trials).parts
    return runs / protocol / (experiment + EXPERIMENT_SUFFIX) / name


def differences(committed: Path, again: Path) -> list[str]:
    """The checkpoints where ``again`` did not train ``committed``'s model: its loss or KL
    further from the committed one than ``SAME_MODEL_SE_SHARE`` of its s.e. (exactly equal where
    the record has no s.e.), or a checkpoint missing."""
    old, new = read_metrics(committed), read_metrics(again)
    out = []
    for step, row in sorted(old.items()):
        for key in SAME_MODEL_KEYS:
            was, now = row.get(key), new.get(step, {}).get(key)
            room = SAME_MODEL_SE_SHARE * row.get(se_key(key), 0.0)
            if was is None or now is None or not abs(now - was) <= room:  # NaN: differs
                out.append(f"step {step} {key}: committed {was!r}, again {now!r} (allowed: "
                           f"{room:.2g})")
    return out


def already_recorded(trial: Path, args) -> bool:
    """Whether ``--records`` holds ``trial``'s selection run already, the same model at every
    checkpoint (a rerun of the program skips it)."""
    record = target_of(trial, args.trials, args.records)
    return (record / "metrics.jsonl").is_file() and not differences(trial, record)


def run_one(trial: Path, target: Path) -> None:
    """Train and measure one trial (this process, one torch thread)."""
    import torch

    from flatlm.runs.trial import TrialConfig, run_trial_once

    torch.set_num_threads(1)
    config = selection_config(json.loads((trial / "config.json").read_text()))
    cfg = from_dict(TrialConfig, config)
    run_trial_once(cfg, target, eval_cache=target.parents[2] / "eval_cache")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=Path, required=True, help="the committed v2 records' root")
    p.add_argument("--runs", type=Path, required=True, help="where the trials run (checkpoints)")
    p.add_argument("--records", type=Path, required=True,
                   help="where each finished trial's config.json and metrics.jsonl go")
    p.add_argument("--experiments", default="algorithms")
    p.add_argument("--arms", default=None,
                   help="comma-separated arms, in the order to run them: trial names before "
                        "_seed (adamw), or <protocol>/<arm> for one protocol's")
    p.add_argument("--jobs", type=COUNT, default=1)
    p.add_argument("--one", nargs=2, type=Path, help=argparse.SUPPRESS)  # a worker's trial
    args = p.parse_args(argv)
    if args.one:
        run_one(*args.one)
        return 0
    todo = planned(args.trials, args.experiments.split(","),
                   args.arms.split(",") if args.arms else None)
    recorded = [t for t in todo if already_recorded(t, args)]
    todo = [t for t in todo if t not in recorded]
    print(f"{len(todo)} trials ({len(recorded)} already under --records), {args.jobs} at a "
          f"time, measuring {', '.join(SELECTION_WHAT)}", flush=True)
    return run_all(todo, args)


def run_all(todo: list[Path], args) -> int:
    waiting, running, failed = list(todo), {}, []
    start = time.perf_counter()
    while waiting or running:
        while waiting and len(running) < args.jobs:
            trial = waiting.pop(0)
            target = target_of(trial, args.trials, args.runs)
            log = args.runs / "logs" / f"{'_'.join(target.relative_to(args.runs).parts)}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            running[trial] = (target, subprocess.Popen(
                [sys.executable, __file__, "--trials", str(args.trials), "--runs",
                 str(args.runs), "--records", str(args.records), "--one", str(trial),
                 str(target)], stdout=log.open("w"), stderr=subprocess.STDOUT,
                env={**os.environ, **ONE_THREAD}))
        time.sleep(0.5)  # a finished trial is copied and the next started within a second
        for trial, (target, proc) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[trial]
            failed += finish(trial, target, proc.returncode, args, start)
    print(f"done in {(time.perf_counter() - start) / 60:.1f} min; {len(failed)} failed")
    for line in failed:
        print("  " + line)
    return 1 if failed else 0


def finish(trial: Path, target: Path, rc: int, args, start: float) -> list[str]:
    minutes = (time.perf_counter() - start) / 60
    if rc != 0:
        print(f"[{minutes:.1f} min] {trial}: exit {rc} (log under {args.runs / 'logs'})")
        return [f"{trial}: exit {rc}"]
    differ = differences(trial, target)
    print(f"[{minutes:.1f} min] {trial}: the same model at every checkpoint"
          if not differ else f"[{minutes:.1f} min] {trial}: {len(differ)} differ", flush=True)
    if differ:
        return [f"{trial}: {d}" for d in differ]
    copy_records([target], args.runs, args.records)
    return []


if __name__ == "__main__":
    sys.exit(main())
