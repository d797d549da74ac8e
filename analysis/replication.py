"""The replication report: for each claim of the paper, where it says it (figure, section, the
paper's setting; an analogue when the paper tested it on other data), its effect, ours with a 95%
interval, what decided the verdict, and the verdict (``analysis/claims.py`` states the rule);
Fig. 1 as a partial correlation given the loss (``analysis/fig1.py``); reference points; and,
when the trials include single-switch protocols (``flatlm replicate --diagnose``), which switch
changes the sign of the steps and sizes effects and of Table 1's adversary; when they include a
robustness protocol (a base with ``+second-grammar``: the same experiments on another grammar of
the family), each of its claims beside the base protocol's (the robustness column).

    python analysis/replication.py --trials repl/ --out repl/report/          # trial directories
    python analysis/replication.py --experiments replicate.paper.steps,... \\
        --tracking-uri sqlite:///$PWD/mlflow.db --out report/                  # MLflow runs

Where the trials include Muon or an ablation protocol (``paper+soft-targets``), the claims
beyond the paper (``analysis/beyond.py``) follow, in ``beyond.csv`` too.

Writes ``replication.md``, ``claims.csv`` and figures (``steps.png``, ``sizes.png``,
``algorithms.png``, ``fig1_scatter.png``) under ``--out``; with ``--tracking-uri`` they are also
logged to MLflow as a run named ``replication`` (tag ``flatlm.report=1``).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import matched
from analysis.beyond import beyond_rows
from analysis.claims import (  # noqa: E402
    AT_CEILING,
    AT_FLOOR,
    CLAIMS,
    DEFAULT_RULE,
    MIN_SEEDS,
    NO_SIZE,
    NOT_SATURATED,
    TOL,
    UNDERPOWERED,
    VerdictRule,
    acc,
    algorithm_effects,
    claim_rows,
    compared_metric,
    final_rows,
    mean_ci,
    summarise,
    with_holm,
)
from analysis.correlate import to_markdown  # noqa: E402
from analysis.fig1 import DEFAULT_FIG1, MIN_RUNS, Fig1Settings, fig1_rows  # noqa: E402
from analysis.matched import CONFOUND_SHARE
from analysis.output import report_dir, write_csv, write_file
from analysis.paper_claims import FIG5_TASK
from analysis.room import ROOM_FACTOR
from analysis.runs import load_runs
from analysis.store import log_report, refuse_password
from analysis.trials import load_trials
from flatlm.core.flags import COUNT, NON_NEGATIVE, POSITIVE
from flatlm.experiments.protocols import describe, is_ablation, is_robustness, parse_protocol
from flatlm.measure import KL, SATURATED_KL, TRACE_FISHER_GROWN  # noqa: E402


def _protocol_target(text: str) -> tuple[str, float]:
    """``PROTOCOL=KL`` of --protocol-target-kl, checked before any work."""
    protocol, sep, kl = text.partition("=")
    try:
        parse_protocol(protocol)
        value = float(kl) if sep else math.nan
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r}: {e}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give PROTOCOL=KL with a KL in nats/token "
                                         "> 0, e.g. paper+second-grammar=0.9")
    return protocol, value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trials", type=Path, help="root of trial directories (flatlm replicate)")
    src.add_argument("--experiments",
                     help="comma-separated MLflow experiments replicate.<protocol>.<experiment> "
                          "(sweeps/replicate.py)")
    p.add_argument("--out", required=True, type=Path, help="directory for the report")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (read and log)")
    p.add_argument("--saturation", type=POSITIVE, default=SATURATED_KL,
                   help="nats/token: a checkpoint is saturated when its KL to the truth is at "
                        f"most this; unsaturated claims reach no verdict (default {SATURATED_KL})")
    p.add_argument("--tol", type=NON_NEGATIVE, default=TOL,
                   help="nats: the compared checkpoints' KLs lie within this of each other "
                        f"(default {TOL})")
    p.add_argument("--target-kl", type=POSITIVE, default=None,
                   help="nats/token: read unsaturated arms where their KL crosses this (the "
                        "matched-loss rule, analysis/matched.py; testbed-v2's is 0.7); default: "
                        "none, the saturation rule alone")
    p.add_argument("--protocol-target-kl", action="append", default=[], type=_protocol_target,
                   metavar="PROTOCOL=KL",
                   help="read PROTOCOL's unsaturated arms at its own target KL (a robustness "
                        "column's grammar; e.g. paper+second-grammar=0.9); repeatable")
    p.add_argument("--confound-share", type=NON_NEGATIVE, default=CONFOUND_SHARE,
                   help="matched loss: a confound bound above this share of the paper's effect "
                        f"reads 'loss not matched' (default {CONFOUND_SHARE:g})")
    p.add_argument("--min-seeds", type=COUNT, default=MIN_SEEDS,
                   help=f"fewer seeds reach no verdict (default {MIN_SEEDS})")
    p.add_argument("--room-factor", type=POSITIVE, default=ROOM_FACTOR,
                   help="an accuracy claim whose room is below this many times the paper's "
                        f"effect is at its ceiling / floor (default {ROOM_FACTOR:g})")
    p.add_argument("--no-measurement-error", action="store_true",
                   help="intervals over seeds alone, without the shared measurement s.e. (the "
                        "lookup table's s.e. counts either way)")
    p.add_argument("--fig1-min-runs", type=COUNT, default=MIN_RUNS,
                   help=f"Fig. 1: fewer runs give no interval (default {MIN_RUNS})")
    p.add_argument("--n-boot", type=COUNT, default=1000,
                   help="Fig. 1: cluster-bootstrap resamples (default 1000)")
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
        raise ValueError("--experiments needs --tracking-uri (or $MLFLOW_TRACKING_URI)")
    refuse_password(uri)
    frames = []
    for name in args.experiments.split(","):
        _, protocol, experiment = name.split(".")
        frames.append(load_runs(uri, name).assign(protocol=protocol, experiment=experiment))
    return pd.concat(frames, ignore_index=True)


def protocol_table(df: pd.DataFrame, rule: VerdictRule = DEFAULT_RULE,
                   fig1: Fig1Settings = DEFAULT_FIG1) -> pd.DataFrame:
    """The claims of one protocol's trials, then Fig. 1's rows (``analysis/fig1.py``)."""
    rows = claim_rows(df, rule)
    return pd.concat([rows, fig1_rows(df, rule, fig1)], ignore_index=True)


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
        tested=[f"analogue: {r.analogue}" if r.analogue else
                f"deviation: {r.deviation}" if getattr(r, "deviation", "") else "as in the paper"
                for r in rows.itertuples()],
        paper_effect=[_paper_effect(r) for r in rows.itertuples()],
        ours=[_interval(r) for r in rows.itertuples()],
        logit=[_logit_interval(r) for r in rows.itertuples()],
        room=[_room(r) for r in rows.itertuples()],
        confound=[_confound(r) for r in rows.itertuples()],
        to_change=[_to_change(r) for r in rows.itertuples()])
    cols = ["figure", "claim", "paper_setting", "tested", "metric", "paper", "paper_effect",
            "ours", "logit", "room", "regime", "confound", "verdict", "verdict_holm",
            "fragile", "decided_by", "note", "to_change"]
    if "regime" not in rows:  # a saturation-rule report (no target KL): as it always was
        cols = [c for c in cols if c not in ("regime", "confound")]
    return to_markdown(shown[[c for c in cols if c in shown]])


def _fmt(value: float, unit: str) -> str:
    """An effect in its unit: accuracy differences in points, relative ones in percent."""
    if unit == "difference":
        return f"{100 * value:+.2f} pts"
    if unit == "relative":
        return f"{100 * value:+.1f}%"
    return f"{value:+.3f}"


def _paper_effect(r) -> str:
    if not np.isfinite(r.paper_effect):
        return "a direction only"
    return _fmt(r.paper_effect, r.effect_unit)


def _interval(r) -> str:
    if not np.isfinite(r.effect):
        return "n/a"
    if not np.isfinite(r.ci_low):
        return f"{_fmt(r.effect, r.effect_unit)}, no interval (n={r.n})"
    return (f"{_fmt(r.effect, r.effect_unit)} [{_fmt(r.ci_low, r.effect_unit)}, "
            f"{_fmt(r.ci_high, r.effect_unit)}] (n={r.n})")


def _logit_interval(r) -> str:
    """An accuracy effect on the logit scale (``analysis/room.py``); "" for other effects."""
    mean = getattr(r, "effect_logit", np.nan)
    if not np.isfinite(mean):
        return ""
    if not np.isfinite(r.logit_low):
        return f"{mean:+.2f}, no interval"
    flag = "" if getattr(r, "scales_agree", True) is not False else \
        " (other side of 0 than the points: the points decide)"
    return f"{mean:+.2f} [{r.logit_low:+.2f}, {r.logit_high:+.2f}]{flag}"


def _room(r) -> str:
    """An accuracy claim's room in points and the bound it hit, if any."""
    room = getattr(r, "room", np.nan)
    bound = getattr(r, "bound", "")
    bound = bound if isinstance(bound, str) else ""
    text = f"{100 * room:.2f} pts" if np.isfinite(room) else ""
    return ", ".join(t for t in (text, f"at its {bound}" if bound else "") if t)


