"""The replication report: for each claim of the paper, its number, ours with a 95% interval,
and a verdict (``analysis/claims.py`` states the rule); reference points; the Fig. 1 scatter;
and, when the trials include single-switch protocols (``flatlm replicate --diagnose``), which
switch changes the sign of the steps and sizes effects.

    python analysis/replication.py --trials repl/ --out repl/report/          # trial directories
    python analysis/replication.py --experiments replicate.paper.steps,... \\
        --tracking-uri sqlite:///$PWD/mlflow.db --out report/                  # MLflow runs

Writes ``replication.md``, ``claims.csv`` and figures (``steps.png``, ``sizes.png``,
``algorithms.png``, ``fig1_scatter.png``) under ``--out``; with ``--tracking-uri`` they are also
logged to MLflow as a run named ``replication`` (tag ``flatlm.report=1``).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import warnings
from pathlib import Path

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.claims import TOL, acc, algorithm_effects, claim_rows, final_rows, mean_ci, verdict  # noqa: E402
from analysis.correlate import MIN_RUNS, correlation_table, to_markdown  # noqa: E402
from analysis.runs import load_runs
from analysis.store import log_report, refuse_password
from analysis.trials import load_trials
from flatlm.experiments.protocols import describe
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_FISHER_GROWN  # noqa: E402

FIG1_TASK = "B"
SCATTER_TOL = 0.05  # nats above the smallest KL: the Fig. 1 set of "similar loss" checkpoints


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trials", type=Path, help="root of trial directories (flatlm replicate)")
    src.add_argument("--experiments",
                     help="comma-separated MLflow experiments replicate.<protocol>.<experiment> "
                          "(sweeps/replicate.py)")
    p.add_argument("--out", required=True, type=Path, help="directory for the report")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (read and log)")
    p.add_argument("--tol", type=float, default=TOL,
                   help=f"nats: KL differences that count as the same loss (default {TOL})")
    p.add_argument("--command", default=None, help="the command that made the trials (quoted "
                                                    "in the report)")
    p.add_argument("--hardware", default=None, help="where the trials ran (quoted)")
    p.add_argument("--no-log", action="store_true", help="do not log to MLflow")
    return p.parse_args(argv)


def load(args) -> pd.DataFrame:
    if args.trials is not None:
        return load_trials(args.trials)
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise SystemExit("--experiments needs --tracking-uri (or $MLFLOW_TRACKING_URI)")

    refuse_password(uri)
    frames = []
    for name in args.experiments.split(","):
        _, protocol, experiment = name.split(".")
        frames.append(load_runs(uri, name).assign(protocol=protocol, experiment=experiment))
    return pd.concat(frames, ignore_index=True)


def scatter_row(df: pd.DataFrame, task: str = FIG1_TASK) -> dict | None:
    """Fig. 1: Spearman of Tr(F) and of the loss with accuracy over the checkpoints within
    ``SCATTER_TOL`` of the smallest KL, with cluster-bootstrap intervals over runs."""
    key = acc(task)
    if key not in df or TRACE_FISHER not in df or df[KL].isna().all():
        return None
    threshold = float(df[KL].min()) + SCATTER_TOL
    with warnings.catch_warnings():  # few points: constant-input warnings; the note says n
        warnings.simplefilter("ignore")
        table = correlation_table(df, key, x_keys=(TRACE_FISHER, LOSS),
                                  kl_threshold=threshold, n_boot=1000, min_runs=0)
    rows = table[table["method"] == "spearman"].set_index("x")
    if TRACE_FISHER not in rows.index:
        return None
    tr, loss = rows.loc[TRACE_FISHER], rows.loc[LOSS] if LOSS in rows.index else None
    note = (f"{int(tr['n'])} checkpoints of {int(tr['runs'])} runs with KL < {threshold:.3f}"
            + (f"; Spearman(loss, acc) = {loss['r']:+.2f} [{loss['ci_low']:+.2f}, "
               f"{loss['ci_high']:+.2f}]" if loss is not None else ""))
    ok = int(tr["runs"]) >= MIN_RUNS  # a cluster bootstrap over fewer runs is too narrow
    return {"experiment": "all", "figure": "Fig. 1",
            "metric": f"Spearman({TRACE_FISHER}, {key})",
            "claim": "among checkpoints of similar loss, the flatter probe better",
            "paper": "strong",
            "sign": -1, "effect": tr["r"], "ci_low": tr["ci_low"], "ci_high": tr["ci_high"],
            "n": int(tr["runs"]), "precondition": ok,
            "note": note + ("" if ok else f"; fewer than {MIN_RUNS} runs"),
            "verdict": verdict(-1, (tr["ci_low"], tr["ci_high"]), ok),
            "seeds_to_resolve": np.nan}


def protocol_table(df: pd.DataFrame, tol: float) -> pd.DataFrame:
    rows = claim_rows(df, tol)
    scatter = scatter_row(df)
    if scatter is not None:
        rows = pd.concat([rows, pd.DataFrame([scatter])], ignore_index=True)
    return rows


def reference_points(df: pd.DataFrame) -> pd.DataFrame:
    """Per task, at the final checkpoints of AdamW runs: the trained probe, a random model of
    the same shape, the lookup table and the majority class (means over runs)."""
    final = final_rows(df)
    final = final[final.get("train.algorithm", "adamw") == "adamw"]
    tasks = sorted({c.split("/")[1] for c in final if c.startswith("probe/")
                    and c.endswith("/acc_mean")})
    out = []
    for task in tasks:
        row = {"task": task}
        for stage in ("probe", "random_init", "lookup"):
            key = f"{stage}/{task}/acc_mean"
            row[stage] = final[key].mean() if key in final else np.nan
        row["majority"] = final.get(f"probe/{task}/majority_acc", pd.Series(np.nan)).mean()
        row["n_test"] = final.get(f"probe/{task}/n_test", pd.Series(np.nan)).mean()
        out.append(row)
    return pd.DataFrame(out)


def claims_markdown(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "_no claim has trials here_"
    shown = rows.assign(
        ours=[_interval(r) for r in rows.itertuples()],
        to_change=[_to_change(r) for r in rows.itertuples()])
    cols = ["figure", "claim", "metric", "paper", "ours", "verdict", "note", "to_change"]
    return to_markdown(shown[cols])


def _interval(r) -> str:
    if not np.isfinite(r.effect):
        return "n/a"
    return f"{r.effect:+.4g} [{r.ci_low:+.4g}, {r.ci_high:+.4g}] (n={r.n})"


def _to_change(r) -> str:
    if not r.precondition:
        return "meet the precondition (longer runs / larger models)"
    if r.verdict == "inconclusive":
        s = r.seeds_to_resolve
        return f"~{int(s)} seeds at this effect" if np.isfinite(s) else "more seeds"
    edge = min(abs(r.ci_low), abs(r.ci_high))
    return f"an interval edge {edge:.3g} from 0"


DIAGNOSIS = (("steps", acc("C")), ("steps", TRACE_FISHER), ("sizes", acc("B")),
             ("sizes", TRACE_FISHER_GROWN))
LOOKUP_GAP = "lookup - probe, task B (final steps checkpoints)"


def diagnosis_table(tables: dict[str, pd.DataFrame], df: pd.DataFrame,
                    base: str = "paper") -> pd.DataFrame:
    """Per protocol (``base`` and ``base+switch``): the steps and sizes effects (the claims'
    sign-bearing rows), and the gap between the lookup table and the trained model's probe
    (Table 1's lookup row: the paper finds the lookup table worse)."""
    out = []
    for protocol, rows in tables.items():
        if protocol != base and not protocol.startswith(base + "+"):
            continue
        entry = {"protocol": protocol, LOOKUP_GAP: _lookup_gap(df[df["protocol"] == protocol])}
        for experiment, metric in DIAGNOSIS:
            hit = rows[(rows["experiment"] == experiment) & (rows["metric"] == metric)]
            entry[f"{experiment}: {metric}"] = (
                f"{hit.iloc[0]['effect']:+.3g} [{hit.iloc[0]['ci_low']:+.3g}, "
                f"{hit.iloc[0]['ci_high']:+.3g}] {hit.iloc[0]['verdict']}"
                if len(hit) and np.isfinite(hit.iloc[0]["effect"]) else "n/a")
        out.append(entry)
    return pd.DataFrame(out)


def _lookup_gap(part: pd.DataFrame) -> str:

    steps = part[part["experiment"] == "steps"]
    if steps.empty or "lookup/B/acc_mean" not in steps:
        return "n/a"
    res = algorithm_effects(steps, "lookup:B", "lookup", "adamw", tol=float("inf"))
    mean, low, high, n = mean_ci(res["effects"], res["ses"])
    return f"{mean:+.3g} [{low:+.3g}, {high:+.3g}] (n={n})" if np.isfinite(mean) else "n/a"


def write_report(df: pd.DataFrame, out: Path, *, tol: float = TOL, command: str | None = None,
                 hardware: str | None = None) -> list[Path]:
    from analysis.replication_figures import algorithm_bars, over_sizes, over_steps, scatter

    out.mkdir(parents=True, exist_ok=True)
    protocols = sorted(p for p in df["protocol"].dropna().unique())
    tables = {p: protocol_table(df[df["protocol"] == p], tol) for p in protocols}
    claims = pd.concat([t.assign(protocol=p) for p, t in tables.items()], ignore_index=True)
    paths = [out / "claims.csv"]
    claims.to_csv(paths[0], index=False)
    main = [p for p in protocols if "+" not in p]
    paths += [over_steps(df[df["protocol"].isin(main)], out / "steps.png"),
              over_sizes(df[df["protocol"].isin(main)], out / "sizes.png"),
              algorithm_bars(df[df["protocol"].isin(main)], out / "algorithms.png"),
              scatter(df[df["protocol"].isin(main)], out / "fig1_scatter.png", acc(FIG1_TASK))]
    md = out / "replication.md"
    md.write_text(_markdown(df, tables, main, tol, command, hardware))
    return [md, *paths]


def _markdown(df, tables, main, tol, command, hardware) -> str:

    lines = ["# Replication of Liu et al. (ICML 2023) with flatlm", ""]
    if command:
        lines += [f"Made by: `{command}`", ""]
    lines += [f"Hardware: {hardware or platform.platform()}; "
              f"{df['run_id'].nunique()} trials, {len(df)} checkpoints.", "",
              "## Rule", "",
              "Each effect is computed per training seed and averaged; its interval is the 95% "
              "Student-t interval over seeds. A claim's precondition is the paper's *same "
              f"pre-training loss*: KL differences within {tol} nats (see `analysis/claims.py`"
              "). Verdict: precondition unmet -> inconclusive (precondition); interval on the "
              "paper's side of 0 -> reproduces; on the other side -> contradicts; else "
              "inconclusive. Tr(H) in the paper is its B.1 estimator, which is Tr(F) "
              "(`flat/trace_fisher`) here.", ""]
    for protocol in main:
        part = df[df["protocol"] == protocol]
        lines += [f"## Protocol `{protocol}`", "", describe(protocol) + ".", "",
                  _sizes_line(part), "", claims_markdown(tables[protocol]), "",
                  "Reference points (final AdamW checkpoints, mean over runs):", "",
                  to_markdown(reference_points(part)), ""]
    diag = diagnosis_table(tables, df)
    if len(diag) > 1:
        lines += ["## Diagnosis: which protocol switch decides the verdicts", "",
                  "The `paper` protocol with one switch at a time (`flatlm replicate "
                  "--diagnose`): effect [95% interval] and verdict of the steps and sizes "
                  "claims, and the lookup table's accuracy minus the trained probe's. A switch "
                  "that moves an interval to the other side of 0 decides that verdict. Rows with "
                  "n=1 have an interval from the measurement's own standard error only, not the "
                  "seed-to-seed spread: read them as signs, not verdicts.", "",
                  to_markdown(diag), ""]
    lines += ["## Figures", "", "![steps](steps.png)", "", "![sizes](sizes.png)", "",
              "![algorithms](algorithms.png)", "", "![fig1](fig1_scatter.png)", ""]
    return "\n".join(lines)


def _sizes_line(part: pd.DataFrame) -> str:
    final = final_rows(part)
    models = ", ".join(sorted(final["model"].dropna().unique()))
    seeds = sorted(final["train.seed"].dropna().unique().tolist()) if "train.seed" in final \
        else []
    kl = mean_ci(final[KL])[0] if KL in final else np.nan
    return (f"Models: {models}. Seeds: {seeds}. Final KL (mean over runs): {kl:.3f} nats; "
            f"source entropy {final['pretrain/entropy'].mean():.3f}.")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tracking_uri:  # before anything is read: a password is refused, never echoed

        refuse_password(args.tracking_uri)
    df = load(args)
    if df.empty:
        print("no trials found", file=sys.stderr)
        return 1
    unfinished = df.loc[df["status"] != "FINISHED", "run_id"].unique()
    if len(unfinished):  # a half-run trial would bias the plateau and final-checkpoint effects
        print(f"leaving out {len(unfinished)} unfinished trial(s): {', '.join(unfinished)}",
              file=sys.stderr)
        df = df[df["status"] == "FINISHED"]
    paths = write_report(df, args.out, tol=args.tol, command=args.command,
                         hardware=args.hardware)
    print((args.out / "replication.md").read_text())
    if args.tracking_uri and not args.no_log:
        run_id = log_report(args.tracking_uri, "replication", paths,
                            {"tol": args.tol, "trials": df["run_id"].nunique()})
        print(f"logged to MLflow run {run_id}")
    print(f"wrote {len(paths)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
