"""The testbed replication's committed report (issue 23, item 4): the finished trials' records, the
replication report on them, and the testbed criteria measured on those same runs.

    flatlm replicate --scale testbed --protocol paper --jobs 2 --out repl/   # the runs
    python bench/replication_testbed.py --trials repl/ --wall-min 118        # this report

Writes under ``--out`` (default ``bench/results/replication_testbed``):
- ``trials/<protocol>/<experiment>/<trial>/{config.json,metrics.jsonl}``: each *finished* trial's
  records (no checkpoints); a trial still running is left out and named in ``criteria.md``.
- ``replication.md``, ``claims.csv`` and the figures: ``analysis/replication.py`` on those
  records (every claim's verdict under each protocol run).
- ``criteria.md`` / ``criteria.json``: the testbed's criteria (``bench/testbed_search.py``'s
  CRITERIA, fixed before the search) measured on the replication's own runs: (a) every AdamW
  run's final KL; (b) per task, the best trained probe against random-init features and the
  majority share; (c) the trials' CPU time and, when given, the wall time; (d) the adversary's
  final KL against AdamW's, seed by seed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.replication import main as replication_report
from analysis.trials import finished_trials, load_trials, replace_records  # noqa: F401 (tests)

# the criteria as the search fixed them before any run (bench/testbed_search.py's CRITERIA, saved
# with its results)
SEARCH = Path(__file__).parent / "results" / "testbed_search.json"
CRITERIA = json.loads(SEARCH.read_text())["criteria"]

KL = "pretrain/kl"
TASKS = ("A", "B", "C")
ADAMW_LIKE = ("adamw",)  # criterion (a): AdamW runs (sizes, steps, algorithms' adamw)


def final_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df.sort_values("step").groupby("run_id").tail(1)


def criterion_a(final: pd.DataFrame) -> list[dict]:
    adamw = final[final["train.algorithm"].isin(ADAMW_LIKE)]
    return [{"protocol": r["protocol"], "run": f"{r['experiment']}/{r['trial']}",
             "kl": float(r[KL]), "met": bool(r[KL] <= CRITERIA["kl_max"])}
            for _, r in adamw.sort_values(["protocol", "experiment", "trial"]).iterrows()]


def criterion_b(final: pd.DataFrame) -> list[dict]:
    rows = []
    for protocol, part in final.groupby("protocol"):
        for task in TASKS:
            probe, rand = f"probe/{task}/acc_mean", f"random_init/{task}/acc_mean"
            if probe not in part or part[probe].isna().all():
                continue
            best, random_init = float(part[probe].max()), float(part[rand].mean())
            majority = float(part[f"probe/{task}/majority_acc"].mean())
            gain = best - random_init
            rows.append({"protocol": protocol, "task": task, "best_probe": best,
                         "random_init": random_init, "gain": gain, "majority": majority,
                         "met": bool(gain >= CRITERIA["probe_gain_min"]
                                     and majority <= CRITERIA["majority_max"])})
    return rows


def criterion_c(df: pd.DataFrame, wall_min: float | None) -> dict:
    per_trial = df.groupby("run_id")[["time/train_s", "time/measure_s"]].sum().sum(axis=1)
    cpu_s = float(per_trial.sum())
    return {"trials": int(per_trial.size), "cpu_min": cpu_s / 60,
            "two_workers_min": cpu_s / 60 / CRITERIA["workers"], "wall_min": wall_min,
            "budget_min": CRITERIA["replication_budget_s"] / 60}


def criterion_d(final: pd.DataFrame) -> list[dict]:
    algo = final[final["experiment"] == "algorithms"]
    rows = []
    for (protocol, seed), part in algo.groupby(["protocol", "train.seed"]):
        kl = part.set_index("train.algorithm")[KL]
        if {"adamw", "adversarial"} <= set(kl.index):
            gap = float(kl["adversarial"] - kl["adamw"])
            rows.append({"protocol": protocol, "seed": int(seed), "adamw": float(kl["adamw"]),
                         "adversarial": float(kl["adversarial"]), "gap": gap,
                         "met": bool(abs(gap) <= CRITERIA["adversary_kl_tol"])})
    return rows


def criteria_markdown(crit: dict, running: list[str], command: str) -> str:
    yes = {True: "yes", False: "**no**"}
    lines = ["# The testbed criteria, measured on the replication's runs", "",
             f"Runs: `{command}`. Criteria fixed before the testbed search "
             "(`bench/testbed_search.py` CRITERIA): " + json.dumps(CRITERIA), "",
             "## (a) every AdamW run ends at KL <= "
             f"{CRITERIA['kl_max']} nats/token", "",
             "| protocol | run | final KL | met |", "|---|---|---|---|"]
    lines += [f"| {r['protocol']} | {r['run']} | {r['kl']:.4f} | {yes[r['met']]} |"
              for r in crit["a"]]
    met = sum(r["met"] for r in crit["a"])
    lines += ["", f"{met} of {len(crit['a'])} AdamW runs meet (a).", "",
              f"## (b) best trained probe - random-init >= {CRITERIA['probe_gain_min'] * 100:.0f}"
              f" points, majority <= {CRITERIA['majority_max'] * 100:.0f}%", "",
              "| protocol | task | best probe | random-init | gain | majority | met |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['protocol']} | {r['task']} | {r['best_probe']:.3f} | {r['random_init']:.3f}"
              f" | {r['gain'] * 100:+.1f} pts | {r['majority'] * 100:.1f}% | {yes[r['met']]} |"
              for r in crit["b"]]
    c = crit["c"]
    wall = "not recorded" if c["wall_min"] is None else f"{c['wall_min']:.0f} min"
    lines += ["", "## (c) time", "",
              f"{c['trials']} finished trials; {c['cpu_min']:.0f} CPU-minutes of training and "
              f"measuring (one thread each), {c['two_workers_min']:.0f} min on 2 workers if "
              f"perfectly packed; wall time {wall}; budget {c['budget_min']:.0f} min for the "
              "whole replication (5 seeds for steps/sizes, 3 for algorithms/sgd, both "
              "protocols).", "",
              "The no-argument sweeps (one seed each, <= 10 min on 2 cores) are timed "
              "separately: `bench/results/sweep_defaults.md`.", "",
              f"## (d) the adversary within {CRITERIA['adversary_kl_tol']} nats of AdamW's KL", "",
              "| protocol | seed | AdamW KL | adversarial KL | gap | met |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['protocol']} | {r['seed']} | {r['adamw']:.4f} | {r['adversarial']:.4f} | "
              f"{r['gap']:+.4f} | {yes[r['met']]} |" for r in crit["d"]]
    if running:
        lines += ["", "Left out (not finished when this report was made): "
                  + ", ".join(f"`{r}`" for r in running) + "."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=Path, required=True, help="flatlm replicate's --out")
    p.add_argument("--out", type=Path, default=Path("bench/results/replication_testbed"))
    p.add_argument("--wall-min", type=float, default=None,
                   help="the replication's wall time in minutes, as measured by its runner")
    p.add_argument("--command", default="flatlm replicate --scale testbed --protocol paper "
                   "--jobs 2 --out repl/", help="the command that ran the trials")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    records = args.out / "trials"
    done, running = replace_records(args.trials, records)
    if not done:
        print(f"--trials {args.trials}: no finished trial", file=sys.stderr)
        return 2
    df = load_trials(records)
    final = final_rows(df)
    crit = {"a": criterion_a(final), "b": criterion_b(final), "c": criterion_c(df, args.wall_min),
            "d": criterion_d(final)}
    unfinished = [str(t.relative_to(args.trials)) for t in running]
    (args.out / "criteria.json").write_text(json.dumps(
        {"criteria": CRITERIA, "measured": crit, "left_out": unfinished}, indent=1,
        default=lambda v: None if isinstance(v, float) and np.isnan(v) else v) + "\n")
    (args.out / "criteria.md").write_text(criteria_markdown(crit, unfinished, args.command))
    return replication_report(["--trials", str(records), "--out", str(args.out), "--no-log",
                               "--command", args.command])


if __name__ == "__main__":
    sys.exit(main())
