"""Coverage of the Tr(F) standard error on a partly trained BERT, old default vs new.

The model (bert-2m, paper PCFG, trained as in ``bench/flatness.py``) is measured on ``--inputs``
fresh sentences with 1 Rademacher probe and with 8 sampled labels per input (ghost norms, labels
kept apart). Per-input values are i.i.d. across inputs, so disjoint slices of n inputs are
independent repeats of an n-input estimate; the reference is the grand mean of all values of
both estimators (both unbiased; its relative s.e. is ~0.5%). For each estimator and n it reports
the per-input kurtosis, the coverage of mean +- t se (nominal 95%) and the median of
reported s.e. / true s.e. (true: sd of all values / sqrt(n)), for the batch-means s.e. over 32
groups (the old default) and the i.i.d. s.e. (the new one).

    python bench/flatness_se.py   # ~3 min, one CPU thread; bench/results/flatness_se_cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from flatness import train  # bench/flatness.py
from scipy import stats

from flatlm.measure.curvature import fisher
from flatlm.measure.curvature.common import (
    FlatnessConfig,
    eval_mode,
    grouped_mean_se,
    masked_inputs,
    selected_parameters,
)
from flatlm.models import build_model, parse_model
from flatlm.sources import load


def per_label_values(model, tokens, lengths, cfg) -> np.ndarray:
    """(labels_per_input, n) squared norms, one row per direction (not averaged)."""
    x = masked_inputs(tokens, lengths, cfg.seed)
    params = selected_parameters(model, cfg.exclude)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    out = torch.zeros(cfg.labels_per_input, len(x), dtype=torch.float64)
    with eval_mode(model):
        for rows, batch in x.sorted_batches(cfg.batch_size, "cpu"):
            out[:, rows] = fisher._ghost_values(model, params, batch, cfg, g).double()
    return out.numpy()


def coverage(values: np.ndarray, truth: float, n: int, se_groups: int | None) -> dict:
    reps = min(300, len(values) // n)
    true_se = values.std() / math.sqrt(n)
    hits, ratios = [], []
    for chunk in values[: reps * n].reshape(reps, n):
        mean, se = grouped_mean_se(chunk, se_groups)
        q = stats.t.ppf(0.975, (n if se_groups is None else min(se_groups, n)) - 1)
        hits.append(abs(mean - truth) <= q * se)
        ratios.append(se / true_se)
    return {"n": n, "repeats": reps, "coverage": float(np.mean(hits)),
            "median_se_ratio": float(np.median(ratios))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--inputs", type=int, default=60_000)
    p.add_argument("--out", default="bench/results/flatness_se_cpu.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    src = load("pcfg:paper")
    model = build_model(parse_model("bert-2m"), src.V, src.max_length, seed=0)
    targs = argparse.Namespace(train_steps=300, train_batch=128, pool=4096, lr=1e-3, seed=0,
                               device="cpu")
    curve = train(model, src, targs)
    tokens, lengths = src.sample(args.inputs, seed=123)
    runs = {est: per_label_values(model, tokens, lengths, FlatnessConfig(
        n_inputs=None, batch_size=512, estimator=est, labels_per_input=k, seed=1))
        for est, k in (("probe", 1), ("sampled", 8))}
    truth = float(np.concatenate([runs["sampled"].mean(0), runs["probe"][0]]).mean())
    rows = []
    cases = [("probe", 1, 32), ("probe", 1, None), ("sampled", 1, None), ("sampled", 4, None),
             ("sampled", 8, 32), ("sampled", 8, None)]
    for est, k, groups in cases:
        values = runs[est][:k].mean(0)
        row = {"estimator": est, "labels_per_input": k, "se_groups": groups,
               "kurtosis": float(stats.kurtosis(values, fisher=False)),
               "relative_sd": float(values.std() / values.mean()),
               "coverage": [coverage(values, truth, n, groups) for n in (100, 500, 2000)]}
        rows.append(row)
        print(json.dumps(row))
    result = {"model": "bert-2m", "source": "pcfg:paper", "train_loss_curve": curve,
              "inputs": args.inputs, "trace_fisher_reference": truth, "cases": rows,
              "device": "cpu (1 thread)", "torch": torch.__version__}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
