"""The head-to-head of measures (issue 25): which measure predicts probe accuracy at equal loss,
on the testbed replication's trials (``analysis/leaderboard.py``).

    flatlm replicate --scale testbed --protocol paper --out repl/          # the runs
    python bench/selection_leaderboard.py --trials repl/ --out bench/results/selection \\
        [--wall-min M] [--hardware TEXT] [--n-boot 2000] [--seed 0] [--kl-threshold 0.02]

``--trials`` takes several roots; only the trials of ``--protocol`` count (default ``paper``:
the label rule and the probe differ between protocols, so their accuracies do not compare).
The records of every trial that is not one of the paper's experiments (the selection
experiment's lr axis) are copied to ``--out/trials``, so that the committed board is rebuilt
from the repository alone, beside the replication's own records:

    python bench/selection_leaderboard.py --trials bench/results/replication_testbed/trials \\
        bench/results/selection/trials

Testbed v2 (issues 50, 54) is read at matched loss: its replication's records beside the
selection measures of the same trainings (``bench/selection_v2.py``, merged by
``analysis.same_training``), in the band 0.65 <= KL < 0.75 around its target 0.7, soft targets'
arm pooled with the paper protocol's (one label rule, one probe), and the claims a raw trace
decides re-read by the invariant measures (``--target-kl``: ``invariant_verdicts.md``):

    python bench/selection_leaderboard.py --trials bench/results/replication_testbed_v2/trials \\
        bench/results/selection_v2/trials --out bench/results/selection_v2 \\
        --protocol paper,paper+soft-targets --kl-from 0.65 --kl-threshold 0.75 --target-kl 0.7

Writes under ``--out``: ``leaderboard.md`` / ``.csv`` / ``.png`` and ``leaderboard.json``: the
command, the analysis's wall time, the trials by status, the checkpoints, each group's runs,
shapes, measures and candidates per task, and the settings. Trials still running count with the
checkpoints they have measured; the JSON says how many there were.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd

from analysis.claims import VerdictRule
from analysis.correlate import RUN
from analysis.invariant_verdicts import invariant_markdown, invariant_verdicts
from analysis.leaderboard import (
    KL_THRESHOLD,
    TASKS,
    Board,
    leaderboard,
    of_protocols,
    write_leaderboard,
)
from analysis.same_training import merge_same_training
from analysis.trials import copy_records, load_trials, trial_dirs
from flatlm.experiments.grids import EXPERIMENTS
from flatlm.measure import LOSS


def counts(df, board: Board) -> dict:
    """What the leaderboard rests on: trials by status, checkpoints, and per group its runs,
    shapes, measures and (per task) the loss's candidates and runs."""
    t = board.table
    groups = {}
    for g in board.groups:
        loss = t[(t.group == g.name) & (t.measure == LOSS)]
        per_task = {task: {s: int(v) for s, v in zip(part.statistic, part.value, strict=True)
                           if s in ("n_candidates", "n_runs")}
                    for task, part in loss.groupby("task")}
        groups[g.name] = {"runs": len(g.runs), "shapes": g.shapes, "measures": g.measures,
                          "tasks": per_task}
    status = df.groupby(RUN)["status"].first().value_counts()
    return {"trials": int(df[RUN].nunique()), "trials_by_status": status.to_dict(),
            "checkpoints": len(df), "rule": board.rule, "groups": groups}


def load_roots(roots: list[Path]) -> pd.DataFrame:
    """The trials under every root, as one frame; a trial found under two roots is an error
    (its run id, the path under its root, would count it twice)."""
    frames = [load_trials(root) for root in roots]
    roots_of = Counter(run for f in frames for run in set(f["run_id"]))
    twice = sorted(run for run, n in roots_of.items() if n > 1)
    if twice:
        raise ValueError(f"--trials: {twice[0]} is under more than one root; name each once")
    df = pd.concat(frames, ignore_index=True)
    df.attrs["params"] = sorted({p for f in frames for p in f.attrs["params"]})
    df.attrs["metrics"] = sorted({m for f in frames for m in f.attrs["metrics"]})
    return df