def _confound(r) -> str:
    """The matched-loss rule's confound bound in the effect's unit ("" where not read)."""
    bound = getattr(r, "confound_bound", np.nan)
    if not np.isfinite(bound):
        return ""
    read = getattr(r, "confound_bound_read_kl", np.nan)
    alone = (f" (the read KLs alone: {_fmt(read, r.effect_unit).lstrip('+')})"
             if np.isfinite(read) else "")
    return _fmt(bound, r.effect_unit).lstrip("+") + alone


def _to_change(r) -> str:
    if r.verdict in (AT_CEILING, AT_FLOOR):
        return "a task further from its bounds (or a larger test set)"
    if r.verdict == NOT_SATURATED:
        return f"train to KL <= {r.saturation:g} (longer runs / larger models)"
    if r.verdict == matched.NOT_MATCHED:
        return ("the KL on more evaluation sentences (measure.n_eval: its s.e. is most of the "
                "bound when the arms are interpolated), or checkpoints closer around the target")
    if r.verdict == matched.STILL_FALLING:
        return "runs long enough for the KL to level off (saturation: --scale gpu)"
    if r.verdict == matched.STALLED:
        return "a rate or schedule that takes the KL below the target (the pilot's rate search)"
    if r.verdict == matched.NOT_REACHED:
        return "longer runs, or checkpoints that reach the target KL"
    if r.verdict.startswith("inconclusive (n <") or r.verdict.startswith("inconclusive (runs <"):
        return f"at least {r.min_seeds} {'runs' if r.experiment == 'all' else 'seeds'}"
    if r.verdict in (UNDERPOWERED, NO_SIZE):
        s = r.seeds_to_resolve
        return f"~{int(s)} seeds at this effect" if np.isfinite(s) else "more seeds"
    return ""


