"""The random-init reference over several initialisations (issue 53, item 5): what its recorded
s.e. covers, measured.

A trial's ``random_init/<task>/acc_mean`` is the probe on *one* random initialisation of the
trial's shape (``flatlm.measure.reference_cache.random_features_model``, drawn from
``measure.seed``); its ``acc_se`` covers the probe's head seeds and the test sample, not the
spread over initialisations. This program rebuilds a committed trial's evaluation data and probe
from its ``config.json``, probes ``--inits`` random initialisations (init 0 is the trial's own:
its accuracy must equal the recorded one, the check that the rebuild is the trial's), and writes
per task each init's accuracy and s.e., their standard deviation over inits and the ratio of that
spread to the recorded s.e.

    python bench/random_init_spread.py \\
        bench/results/replication_testbed_v2/trials/paper/sizes/d64-h4-l1-i256_seed0 \\
        --inits 5 --json bench/results/random_init_spread.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from flatlm.core.config import from_dict
from flatlm.core.flags import COUNT
from flatlm.measure.reference_cache import random_features_model
from flatlm.measure.run import eval_data, measure_model
from flatlm.runs.trial import TrialConfig, validate_trial
from flatlm.storage.metrics_log import read_metrics


def spread(trial: Path, inits: int, *, n_downstream: int | None = None) -> dict:
    """Each task's probe accuracy on ``inits`` random initialisations of ``trial``'s shape."""
    cfg = from_dict(TrialConfig, json.loads((trial / "config.json").read_text()))
    changes = {"what": ("probe",)}
    if n_downstream is not None:  # a smaller set (the smoke test); not the trial's own
        changes["n_downstream"] = n_downstream
    measure = dataclasses.replace(cfg.measure, **changes)
    source, model_cfg = validate_trial(cfg)  # the source and shape the trial measured with
    data = eval_data(source, measure, None, device="cpu")
    rows = []
    for k in range(inits):
        start = time.perf_counter()
        model = random_features_model(model_cfg, source, measure.seed + k)
        got = measure_model(model, source, data, measure, "cpu")
        rows.append({"init": k, "measure_seed": measure.seed + k,
                     "seconds": round(time.perf_counter() - start, 1), **{
                         key: got[key] for key in sorted(got)
                         if key.startswith("probe/") and key.endswith(("/acc_mean", "/acc_se"))}})
        accs = [key for key in rows[-1] if key.endswith("/acc_mean")]
        print(f"init {k}: " + ", ".join(f"{key.split('/')[1]} {got[key]:.4f}" for key in accs),
              flush=True)
    return {"trial": str(trial), "inits": inits, "n_downstream": measure.n_downstream,
            "rows": rows, "tasks": _summary(rows, read_metrics(trial), n_downstream is None)}


def _summary(rows: list[dict], recorded: dict, same_data: bool) -> dict:
    """Per task: the inits' mean and s.d. of the accuracy, their mean recorded-style s.e., the
    ratio s.d. / s.e., and (on the trial's own data) init 0 against the trial's recorded row."""
    first = recorded[min(recorded)] if recorded else {}
    out = {}
    for task in sorted({k.split("/")[1] for k in rows[0] if k.endswith("/acc_mean")}):
        acc = np.array([r[f"probe/{task}/acc_mean"] for r in rows])
        se = np.array([r[f"probe/{task}/acc_se"] for r in rows])
        sd = float(acc.std(ddof=1)) if len(acc) > 1 else float("nan")
        entry = {"mean": float(acc.mean()), "sd_over_inits": sd, "mean_se": float(se.mean()),
                 "sd_over_se": sd / float(se.mean()), "range": [float(acc.min()),
                                                                 float(acc.max())]}
        key = f"random_init/{task}/acc_mean"
        if same_data and key in first:
            entry["recorded_init0"] = first[key]
            entry["init0_matches_record"] = bool(abs(first[key] - acc[0]) < 1e-9)
        out[task] = entry
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trial", type=Path, help="a trial directory with config.json, metrics.jsonl")
    p.add_argument("--inits", type=COUNT, default=5, help="random initialisations (default 5)")
    p.add_argument("--n-downstream", type=COUNT, default=None,
                   help="labelled sentences instead of the trial's (a quicker, other reading)")
    p.add_argument("--json", type=Path, help="where to write the result")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # as the replication's workers measured the trial
    result = spread(args.trial, args.inits, n_downstream=args.n_downstream)
    text = json.dumps(result, indent=1) + "\n"
    if args.json:
        args.json.write_text(text)
    print(json.dumps(result["tasks"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