def copy_extra_records(roots: list[Path], records: Path) -> list[str]:
    """Copy the records of the trials outside the paper's experiments (``<protocol>/
    <experiment>/<trial>`` with another experiment) to ``records`` (those already there
    stay); their relative paths."""
    copied = []
    for root in roots:
        extra = [t for t in trial_dirs(root) if _outside_the_paper(t.relative_to(root))]
        elsewhere = [t for t in extra if (records / t.relative_to(root)).resolve() != t.resolve()]
        copy_records(elsewhere, root, records)
        copied += [str(t.relative_to(root)) for t in extra]
    return copied


def _outside_the_paper(rel: Path) -> bool:
    return len(rel.parts) == 3 and rel.parts[1] not in EXPERIMENTS


def write_invariant_verdicts(df: pd.DataFrame, target_kl: float, out: Path) -> list[Path]:
    """The raw traces' claims re-read by the invariant measures at ``target_kl``, from the
    trials of one training merged into one run (the replication's and the selection's)."""
    rule = VerdictRule(target_kl=target_kl)
    rows = invariant_verdicts(merge_same_training(df)[0], rule)
    md, csv = out / "invariant_verdicts.md", out / "invariant_verdicts.csv"
    md.write_text(invariant_markdown(rows, rule))
    rows.to_csv(csv, index=False)
    return [md, csv]


def code_commit() -> str | None:
    """The repository's commit, for the record (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", required=True, type=Path, nargs="+",
                   help="the replication's root (or several)")
    p.add_argument("--out", type=Path, default=Path("bench/results/selection"))
    p.add_argument("--kl-threshold", type=float, default=KL_THRESHOLD)
    p.add_argument("--kl-from", type=float, default=None,
                   help="the window's lower edge: a matched band [LOW, --kl-threshold) around "
                        "a target KL (testbed v2: 0.65 0.75) instead of the saturated window")
    p.add_argument("--target-kl", type=float, default=None,
                   help="also re-read the claims decided by a raw trace with the invariant "
                        "measures at this KL (analysis/invariant_verdicts.py): "
                        "invariant_verdicts.md / .csv")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--n-boot", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--wall-min", type=float, default=None,
                   help="the replication's wall time in minutes, as its runner measured it")
    p.add_argument("--hardware", default=None, help="the hardware the trials ran on")
    p.add_argument("--protocol", default="paper",
                   help="comma-separated protocols whose trials count (default: paper)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    command = shlex.join(["python", "bench/selection_leaderboard.py", *argv])
    start = time.perf_counter()
    try:
        df = load_roots(args.trials)
        if df.empty:
            raise ValueError(f"--trials {' '.join(map(str, args.trials))}: no trial "
                             "directories under it")
        protocols = args.protocol.split(",")
        df = of_protocols(df, protocols)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    copied = copy_extra_records(args.trials, args.out / "trials")
    try:
        board = leaderboard(df, tasks=args.tasks.split(","), kl_threshold=args.kl_threshold,
                            kl_from=args.kl_from, n_boot=args.n_boot, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    paths = write_leaderboard(board, args.out, command=command, wall_min=args.wall_min,
                              hardware=args.hardware, protocols=protocols)
    if args.target_kl is not None:
        paths += write_invariant_verdicts(df, args.target_kl, args.out)
    record = {"command": command, "analysis_wall_s": round(time.perf_counter() - start, 1),
              "code_commit": code_commit(), "n_boot": args.n_boot, "seed": args.seed,
              "kl_threshold": args.kl_threshold, "kl_from": args.kl_from,
              "target_kl": args.target_kl, "protocols": protocols,
              "data_wall_min": args.wall_min,
              "data_hardware": args.hardware, **counts(df, board),
              "files": [p.name for p in paths], "records_copied": copied}
    (args.out / "leaderboard.json").write_text(json.dumps(record, indent=1) + "\n")
    print((args.out / "leaderboard.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