DIAGNOSIS = (("steps", acc("C")), ("sizes", acc("B")), ("sizes", TRACE_FISHER_GROWN),
             ("sizes", acc(FIG5_TASK)),
             # Table 1: the adversary's deficit, whose verdict depends on the protocol
             ("algorithms", compared_metric(acc("B"), "adversarial", "adamw")),
             ("algorithms", compared_metric(acc("A"), "adversarial", "adamw")))
LOOKUP_GAP = "lookup - probe, task B (final steps checkpoints)"


def diagnosis_table(tables: dict[str, pd.DataFrame], df: pd.DataFrame,
                    base: str = "paper") -> pd.DataFrame:
    """Per protocol (``base`` and ``base+switch``): the steps and sizes effects (the claims'
    sign-bearing rows), Table 1's adversary rows, and the gap between the lookup table and the
    trained model's probe (Table 1's lookup row: the paper finds the lookup table worse)."""
    out = []
    for protocol, rows in tables.items():
        if (protocol != base and not protocol.startswith(base + "+")) or is_robustness(protocol):
            continue
        entry = {"protocol": protocol, LOOKUP_GAP: _lookup_gap(df[df["protocol"] == protocol])}
        for experiment, metric in dict.fromkeys(DIAGNOSIS):
            hit = rows[(rows["experiment"] == experiment) & (rows["metric"] == metric)]
            entry[f"{experiment}: {metric}"] = _diagnosis_cell(hit)
        out.append(entry)
    return pd.DataFrame(out)


