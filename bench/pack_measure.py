"""A pack's checkpoint loss measured as one batched problem against member by member (issue 41).

K models of the testbed's smallest shape (d64-h4-l2-i256, its grammar ``TESTBED_SOURCE``), seeds
0..K-1, and one set of validation sentences. Three ways to get every member's ``pretrain/*``:

- ``per_member`` (the baseline, what ``run_pack`` does by default): ``pretrain_loss`` of each
  model, the truth of the pairs computed once per model;
- ``per_member_shared_truth``: the truth once (``pair_truth``), then ``loss_terms`` of each model
  with it: what batching the forward alone would be measured against;
- ``batched`` (``run_pack(..., batched_measure=True)``): ``packed_pretrain_loss``, the truth once
  and one forward of the stacked models per model batch.

Seconds are the best of ``--repeats`` interleaved passes in this process at ``--threads``
threads (after one warm-up pass); the ratios are over the baseline measured in the same run.
The batched values are checked equal (``==``) to the baseline's before anything is timed.

    python bench/pack_measure.py      # CPU: bench/results/pack_measure_cpu.json
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

MODEL = "d64-h4-l2-i256"


def _ways(models, source, tokens, lengths, cfg):
    from flatlm.measure.loss import loss_terms, pair_truth, pretrain_loss
    from flatlm.measure.packed_loss import packed_pretrain_loss

    def per_member():
        return [pretrain_loss(m, source, tokens, lengths, cfg) for m in models]

    def per_member_shared_truth():
        truth = pair_truth(source, tokens, lengths, cfg, device="cpu")
        return [loss_terms(m, source, tokens, lengths, cfg, truth=truth) for m in models]

    def batched():
        return packed_pretrain_loss(models, source, tokens, lengths, cfg)

    return {"per_member": per_member, "per_member_shared_truth": per_member_shared_truth,
            "batched": batched}


def measure(members: int, n_eval: int, positions: str, batch_size: int, threads: int,
            repeats: int) -> dict:
    from flatlm.experiments.scales import TESTBED_SOURCE
    from flatlm.measure.loss import LossConfig
    from flatlm.models import build_model, parse_model
    from flatlm.sources import load

    torch.set_num_threads(threads)
    source = load(json.loads(TESTBED_SOURCE))
    tokens, lengths = source.sample_validation(n_eval, seed=0)
    models = [build_model(parse_model(MODEL), source.V, source.max_length, seed=s).eval()
              for s in range(members)]
    cfg = LossConfig(positions=positions, batch_size=batch_size)
    ways = _ways(models, source, tokens, lengths, cfg)
    if ways["batched"]() != ways["per_member"]():  # also the warm-up of both
        raise AssertionError("the batched loss differs from the per-member loss")
    ways["per_member_shared_truth"]()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(repeats):
        for name, way in ways.items():
            start = time.perf_counter()
            way()
            best[name] = min(best[name], time.perf_counter() - start)
    return {"members": members, "n_eval": n_eval, "positions": positions,
            "batch_size": batch_size, "threads": threads, "equal_bit_for_bit": True,
            **{f"{name}_s": round(s, 4) for name, s in best.items()},
            "ratio_per_member_over_batched": round(best["per_member"] / best["batched"], 3),
            "ratio_shared_truth_over_batched":
                round(best["per_member_shared_truth"] / best["batched"], 3)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--n-eval", type=int, default=1000)
    parser.add_argument("--positions", nargs="+", default=["one"])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 16],
                        help="loss.batch_size: 256 the default, 16 the overhead-bound regime")
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes, best kept")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    rows = []
    for threads in args.threads:
        for batch_size in args.batch_sizes:
            for positions in args.positions:
                rows.append(measure(args.members, args.n_eval, positions, batch_size, threads,
                                    args.repeats))
                print(json.dumps(rows[-1]), flush=True)
    report = {"baseline": "per_member: pretrain_loss of each member, measured in the same run",
              "model": MODEL, "device": "cpu",
              "device_name": platform.processor() or platform.machine(),
              "torch": torch.__version__, "python": platform.python_version(),
              "load_avg_1m": os.getloadavg()[0],
              "command": "python bench/pack_measure.py " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv),
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pack_measure_cpu.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
