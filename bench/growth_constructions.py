"""Tr(F) of checkpoints grown into one shape by each growth construction, and the cost of B.1's
50 sampled labels per input.

Each checkpoint (``flatlm train`` output, ``CKPT/checkpoints/step-N``) is grown into ``--to`` by
every construction of ``flatlm.models.constructions.CONSTRUCTIONS`` ("paper": B.4.2 / enlarge.py,
input embeddings / m; "head-norm": the MLM head's LayerNorm / m) and measured with ``trace_fisher``
on the same ``--inputs`` sentences of the checkpoint's source (one masked word each, the flatness
seed 0, ``--labels`` sampled labels per input); the native Tr(F) too, and the largest logit
difference of each grown model from the checkpoint. With ``--time-labels`` it also times the native
Tr(F) of each checkpoint for each of those label counts (the per-checkpoint cost of B.1's 50; the
least of 3 runs, one torch thread by default).

    python bench/growth_constructions.py RUN1 RUN2 RUN3 --to d64-h4-l2-i256 \\
        [--inputs 1000] [--labels 8] [--time-labels 1,8,50] [--threads 1] [--out results.json]

``bench/results/growth_constructions_cpu.json``: the tiny scale's three models (``TINY_MODELS``,
post-LN, seed 0), each trained by
``flatlm train --source "$TINY_SOURCE" --model M --steps 1500 --batch-size 128 --lr 3e-3
--warmup-steps 100 --seed 0 --out runs/M`` (TINY_SOURCE: ``flatlm.experiments.scales``; KL to the
truth 0.33 / 0.26 / 0.19 nats), then this script with ``--time-labels 1,8,50`` (2-core CPU
shared with other jobs, load ~4). Tr(F) grown to d64-h4-l2-i256, 1000 inputs, 8 labels:

    model            native  paper (B.4.2)  head-norm
    d16-h1-l1-i64     88.8      264.2          44.4     (s.e. 1.0 / 3.0 / 0.5)
    d32-h2-l1-i128    76.2      131.8          48.4     (s.e. 0.9 / 1.6 / 0.6)
    d64-h4-l2-i256    89.6       89.6          89.6     (s.e. 1.3; its own shape)

Under the paper's construction the largest model is the flattest (Fig. 5's order), under
"head-norm" the sharpest. Native Tr(F) of d64-h4-l2-i256 on 1000 inputs, one thread: 0.22 s with
1 label per input, 0.92 s with 8, 4.96 s with 50 (s.e. 2.3 / 1.3 / 1.1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.grown import grown_model
from flatlm.models.checkpoint import load_checkpoint
from flatlm.models.constructions import CONSTRUCTIONS
from flatlm.models.growth import max_logit_difference
from flatlm.sources import load


def last_checkpoint(run: Path) -> Path:
    """``run`` itself if it is a checkpoint, else its newest ``checkpoints/step-N``."""
    if (run / "flatlm.json").exists():
        return run
    steps = sorted((run / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    if not steps:
        raise ValueError(f"{run}: no flatlm.json and no checkpoints/step-N in it")
    return steps[-1]


def timed_trace(model, tokens, lengths, cfg, repeats: int = 1) -> tuple[dict, dict]:
    """trace_fisher's result and its wall and process (CPU) seconds, each the least over
    ``repeats`` runs: on a shared machine the least CPU time is the steadiest measure of cost."""
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        out = trace_fisher(model, tokens, lengths, cfg)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return out, {"wall_s": min(walls), "cpu_s": min(cpus)}


def measure(ckpt: Path, target: str, n: int, labels: int, time_labels: list[int]) -> dict:
    model, info = load_checkpoint(ckpt)
    model = model.eval()
    source = load(info["source"])
    tokens, lengths = source.sample(n, seed=1)
    cfg = FlatnessConfig(n_inputs=n, batch_size=128, labels_per_input=labels, seed=0)
    native, seconds = timed_trace(model, tokens, lengths, cfg)
    row = {"checkpoint": str(ckpt), "shape": info["shape"], "labels_per_input": labels,
           "native": {"mean": native["mean"], "se": native["se"], **seconds}}
    for construction in CONSTRUCTIONS:
        big = grown_model(model, target, seed=0, construction=construction).eval()
        out, seconds = timed_trace(big, tokens, lengths, cfg)
        row[construction] = {"mean": out["mean"], "se": out["se"], **seconds,
                             "max_logit_difference": max_logit_difference(model, big, n=64)}
    row["time_by_labels"] = {}
    for k in time_labels:
        out, seconds = timed_trace(model, tokens, lengths, dataclasses.replace(
            cfg, labels_per_input=k), repeats=3)
        row["time_by_labels"][str(k)] = {"mean": out["mean"], "se": out["se"], **seconds}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="flatlm train --out dirs or checkpoints")
    p.add_argument("--to", required=True, help="the common shape, e.g. d64-h4-l2-i256")
    p.add_argument("--inputs", type=int, default=1000)
    p.add_argument("--labels", type=int, default=8, help="sampled labels per input")
    p.add_argument("--time-labels", default="", help="label counts to time, e.g. 1,8,50")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    time_labels = [int(k) for k in args.time_labels.split(",") if k]
    rows = []
    for run in args.runs:
        row = measure(last_checkpoint(run), args.to, args.inputs, args.labels, time_labels)
        rows.append(row)
        cells = "  ".join(f"{c} {row[c]['mean']:.1f} +- {row[c]['se']:.1f}"
                          for c in ("native", *CONSTRUCTIONS))
        times = "  ".join(f"{k} labels {v['cpu_s']:.1f} cpu-s ({v['mean']:.1f} +- {v['se']:.1f})"
                          for k, v in row["time_by_labels"].items())
        print(f"{row['shape']:>16}  {cells}  {times}", flush=True)
    result = {"to": args.to, "inputs": args.inputs, "threads": torch.get_num_threads(),
              "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