def _diagnosis_cell(hit: pd.DataFrame) -> str:
    if not len(hit) or not np.isfinite(hit.iloc[0]["effect"]):
        return "n/a"
    r = hit.iloc[0]
    ci = (f"[{r['ci_low']:+.3g}, {r['ci_high']:+.3g}]" if np.isfinite(r["ci_low"])
          else "(no interval)")
    holm = r.get("verdict_holm", r["verdict"])
    holm = f" (Holm: {holm})" if isinstance(holm, str) and holm != r["verdict"] else ""
    return f"{r['effect']:+.3g} {ci} (n={r['n']}) {r['verdict']}{holm}"


def robustness_table(tables: dict[str, pd.DataFrame], protocol: str) -> pd.DataFrame:
    """Each claim the robustness protocol ``protocol`` has trials for: the paper's effect, and
    the effect [interval] and verdict under ``protocol`` beside the same claim's under its base
    protocol (the same row of the same experiment; "no trials" where the base has none)."""
    base = parse_protocol(protocol)[0]
    ref = {(r.figure, r.claim, r.metric): r
           for r in tables.get(base, pd.DataFrame()).itertuples()}
    out = []
    for r in tables[protocol].itertuples():
        b = ref.get((r.figure, r.claim, r.metric))
        out.append({"figure": r.figure, "claim": r.claim, "metric": r.metric,
                    "paper's effect": _paper_effect(r),
                    f"under {base}": "no trials" if b is None else _cell(b),
                    f"under {protocol}": _cell(r)})
    return pd.DataFrame(out)


def _cell(r) -> str:
    holm = getattr(r, "verdict_holm", r.verdict)
    return f"{_interval(r)}: {r.verdict}" + (f" (Holm: {holm})" if holm != r.verdict else "")


def _lookup_gap(part: pd.DataFrame) -> str:
    steps = part[part["experiment"] == "steps"]
    if steps.empty or "lookup/B/acc_mean" not in steps:
        return "n/a"
    claim = next(c for c in CLAIMS if c.metric == "lookup:B")
    iv = summarise(claim, algorithm_effects(steps, "lookup:B", "lookup", "adamw")).interval
    mean, low, high, n = iv.mean, iv.low, iv.high, iv.n
    if not np.isfinite(mean):
        return "n/a"
    ci = f"[{low:+.3g}, {high:+.3g}]" if np.isfinite(low) else "(no interval)"
    return f"{mean:+.3g} {ci} (n={n})"


# Every file write_report writes: checked for links before any is written
REPLICATION_FILES = ("claims.csv", "beyond.csv", "steps.png", "sizes.png", "algorithms.png",
                     "fig1_scatter.png", "replication.md")


