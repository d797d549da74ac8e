"""Planted trials for analysis/leaderboard.py and bench/selection_leaderboard.py.

12 runs x 3 checkpoints in the window (KL 0.01) plus one early checkpoint per run outside it
(KL 0.5). In the window the accuracy is a function of the loss plus a term in the Fisher trace M
(flatter = better) plus a little noise; ``flat/sharpness_avg`` and ``llc/mean`` are pure noise;
``cka/truth`` is -M (higher = better, so it must rank exactly as M does).
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd

from flatlm.measure import KL, LLC, LOSS, SHARPNESS_AVG, TRACE_FISHER, TRACE_FISHER_GROWN

ACC = "probe/A/acc_mean"
CKA = "cka/truth"
SHAPE, SMALL = "d64-h4-l2-i256", "d32-h2-l2-i128"


def planted(n_runs: int = 12, seed: int = 0, small_runs: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for run in range(n_runs):
        model = SMALL if run < small_runs else SHAPE
        rows.append({"run_id": f"r{run}", "step": 50, "model": model, KL: 0.5 + run / 100,
                     LOSS: 3.0 + run / 100,
                     TRACE_FISHER: 0.0, SHARPNESS_AVG: 0.0, CKA: 0.0, LLC: 0.0,
                     TRACE_FISHER_GROWN: 0.0, ACC: 0.1})  # would win every pick if counted
        for step in (100, 200, 300):
            loss, m = 2 + rng.uniform(0, 0.01), rng.normal()
            rows.append({"run_id": f"r{run}", "step": step, "model": model, KL: 0.01,
                         LOSS: loss, TRACE_FISHER: m, SHARPNESS_AVG: rng.normal(), CKA: -m,
                         LLC: rng.normal(), TRACE_FISHER_GROWN: m,
                         ACC: 0.9 - 3 * (loss - 2) - 0.01 * m + 0.001 * rng.normal()})
    return pd.DataFrame(rows)


def write_trials(root: Path, df: pd.DataFrame) -> Path:
    """``df``'s runs as trial directories ``root/paper/steps/<run>`` (config + metrics)."""
    for run, frame in df.groupby("run_id"):
        trial = root / "paper" / "steps" / run
        trial.mkdir(parents=True)
        config = {"model": frame["model"].iloc[0],
                  "train": {"algorithm": "adamw", "seed": int(run.removeprefix("r"))}}
        (trial / "config.json").write_text(json.dumps(config))
        records = frame.drop(columns=["run_id", "model"]).to_dict("records")
        (trial / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root
