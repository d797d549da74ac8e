"""Sweep report: figures, correlation table and summary tables of one MLflow experiment.

    python analysis/report.py --experiment NAME --out DIR (--kl-threshold X | --loss-tolerance Y)
        [--tracking-uri URI] [--task TASK] [--n-boot N] [--seed S] [--no-log]
    python analysis/report.py --trials DIR --out DIR (--kl-threshold X | --loss-tolerance Y)

Writes to DIR: ``fig1_accuracy_scatter.png``, ``fig2_over_steps.png`` (when a run has several
checkpoints), ``fig3_over_size.png`` (when the model size varies), ``correlations.md`` / ``.csv``,
``table1_by_algorithm.md`` / ``.csv`` (by algorithm, and model where it varies, at the common
loss: its line says whether the losses are equal, ``analysis/tables.py``),
``table2_by_model.md`` / ``.csv``, ``selection.md`` / ``.csv`` / ``.png`` (would the flattest
checkpoint have been a better pick than the lowest-loss one: ``analysis/selection.py``),
``conclusion.md`` (a title and the settings: sweep, scale / protocol, task, saturation rule,
date; then the per-run tables with their reference rows, the runs left out, and what the runs
show and can conclude, in numbers: ``analysis/run_table.py``, ``analysis/conclusion.py``)
and ``runs.csv`` (the tidy table). The correlations and the model selection need runs: with
fewer than ``analysis.correlate.MIN_RUNS`` (5) in the saturation regime their Markdown is one
line saying why and their CSV has no rows. It prints the conclusion and the tables; and logs
every file as an artifact of the run named ``report`` in the experiment ``<experiment>.report``
(beside the sweep's, so that MLflow's charts of the sweep show only its
trials), which replaces the previous report's run.
Without ``--tracking-uri`` it uses ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``
(which must exist: run it where the sweep ran, its ``--workdir``). With ``--trials DIR`` it reads
trial directories instead (``analysis/trials.py``: what ``flatlm replicate`` and the sweeps
write), needs no MLflow store and logs nothing.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from datetime import datetime
from pathlib import Path

from analysis.checkpoints import RUN, short_name, varying_columns  # noqa: E402
from analysis.conclusion import conclusion  # noqa: E402
from analysis.correlate import (  # noqa: E402
    DEFAULT_BOOTSTRAP,
    X_KEYS,
    Bootstrap,
    correlation_markdown,
    correlation_table,
    saturated,
    saturation_rule,
    too_few_runs,
)
from analysis.figures import accuracy_scatter, metrics_over_size, metrics_over_steps  # noqa: E402
from analysis.labels import plain_name  # noqa: E402
from analysis.output import report_dir, write_csv, write_file  # noqa: E402
from analysis.run_table import glance  # noqa: E402
from analysis.selection import SELECTION_FILES, write_selection  # noqa: E402
from analysis.store import (  # noqa: E402
    accuracy_key,
    load_table,
    log_report,
    refuse_password,
    report_experiment,
)
from analysis.tables import summary_markdown, summary_table, table_rule  # noqa: E402
from flatlm.core.flags import COUNT, NON_NEGATIVE, POSITIVE, SEED  # noqa: E402
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_FISHER_GROWN  # noqa: E402
from flatlm.storage.metrics_log import N_PARAMS  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs = p.add_mutually_exclusive_group(required=True)
    runs.add_argument("--experiment", help="MLflow experiment name")
    runs.add_argument("--trials", type=Path,
                      help="a root of trial directories instead of an MLflow experiment")
    p.add_argument("--out", required=True, type=Path, help="directory for the outputs")
    p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI")
    p.add_argument("--task", default=None,
                   help="probe task: accuracy column probe/<task>/acc_mean (a full column name "
                        "with '/' is used as is); default: the first probe/*/acc_mean column")
    rule = p.add_mutually_exclusive_group(required=True)
    rule.add_argument("--kl-threshold", type=POSITIVE, default=None,
                      help="saturation regime (one of the two is required): pretrain/kl < X")
    rule.add_argument("--loss-tolerance", type=NON_NEGATIVE, default=None,
                      help="saturation regime: pretrain/loss - pretrain/entropy <= Y (no "
                           "entropy, e.g. real text: within Y of the lowest loss reached)")
    p.add_argument("--n-boot", type=COUNT, default=1000,
                   help="cluster-bootstrap resamples (runs resampled)")
    p.add_argument("--seed", type=SEED, default=0, help="bootstrap seed")
    p.add_argument("--source", choices=("auto", "artifact", "history"), default="auto",
                   help="per-checkpoint metrics from metrics.jsonl artifacts or histories")
    p.add_argument("--no-log", action="store_true", help="do not log the report run to MLflow")
    return p.parse_args(argv)


# Every file write_report may write (tests/analysis pins the list to what it writes): checked
# for links before any is written
REPORT_FILES = ("fig1_accuracy_scatter.png", "fig2_over_steps.png", "fig3_over_size.png",
                "correlations.csv", "correlations.md", "conclusion.md", "runs.csv",
                "table1_by_algorithm.csv", "table1_by_algorithm.md", "table2_by_model.csv",
                "table2_by_model.md", *SELECTION_FILES)


def write_report(df, out: Path, acc_key: str, *, kl_threshold=None, loss_tolerance=None,
                 boot: Bootstrap = DEFAULT_BOOTSTRAP, sweep: str | None = None,
                 when: datetime | None = None) -> tuple[list[Path], str]:
    """Write every output under ``out``; returns (paths, correlation Markdown). ``sweep``
    names the runs' source in ``conclusion.md``'s header (default: the runs' ``sweep``
    column), ``when`` its date (default: now)."""
    out = report_dir(out, files=REPORT_FILES)
    rule = dict(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)
    regime = saturated(df, **rule)
    with warnings.catch_warnings():  # an empty or thin regime is said in the conclusion
        warnings.simplefilter("ignore", UserWarning)
        table = correlation_table(df, acc_key, boot=boot, **rule)
    corr_md = correlation_markdown(table)
    paths = _figures(df, out, acc_key, regime, saturation_rule(**rule, df=df))
    head = report_header(df, acc_key, sweep=sweep, when=when, n_boot=boot.n, seed=boot.seed,
                         **rule)
    words = f"{head}\n\n{glance(df, acc_key, **rule)}\n\n{conclusion(df, table, acc_key, **rule)}"
    texts = {"correlations.md": corr_md + "\n", "conclusion.md": words + "\n"}
    write_csv(table.iloc[:0] if too_few_runs(table) else table, out / "correlations.csv")
    paths.append(out / "correlations.csv")
    for name, by, matched in (("table1_by_algorithm", table1_columns(df), True),
                              ("table2_by_model", ("model", "algorithm"), False)):
        summary = summary_table(df, acc_key, by=by, keys=("step", LOSS, KL, *X_KEYS[:2]),
                                match_loss=matched, kl_threshold=kl_threshold)
        write_csv(summary, out / f"{name}.csv")
        paths.append(out / f"{name}.csv")
        what = _table_title(name, acc_key, [b for b in by if b in df])
        texts[f"{name}.md"] = f"{table_rule(summary, what)}\n\n{summary_markdown(summary)}\n"
    if regime.any():  # which checkpoint flatness would pick vs the loss (analysis/selection.py)
        paths += write_selection(df, out, acc_key, n_boot=boot.n, seed=boot.seed, **rule)
    write_csv(df, out / "runs.csv")
    paths.append(out / "runs.csv")
    for name, text in texts.items():
        write_file(out / name, text)
        paths.append(out / name)
    return sorted(paths), corr_md


def table1_columns(df) -> tuple[str, ...]:
    """Table 1's groups: the algorithm (the paper's Table 1 is by algorithm; the runs'
    ``train.algorithm`` where it varies, else their ``algorithm`` tag), then the model where the
    sweep varies it."""
    varying = varying_columns(df, seeds=False)
    algorithm = next((c for c in ("train.algorithm", "algorithm") if c in varying),
                     next((c for c in ("algorithm", "train.algorithm") if c in df), "algorithm"))
    return (algorithm, *(["model"] if "model" in varying else []))


def _table_title(name: str, acc_key: str, by: list[str]) -> str:
    words = " and ".join(short_name(b) for b in by) or "all runs"
    number = "Table 1" if name.startswith("table1") else "Table 2"
    return f"**{number}**: {plain_name(acc_key)}, loss, KL and flatness by {words}"


def report_header(df, acc_key: str, *, sweep: str | None, when: datetime | None, n_boot: int,
                  seed: int, kl_threshold=None, loss_tolerance=None) -> str:
    """``conclusion.md``'s title and settings: the sweep, where it ran (scale / protocol, as
    the README names them), the task, the saturation rule, the bootstrap and the date."""
    sweep = sweep or _one_value(df, "sweep") or "(unnamed)"
    rule = saturation_rule(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance, df=df)
    lines = [f"# Report: sweep `{sweep}`", "",
             f"- sweep: `{sweep}`, {df[RUN].nunique()} runs, {len(df)} checkpoints",
             *([f"- scale / protocol: {where}"] if (where := _scale_protocol(df)) else []),
             f"- task: {_task(acc_key)} (`{acc_key}`)",
             f"- saturation rule: {rule}",
             f"- cluster bootstrap: {n_boot} resamples of runs, seed {seed}",
             f"- date: {(when or datetime.now()).isoformat(sep=' ', timespec='minutes')}"]
    return "\n".join(lines)


def _task(acc_key: str) -> str:
    """``probe/A/acc_mean`` -> ``A``; another column as it is."""
    parts = acc_key.split("/")
    return parts[1] if len(parts) == 3 else acc_key


def _scale_protocol(df) -> str:
    parts = [_one_value(df, c) for c in ("scale", "protocol")]
    return " / ".join(p or "?" for p in parts) if any(parts) else ""


def _one_value(df, column: str) -> str:
    """The runs' values of ``column``, joined ("" when it has none)."""
    if column not in df:
        return ""
    return ", ".join(sorted(df[column].dropna().astype(str).unique()))