def write_report(df: pd.DataFrame, out: Path, *, rule: VerdictRule = DEFAULT_RULE,
                 fig1: Fig1Settings = DEFAULT_FIG1, command: str | None = None,
                 hardware: str | None = None) -> list[Path]:
    from analysis.replication_figures import algorithm_bars, over_sizes, over_steps, scatter

    out = report_dir(out, files=REPLICATION_FILES)
    # an ablation's trials are arms of the beyond table, not a protocol of the paper's claims
    protocols = sorted(p for p in df["protocol"].dropna().unique() if not is_ablation(p))
    tables = {p: protocol_table(df[df["protocol"] == p], rule.for_protocol(p), fig1)
              for p in protocols}
    frames = [t.assign(protocol=p) for p, t in tables.items() if not t.empty]
    if not frames:
        raise ValueError("no claim of the paper can be read from these trials: none is laid out "
                         "as <trials>/<protocol>/<experiment>/<trial> (flatlm replicate's "
                         "layout) with a claim's metric measured (a loss-only trial has none)")
    claims = pd.concat(frames, ignore_index=True)
    claims = with_holm(claims, rule.level)  # one family: every test of the report
    tables = {p: claims[claims["protocol"] == p].drop(columns="protocol") for p in protocols}
    paths = [out / "claims.csv"]
    write_csv(claims, paths[0])
    main = [p for p in protocols if "+" not in p]
    robust = [p for p in protocols if is_robustness(p)]
    paths += [over_steps(df[df["protocol"].isin(main)], out / "steps.png"),
              over_sizes(df[df["protocol"].isin(main)], out / "sizes.png"),
              algorithm_bars(df[df["protocol"].isin(main)], out / "algorithms.png"),
              scatter(df[df["protocol"].isin(main)], out / "fig1_scatter.png", acc(fig1.task),
                      rule.saturation)]
    beyond = beyond_rows(df, rule)
    if not beyond.empty:
        paths.append(out / "beyond.csv")
        write_csv(beyond, paths[-1])
    md = out / "replication.md"
    write_file(md, _markdown(df, _Read(tables, main, robust, beyond), rule, fig1,
                             (command, hardware)))
    return [md, *paths]


class _Read(NamedTuple):
    """What the report read: each protocol's claims table, the main and robustness protocols,
    the beyond-the-paper rows."""

    tables: dict[str, pd.DataFrame]
    main: list[str]
    robust: list[str]
    beyond: pd.DataFrame


def _markdown(df, read: _Read, rule, fig1, made_by: tuple[str | None, str | None]) -> str:
    tables, main, robust, beyond = read
    command, hardware = made_by
    lines = ["# Replication of Liu et al. (ICML 2023) with flatlm", ""]
    if command:
        lines += [f"Made by: `{command}`", ""]
    lines += [f"Hardware: {hardware or platform.platform()}; "
              f"{df['run_id'].nunique()} trials, {len(df)} checkpoints.", "",
              "## Rule", "", rule_text(rule, fig1), ""]
    for protocol in main:
        part = df[df["protocol"] == protocol]
        lines += [f"## Protocol `{protocol}`", "", describe(protocol) + ".", "",
                  _sizes_line(part), "", claims_markdown(tables[protocol]), "",
                  *_reference_lines(part)]
    for protocol in robust:
        part = df[df["protocol"] == protocol]
        lines += [f"## Robustness: protocol `{protocol}`", "", describe(protocol) + ".", "",
                  "The claims its trials cover, beside the same claims under "
                  f"`{parse_protocol(protocol)[0]}` (effect [95% interval] (seeds): verdict). A "
                  "verdict that differs between the columns depends on the grammar."
                  + _own_target_text(rule, protocol), "",
                  _sizes_line(part), "", to_markdown(robustness_table(tables, protocol)), "",
                  *_reference_lines(part)]
    lines += _multiplicity_lines(tables)
    lines += _beyond_lines(beyond)
    diag = diagnosis_table(tables, df)
    if len(diag) > 1:
        lines += ["## Diagnosis: which protocol switch decides the verdicts", "",
                  "The `paper` protocol with one switch at a time (`flatlm replicate "
                  "--diagnose`): effect [95% interval] and verdict of the steps and sizes "
                  "claims and of Table 1's adversary, and the lookup table's accuracy minus "
                  "the trained probe's. A switch that moves an interval to the other side of 0 "
                  "decides that verdict. Rows with n=1 have no interval (a measurement's own "
                  "standard error is not the seed-to-seed spread): read them as signs, not "
                  "verdicts.", "",
                  to_markdown(diag), ""]
    lines += ["## Figures", "", "![steps](steps.png)", "", "![sizes](sizes.png)", "",
              "![algorithms](algorithms.png)", "", "![fig1](fig1_scatter.png)", ""]
    return "\n".join(lines)


