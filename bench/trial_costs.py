"""The committed cost table ``flatlm/experiments/data/trial_costs.json`` (``flatlm.experiments.
costs``), from the committed trials' own timings: per model, algorithm and batch the seconds a
training step took (each trial's ``time/train_s`` summed over its checkpoints, over the steps it
trained), per model, measurement set and downstream-set size the seconds a checkpoint's
measurements took (each trial's ``time/measure_s`` over its checkpoints, the first one's
evaluation data and reference probes included); the median over trials. The GPU rows are typed from
``bench/results/gpu_replication_h200.md`` (no trial records came back from that run).

    python bench/trial_costs.py                 # rewrites the table from the records
    python bench/trial_costs.py --check         # exit 1 when the table is not the records'
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ("bench/results/replication_testbed/trials",
           "bench/results/replication_testbed_v2/trials")
TABLE = ROOT / "flatlm" / "experiments" / "data" / "trial_costs.json"
CPU = "cpu"  # one torch thread a trial, two trials on the 2-core machine that ran them
GPU_SOURCE = ("bench/results/gpu_replication_h200.md: per process, 15 testbed processes "
              "sharing one H200")
GPU_ROWS = {  # from that file's table: 27 steps/s (sizes), 29-32 (steps); 44-158 s a checkpoint
    "train": [{"device": "gpu", "model": "d64-h4-l2-i256-pre", "algorithm": "adamw",
               "batch_size": 256, "seconds": 1 / 27, "trials": 5, "source": GPU_SOURCE},
              {"device": "gpu", "model": "d64-h4-l3-i256-pre", "algorithm": "adamw",
               "batch_size": 256, "seconds": 1 / 27, "trials": 3, "source": GPU_SOURCE}],
    "measure": [{"device": "gpu", "model": "d64-h4-l2-i256-pre", "batch_size": 1,
                 "measure_what": None, "seconds": (44 + 158) / 2, "trials": 13,
                 "source": GPU_SOURCE + " (the midpoint of 44-158 s)"}],
}


# Trials timed with 4-6 processes sharing 2 cores (the session of 2026-12-02): their seconds are
# wall time under contention, 2-5x one thread's, and stay out of the table (their records stay)
CONTENDED = ("bench/results/replication_testbed_v2/trials/paper/algorithms",
             "bench/results/replication_testbed_v2/trials/paper+soft-targets/algorithms")


def trial_timings(trial: Path) -> dict | None:
    """One trial's model, algorithm, batch, measurement set, seconds a step and seconds a
    checkpoint; None when it trained nothing here (another trial's checkpoints)."""
    cfg = json.loads((trial / "config.json").read_text())
    rows = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    train_s = sum(r.get("time/train_s", 0.0) for r in rows)
    steps = max((r["step"] for r in rows), default=0)
    if train_s <= 0 or steps <= 0:
        return None
    return {"model": cfg["model"], "algorithm": cfg["train"]["algorithm"],
            "batch_size": cfg["train"]["batch_size"],
            "measure_what": sorted(cfg["measure"]["what"]),
            "n_downstream": cfg["measure"]["n_downstream"], "step_s": train_s / steps,
            "checkpoint_s": sum(r.get("time/measure_s", 0.0) for r in rows) / len(rows),
            "trial": str(trial.relative_to(ROOT))}


def table_of(timings: list[dict]) -> dict:
    """The medians over trials, as ``flatlm.experiments.costs`` reads them."""
    train, measure = defaultdict(list), defaultdict(list)
    for t in timings:
        train[(t["model"], t["algorithm"], t["batch_size"])].append(t["step_s"])
        measure[(t["model"], tuple(t["measure_what"]), t["n_downstream"])].append(t["checkpoint_s"])
    source = ", ".join(RECORDS) + f" ({CPU}: one torch thread a trial)"
    return {
        "train": [{"device": CPU, "model": m, "algorithm": a, "batch_size": b,
                   "seconds": statistics.median(v), "trials": len(v), "source": source}
                  for (m, a, b), v in sorted(train.items())] + GPU_ROWS["train"],
        "measure": [{"device": CPU, "model": m, "batch_size": 1, "measure_what": list(w),
                     "n_downstream": n, "seconds": statistics.median(v), "trials": len(v),
                     "source": source}
                    for (m, w, n), v in sorted(measure.items())] + GPU_ROWS["measure"],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare, do not write")
    args = p.parse_args(argv)
    trials = sorted(c.parent for root in RECORDS for c in (ROOT / root).glob("**/config.json")
                    if not str(c.parent.relative_to(ROOT)).startswith(CONTENDED))
    timings = [t for t in map(trial_timings, trials) if t]
    text = json.dumps(table_of(timings), indent=1) + "\n"
    if args.check:
        same = TABLE.exists() and TABLE.read_text() == text
        print("the table is the records'" if same else f"{TABLE} differs from the records")
        return 0 if same else 1
    TABLE.write_text(text)
    print(f"{len(timings)} trials -> {TABLE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
