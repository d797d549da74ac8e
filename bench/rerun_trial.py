"""A committed trial rerun from its own ``config.json``, checkpoint by checkpoint against its
``metrics.jsonl``: the bit-for-bit check of a replication's records (issue 50: "one v2 trial
rerun from its config.json").

    python bench/rerun_trial.py TRIAL_DIR --checkpoints 1   # e.g. a committed v2 trial

Trains the trial again in a temporary directory up to its first ``--checkpoints`` checkpoints
(the config's own, cut there, a warmup given as a share of the steps pinned to
the steps it was; nothing else changed) and compares every recorded metric but the
timings (``time/*``) exactly. Prints the counts and each difference; exit 1 if any differs.
It runs on ``--threads`` torch threads (default 1, as every ``flatlm replicate`` worker on a CPU
does): the CPU kernels' reduction order depends on the thread count, so a rerun on 2 threads
differs in the 8th digit (measured on a v2 trial: 29 of 141 metrics, even the random-init
feature rank, which no training touches).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from flatlm.core.config import from_dict
from flatlm.core.flags import COUNT
from flatlm.runs.trial import TrialConfig, run_trial
from flatlm.storage.metrics_log import read_metrics
from flatlm.train.config import resolve


def cut_at(cfg: TrialConfig, checkpoints: int) -> TrialConfig:
    """``cfg`` trained only to its first ``checkpoints``, its rates at every step the same: a
    warmup given as a share of ``train.steps`` is pinned to the steps it was (12% of 3500 is
    not 12% of 500); a linear decay to ``train.steps`` cannot be cut (error naming the fix)."""
    steps = tuple(sorted(cfg.train.checkpoint_steps)[:checkpoints])
    if steps[-1] == cfg.train.steps:
        return cfg
    if cfg.train.schedule != "constant":
        raise SystemExit(f"train.schedule={cfg.train.schedule!r} decays to 0 at train.steps="
                         f"{cfg.train.steps}: a cut run has other rates; pass --checkpoints "
                         f"{len(cfg.train.checkpoint_steps)} (every checkpoint)")
    warmup = resolve(cfg.train).warmup_steps
    return replace(cfg, train=replace(cfg.train, steps=steps[-1], checkpoint_steps=steps,
                                      warmup_steps=warmup, warmup_proportion=None))


def rerun(trial: Path, checkpoints: int) -> tuple[int, list[str]]:
    """(metrics compared, differences) of ``trial`` rerun to its first ``checkpoints``."""
    cfg = from_dict(TrialConfig, json.loads((trial / "config.json").read_text()))
    cut = cut_at(cfg, checkpoints)
    steps = cut.train.checkpoint_steps
    committed = read_metrics(trial)
    with tempfile.TemporaryDirectory() as tmp:
        again = run_trial(cut, tmp, eval_cache=Path(tmp) / "eval_cache")
    compared, differ = 0, []
    for step in steps:
        for key, value in committed[step].items():
            if key.startswith("time/"):
                continue
            compared += 1
            if again[step].get(key) != value:
                differ.append(f"step {step} {key}: committed {value!r}, rerun "
                              f"{again[step].get(key)!r}")
    return compared, differ


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trial", type=Path, help="a trial directory with config.json, metrics.jsonl")
    p.add_argument("--checkpoints", type=COUNT, default=1, help="how many of its checkpoints")
    p.add_argument("--threads", type=COUNT, default=1,
                   help="torch threads (default 1: the replication's workers')")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    compared, differ = rerun(args.trial, args.checkpoints)
    print(f"{args.trial}: {compared} metrics compared over {args.checkpoints} checkpoint(s), "
          f"{len(differ)} differ")
    for line in differ:
        print("  " + line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