def _own_target_text(rule: VerdictRule, protocol: str) -> str:
    """Where ``protocol`` is read at a target of its own (--protocol-target-kl), say so."""
    own = rule.for_protocol(protocol).target_kl
    if own == rule.target_kl or own is None:
        return ""
    return (f" Its unsaturated arms are read at its own target, KL {own:g} nats/token "
            f"(`--protocol-target-kl`), not the main protocols' {rule.target_kl:g}: on its "
            "grammar the models reach another KL in the same budget, so its column compares "
            "the claims' directions at a matched loss of its own.")


def _beyond_lines(rows: pd.DataFrame) -> list[str]:
    """The beyond-the-paper table (``analysis/beyond.py``), when its arms have trials."""
    if rows.empty:
        return []
    return ["## Beyond the paper: Muon, SGD and the label-noise mechanism at matched loss", "",
            "Claims stated before the runs were read (`analysis/beyond.py`: where each comes "
            "from), read by the rule above in the `paper` protocol's algorithms experiment; the "
            "soft-target arm is AdamW under `paper+soft-targets` (train.targets=truth), the SGD "
            "arm the sgd experiment's run. Each source gives a direction only, so each confound "
            "bound is judged against a quarter of our own mean effect or of the interval's "
            "half-width before the bound, whichever is larger; \"reproduces\" reads: the "
            "stated direction holds. Holm's family is this table alone.", "",
            claims_markdown(rows), ""]


def _multiplicity_lines(tables: dict[str, pd.DataFrame]) -> list[str]:
    """The Holm family's choice and its sensitivity: the rows whose verdict would differ with
    each protocol a family of its own."""
    rows = pd.concat([t.assign(protocol=p) for p, t in tables.items()], ignore_index=True)
    if "verdict_holm_protocol" not in rows:
        return []
    tested = int(rows["p_holm"].notna().sum())
    differ = rows[rows["verdict_holm"] != rows["verdict_holm_protocol"]]
    lines = ["## Multiplicity", "",
             f"Holm's family is the whole report: {tested} tests over {len(tables)} "
             f"protocol(s). With each protocol a family of its own, {len(differ)} verdict(s) "
             "would differ" + (":" if len(differ) else "."), ""]
    if len(differ):
        lines += [to_markdown(differ[["protocol", "figure", "claim", "metric", "verdict",
                                      "verdict_holm", "verdict_holm_protocol"]]), ""]
    return lines


def _reference_lines(part: pd.DataFrame) -> list[str]:
    return ["Reference points (final AdamW checkpoints, mean over runs):", "",
            to_markdown(reference_points(part)), ""]


