"""Time of a trial's exact truth for measurement: downstream labels and validation conditionals.

Compares, in the same run, on the paper grammar and the same sentences:

- labels for tasks A, B, C (``PCFG.labels_of_tasks``: charts grouped by length, merged to
  ``min_group`` sentences on a GPU) against the previous route: one chart padded to the longest
  sentence per batch of 1024 (``PCFG._labels_batch`` over slices, as flatlm did before);
- the validation truth of ``measure.loss`` (one call per ``truth_chunk`` sentences) against the
  previous route: one ``conditionals`` call per model batch of 256 sentences.

    python bench/eval_data.py --threads 1             # CPU, bench/results/eval_data_cpu.json
    python bench/eval_data.py --device cuda --n-downstream 100000 --n-eval 100000 \
        --out bench/results/eval_data_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from flatlm.measure.loss import truth_chunk
from flatlm.sources import load

TASKS = ("A", "B", "C")


def seconds(fn, device) -> float:
    """Wall time of one call of ``fn`` (after a small warm-up elsewhere), synchronised."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def padded_labels(src, tokens, lengths, rule, batch_size=1024):
    """The previous route: one chart over each padded batch of ``batch_size`` sentences."""
    parts = [src._labels_batch(tokens[i : i + batch_size], lengths[i : i + batch_size], TASKS,
                               rule) for i in range(0, len(tokens), batch_size)]
    return {t: torch.cat([p[t] for p in parts]) for t in TASKS}


def per_batch_truth(src, tokens, lengths, batch_size=256):
    for i in range(0, len(tokens), batch_size):
        src.conditionals(tokens[i : i + batch_size], lengths[i : i + batch_size],
                         dtype=torch.float64)


def chunked_truth(src, tokens, lengths):
    chunk = truth_chunk(256, tokens.shape[1], src.V)
    for i in range(0, len(tokens), chunk):
        src.conditionals(tokens[i : i + chunk], lengths[i : i + chunk], dtype=torch.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n-downstream", type=int, default=4000)
    ap.add_argument("--n-eval", type=int, default=4000)
    ap.add_argument("--rule", default="posterior")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    ap.add_argument("--out", default="bench/results/eval_data_cpu.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = str(torch.device(args.device))
    src = load("pcfg:paper")
    tok, ln = (t.to(device) for t in src.downstream_sentences(args.n_downstream, seed=0))
    vtok, vln = (t.to(device) for t in src.sample(args.n_eval, seed=1))
    src.labels_of_tasks(tok[:64], ln[:64], TASKS, args.rule)  # warm-up: plans, allocator
    new = src.labels_of_tasks(tok, ln, TASKS, args.rule)
    old = padded_labels(src, tok, ln, args.rule)
    if not all(torch.equal(new[t], old[t]) for t in TASKS):
        raise SystemExit("the two label routes disagree")
    desc = (torch.cuda.get_device_name() if device.startswith("cuda")
            else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()} threads")
    common = {"device": device, "hardware": desc, "torch": torch.__version__,
              "command": "python bench/eval_data.py " + " ".join(sys.argv[1:]),
              "load_average_1min": os.getloadavg()[0]}
    timings = [
        ("labels_abc_s", f"{args.n_downstream} downstream sentences, rule {args.rule}",
         lambda: src.labels_of_tasks(tok, ln, TASKS, args.rule),
         lambda: padded_labels(src, tok, ln, args.rule),
         "one padded chart per batch of 1024 (previous route)"),
        ("validation_truth_s", f"{args.n_eval} validation sentences, float64",
         lambda: chunked_truth(src, vtok, vln), lambda: per_batch_truth(src, vtok, vln),
         "one conditionals call per model batch of 256 (previous route)"),
    ]
    rows = []
    for metric, what, fast, slow, name in timings:
        ours, theirs = seconds(fast, device), seconds(slow, device)
        rows.append({"metric": metric, "flatlm": ours, "baseline": theirs, "baseline_name": name,
                     "ratio": theirs / ours, "unit": f"seconds (lower is better), {what}",
                     **common})
        print(f"{metric:20s} flatlm {ours:8.2f} s  {name}: {theirs:8.2f} s  "
              f"speed-up {theirs / ours:5.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
