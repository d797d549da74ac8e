"""Does the measurement protocol mean what the paper means? A CPU experiment (issue: masking,
labels, probe, loss weighting).

Trains the same model on the paper's grammar under the new defaults (BERT's 80/10/10 masking,
posterior labels on sentences of >= 5 words, standardised probe with its reference rows) and
under the old protocol (every masked word written as [MASK]), then reads, per task, the probe on
the trained model, on a randomly initialised model of the same shape, the lookup table and the
majority class, with their standard errors, and the features' effective rank. Runs through
``flatlm.runs.trial.run_trial``, the path every sweep takes.

    python bench/protocol_cpu.py                 # about 15 min on 2 CPU threads
    python bench/protocol_cpu.py --steps 300 --n-downstream 2000 --out /tmp/quick.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig, run_trial

VARIANTS = {"new (80/10/10)": {}, "old ([MASK] only)": {"train.mask_replace": [1.0, 0.0, 0.0]}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="d128-h2-l2-i512")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--n-downstream", type=int, default=8000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" /
                   "protocol_cpu.json")
    return p.parse_args(argv)


def trial_config(args, extra: dict) -> TrialConfig:
    return apply_overrides(TrialConfig(), {
        "source": "pcfg:paper", "model": args.model, "train.steps": args.steps,
        "train.batch_size": args.batch_size, "train.warmup_steps": min(200, args.steps // 5),
        "train.checkpoint_steps": [0, args.steps], "measure.what": ["loss", "probe", "lookup"],
        "measure.n_eval": 1000, "measure.n_downstream": args.n_downstream, **extra})


def summary(metrics: dict, tasks) -> dict:
    """Per task: accuracy and s.e. of the probe, the random model, the lookup table, majority."""
    rows = {}
    for task in tasks:
        rows[task] = {stage: [round(metrics[f"{stage}/{task}/acc_mean"], 4),
                              round(metrics[f"{stage}/{task}/acc_se"], 4)]
                      for stage in ("probe", "random_init", "lookup")}
        rows[task]["majority"] = round(metrics[f"probe/{task}/majority_acc"], 4)
        rows[task]["probe_train_acc"] = round(metrics[f"probe/{task}/train_acc"], 4)
        rows[task]["trained_beats_random"] = \
            metrics[f"probe/{task}/acc_mean"] > metrics[f"random_init/{task}/acc_mean"]
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {"command": "python bench/protocol_cpu.py " + " ".join(sys.argv[1:]),
               "machine": platform.platform(), "threads": args.threads, "model": args.model,
               "steps": args.steps, "batch_size": args.batch_size,
               "n_downstream": args.n_downstream, "variants": {}}
    for name, extra in VARIANTS.items():
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            done = run_trial(trial_config(args, extra), tmp, progress=True)
        last, first = done[args.steps], done[0]
        tasks = sorted({k.split("/")[1] for k in last if k.startswith("probe/") and
                        k.count("/") == 2})
        results["variants"][name] = {
            "overrides": extra, "seconds": round(time.perf_counter() - start, 1),
            "kl": [round(first["pretrain/kl"], 4), round(last["pretrain/kl"], 4)],
            "feature_rank": {"random_init": round(last["random_init/feature_rank"], 1),
                             "step_0": round(first["probe/feature_rank"], 1),
                             f"step_{args.steps}": round(last["probe/feature_rank"], 1)},
            "tasks": summary(last, tasks)}
        print(json.dumps({name: results["variants"][name]}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