def _figures(df, out: Path, acc_key: str, regime, rule: str) -> list[Path]:
    """Fig. 1 always; Figs. 2/4 when a run has several checkpoints; Figs. 3/5 when the model
    size varies (no figure for a dimension the sweep does not vary)."""
    paths = [accuracy_scatter(df, acc_key, out / "fig1_accuracy_scatter.png", regime=regime,
                              title=f"Fig. 1: {plain_name(acc_key)}; saturation regime {rule}")]
    if df.groupby(RUN)["step"].nunique().max() > 1:
        paths.append(metrics_over_steps(df, out / "fig2_over_steps.png", acc_key=acc_key,
                                        keys=(KL, TRACE_FISHER, acc_key)))
    if N_PARAMS in df and df[N_PARAMS].nunique() > 1:
        paths.append(metrics_over_size(df, out / "fig3_over_size.png",
                                       keys=(acc_key, KL, TRACE_FISHER, TRACE_FISHER_GROWN)))
    return paths


def main(argv=None) -> int:
    args = parse_args(argv)
    try:  # a password, a link or a file for --out, no store, no such directory, no accuracy
        if args.tracking_uri:  # also with --trials: a password is refused, never echoed
            refuse_password(args.tracking_uri)
        args.out = report_dir(args.out, files=REPORT_FILES)  # before any work
        df, uri = load_table(args)
        acc_key = None if df.empty else accuracy_key(df.columns, args.task)
    except ValueError as e:  # one line, no traceback
        raise SystemExit(f"error: {e}") from None
    if uri is None:
        args.no_log = True
    if df.empty:
        print(f"no runs in {args.experiment or 'the trial directories'} at "
              f"{uri or args.trials}", file=sys.stderr)
        return 1
    if acc_key not in df:
        raise SystemExit(f"error: column {acc_key!r} not in the runs; pass --task")
    rule = dict(kl_threshold=args.kl_threshold, loss_tolerance=args.loss_tolerance)
    paths, corr_md = write_report(df, args.out, acc_key,
                                  boot=Bootstrap(args.n_boot, seed=args.seed),
                                  sweep=args.experiment or str(args.trials), **rule)
    n_regime = int(saturated(df, **rule).sum())
    print((args.out / "conclusion.md").read_text())
    if n_regime:  # an empty table says nothing the conclusion has not said
        print(corr_md)
    print("\nTable 1:\n" + (args.out / "table1_by_algorithm.md").read_text())
    if not args.no_log:
        params = {"experiment": args.experiment, "accuracy": acc_key,
                  "rule": saturation_rule(**rule, df=df), "n_boot": args.n_boot, "seed": args.seed,
                  "runs": df["run_id"].nunique(), "checkpoints": len(df),
                  "checkpoints_in_regime": n_regime}
        run_id = log_report(uri, report_experiment(args.experiment), paths, params)
        print(f"logged to MLflow experiment {report_experiment(args.experiment)!r}, run "
              f"{run_id} ('report')")
    print(f"wrote {len(paths)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