def rule_text(rule: VerdictRule, fig1: Fig1Settings) -> str:
    """The verdict rule with the values this report used (``analysis/claims.py``)."""
    return (
        "Each effect is computed per training seed and averaged (accuracy differences in points, "
        "and beside them the change in the empirical logit of the accuracy; trace effects "
        "relative, treatment / control - 1, because the trace's scale depends on the model and "
        f"data); its interval is the {rule.level:.0%} Student-t interval over seeds"
        + (", widened by the measurement s.e. every seed shares (one test set, the same probe "
           "seeds): half-width = sqrt(t_half^2 + (z se_meas)^2), se_meas the mean over seeds of "
           "sqrt(se_a^2 + se_b^2) of the two compared measurements, where an accuracy's s.e. is "
           "the recorded one (`acc_se`) floored at the binomial s.e. at the Laplace-smoothed "
           "accuracy, sqrt(p~ (1 - p~) / n), p~ = (p n + 1) / (n + 2), n the test sentences "
           "(`analysis/room.py`; the same s.e. the room's bounds use) "
           "(`--no-measurement-error` turns it off)" if rule.measurement_error else "")
        + ". The lookup table is one measurement repeated in every trial: its s.e. counts once, "
        "whatever the number of seeds. A claim is about the paper's *saturation regime*: every "
        f"compared checkpoint must be at KL <= {rule.saturation:g} nats/token from the truth "
        f"(`--saturation`) and within {rule.tol:g} nats of the others (`--tol`); for the steps "
        "and sgd claims the compared checkpoints are the first and last of each run's final "
        "stretch of saturated checkpoints. An accuracy claim's *room* is 1 - the control's "
        "accuracy for a claim that an arm probes better, the control's accuracy - the task's "
        "majority share for worse. Verdict, the first that applies: a compared checkpoint "
        "unsaturated -> inconclusive (not saturated); KLs further apart than the tolerance -> "
        f"inconclusive (losses differ); fewer than {rule.min_seeds} seeds (`--min-seeds`) -> "
        f"inconclusive (n < {rule.min_seeds}); interval on the paper's side of 0 -> reproduces; "
        f"on the other side -> contradicts; room < {rule.room_factor:g} x the paper's effect "
        f"(`--room-factor`), or an arm within {rule.bound_se:g} s.e. of 100% or of the majority "
        "share -> inconclusive (ceiling) / inconclusive (floor) (a bound can hide an effect but "
        "not move an interval off 0, so it decides only intervals that contain 0); an interval "
        "containing 0 that excludes the paper's effect -> inconclusive (no effect as large as "
        "the paper's); one containing both -> inconclusive (underpowered); a claim whose paper "
        "number is a direction only -> inconclusive (paper states no size). The verdict is read "
        "in points (accuracy differences); the logit interval beside it is a second view, and "
        "a row whose logit interval lies on another side of 0 is flagged in its logit cell and "
        "by `scales_agree` = False. A verdict is *fragile* (column `fragile`) when a change of "
        "one threshold by 10% either way (saturation, tolerance, room factor, bound s.e., "
        "target KL, confound share) or of the level by one point changes it; the column names "
        "each such change with the verdict it gives. `verdict_holm` "
        f"adjusts for multiplicity: Holm at family-wise level {1 - rule.level:.2g} over every "
        "row of this report (all protocols) with an interval verdict, each with the p-value of "
        "its effect against 0 from the same t statistic (Fig. 1: the bootstrap's); a "
        "reproduces / contradicts whose adjusted p exceeds it reads inconclusive (not "
        "significant after Holm). The family is the whole report, every protocol at once (the "
        "stricter choice: a reader takes in all its rows); `verdict_holm_protocol` gives the "
        "verdict with each protocol a family of its own, and the section *Multiplicity* counts "
        "where the two differ. Each row's `decided_by` gives the values each check saw; "
        "`claims.csv` has them as columns (`room`, `bound`, `se_meas`, `ci_seed_half`, "
        "`effect_logit`, `p_value`, `p_holm`, `verdict_holm`). Rows marked *analogue* test on "
        "the PCFG a claim the paper made on other data. Tr(H) in the paper is its B.1 "
        "estimator, which is Tr(F) (`flat/trace_fisher`) here.\n\n"
        f"Fig. 1 is the partial {fig1.method} correlation of Tr(F) with task {fig1.task} "
        f"accuracy given the KL, over the saturated checkpoints of the {fig1.algorithm or 'all'}"
        " runs, one row per parameterisation (Tr(F) of one model shape, or Tr(F) grown into one "
        f"shape), with a {fig1.n_boot}-resample cluster bootstrap over runs; with fewer than "
        f"{fig1.min_runs} runs no interval is claimed. A resample whose accuracy is constant "
        + ("counts as r = 0" if fig1.constant_as_zero else "is dropped")
        + f"; with more than {fig1.max_constant_share:.0%} of them an interval containing 0 "
        "reads inconclusive (ceiling)."
        + _matched_text(rule))


def _matched_text(rule: VerdictRule) -> str:
    """The matched-loss rule with this report's values (``analysis/matched.py``); "" when the
    report reads the saturation regime alone."""
    if rule.target_kl is None:
        return ""
    return (
        "\n\n**Matched loss** (`--target-kl`, `analysis/matched.py`). A claim whose compared "
        "checkpoints are not saturated is read in the *matched-loss regime* instead (column "
        f"`regime`): each arm at the checkpoint where its KL crosses {rule.target_kl:g} "
        "nats/token, the metric and its s.e. interpolated linearly in the KL between the "
        "bracketing checkpoints (the s.e.s blended as if fully correlated), or the nearest "
        f"checkpoint within {rule.match_tol:g} nats; a run that gets no nearer reads "
        "inconclusive (target not reached). The KL difference that remains (the read KLs' mean "
        "difference, plus z x the KL's measurement s.e. of the difference) times the steepest "
        "arm's slope of the metric on the KL (least squares over each arm's checkpoints within "
        f"{rule.slope_window:g} nats of the target, each seed its own intercept, plus z x its "
        "s.e.) bounds what the loss could explain: the *confound bound* (column "
        "`confound_bound`, relative to the control's mean for a relative effect) widens the "
        "interval on both sides, and the p-value tests the mean shrunk by it toward 0. A bound "
        f"above {rule.confound_share:g} x |the paper's effect| (where the paper states a "
        "direction only: the larger of |our mean| and the interval's half-width before the "
        "bound; `--confound-share`) reads inconclusive (loss not matched). "
        "The claims that need the loss to have converged (Fig. 2a, Fig. 4 left, Fig. 10: "
        "accuracy or Tr(H) moving with steps *after* convergence) read precondition not met "
        "(the loss still falls) unless every run's KL is flat over its last "
        f"{rule.plateau_points} checkpoints (least-squares slope on the step within one s.e. of "
        "0), and a plateau above the target KL is a stall, not convergence: precondition not "
        "met (the loss stalls above the target KL); the lookup table (KL 0) has no trained "
        "run at its loss below saturation: precondition not met (the lookup table is at KL "
        "0). A matched-loss verdict answers the paper's thesis for models at that KL, not in "
        "the saturation regime the paper presupposes.")


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
    try:  # a password, a link or a file for --out, no such directory, no claim readable
        if args.tracking_uri:  # before anything is read: a password is refused, never echoed
            refuse_password(args.tracking_uri)
        args.out = report_dir(args.out, files=REPLICATION_FILES)  # before any work
        return _report(args)
    except ValueError as e:  # one line, no traceback
        raise SystemExit(f"error: {e}") from None


def _report(args) -> int:
    df = load(args)
    if df.empty:
        print("no trials found", file=sys.stderr)
        return 1
    unfinished = df.loc[df["status"] != "FINISHED", "run_id"].unique()
    if len(unfinished):  # a half-run trial would bias the plateau and final-checkpoint effects
        print(f"leaving out {len(unfinished)} unfinished trial(s): {', '.join(unfinished)}",
              file=sys.stderr)
        df = df[df["status"] == "FINISHED"]
    rule = VerdictRule(saturation=args.saturation, tol=args.tol, min_seeds=args.min_seeds,
                       room_factor=args.room_factor,
                       measurement_error=not args.no_measurement_error,
                       target_kl=args.target_kl, confound_share=args.confound_share,
                       protocol_targets=tuple(args.protocol_target_kl))
    fig1 = Fig1Settings(n_boot=args.n_boot, min_runs=args.fig1_min_runs)
    paths = write_report(df, args.out, rule=rule, fig1=fig1, command=args.command,
                         hardware=args.hardware)
    print((args.out / "replication.md").read_text())
    if args.tracking_uri and not args.no_log:
        run_id = log_report(args.tracking_uri, "replication", paths,
                            {"saturation": args.saturation, "tol": args.tol,
                             "min_seeds": args.min_seeds, "room_factor": args.room_factor,
                             "measurement_error": not args.no_measurement_error,
                             "target_kl": args.target_kl,
                             **{f"target_kl/{p}": kl for p, kl in args.protocol_target_kl},
                             "confound_share": args.confound_share,
                             "trials": df["run_id"].nunique()})
        print(f"logged to MLflow run {run_id}")
    print(f"wrote {len(paths)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
