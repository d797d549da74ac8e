"""The replication report on a planted table: every row says what decided it, analogues are
marked, the rule is stated with the values used, and no row below 3 seeds has a verdict."""

import pandas as pd
import pytest

from analysis.claims import DEFAULT_RULE, VerdictRule
from analysis.fig1 import Fig1Settings
from analysis.replication import write_report
from tests.analysis.test_claims import algorithms_table, sized, steps_runs

DECIDED_BY = ("saturation", "tol", "n", "min_seeds", "ci_low", "ci_high", "level",
              "paper_effect", "kl_max", "kl_spread", "analogue", "paper_setting", "decided_by")


def planted(seeds=(0, 1, 2)):
    saturated = [1.0, 0.015, 0.012, 0.010]
    parts = [steps_runs(saturated, [0.5, 0.6, 0.65, 0.7], seeds=seeds),
             steps_runs([1.2, 0.8, 0.6, 0.5], [0.5, 0.6, 0.65, 0.7], seeds=seeds,
                        experiment="sgd"),  # monotone, far from the truth
             sized({"d16-h1-l1-i64": 0.01, "d64-h4-l2-i256": 0.005},
                   {"d16-h1-l1-i64": 0.4, "d64-h4-l2-i256": 0.7}, seeds=seeds),
             algorithms_table(seeds=seeds)]
    df = pd.concat(parts, ignore_index=True)
    return df.assign(protocol="paper", model=df["model"].fillna("d16-h1-l1-i64"),
                     status="FINISHED", **{"pretrain/entropy": 2.0})


def test_the_report_states_the_rule_and_what_decided_each_row(tmp_path):
    write_report(planted(), tmp_path, rule=DEFAULT_RULE, fig1=Fig1Settings(n_boot=20))
    claims = pd.read_csv(tmp_path / "claims.csv")
    assert set(DECIDED_BY) <= set(claims.columns)
    sgd = claims[claims["experiment"] == "sgd"]
    assert len(sgd) and (sgd["verdict"] == "inconclusive (not saturated)").all()
    assert claims["analogue"].notna().sum() == 4
    md = (tmp_path / "replication.md").read_text()
    for needle in ("KL <= 0.02 nats/token", "inconclusive (underpowered)", "analogue: BookCorpus",
                   "decided_by", "paper_setting", "235M", "Fig. 1 (1, 4)", "distinct"):
        assert needle in md, needle
    table = [line for line in md.splitlines() if line.startswith("| figure")]
    columns = table[0].count("|")
    rows = [line for line in md.splitlines() if line.startswith("| Fig") or
            line.startswith("| Table")]
    assert rows and all(line.count("|") == columns for line in rows)  # no "|" inside a cell


def test_no_row_of_a_two_seed_report_has_a_verdict(tmp_path):
    write_report(planted(seeds=(0, 1)), tmp_path, rule=VerdictRule(),
                 fig1=Fig1Settings(n_boot=20))
    claims = pd.read_csv(tmp_path / "claims.csv")
    assert (claims["n"] < 3).all()
    assert claims["verdict"].str.startswith("inconclusive (").all()
    assert not claims["verdict"].str.contains("underpowered|as large|no size").any()


def test_a_one_seed_diagnosis_row_shows_a_sign_without_an_interval():
    from analysis.replication import diagnosis_table, protocol_table

    df = pd.concat([planted(), planted(seeds=(0,)).assign(protocol="paper+mask-only")])
    tables = {p: protocol_table(df[df["protocol"] == p], fig1=Fig1Settings(n_boot=10))
              for p in ("paper", "paper+mask-only")}
    diag = diagnosis_table(tables, df).set_index("protocol")
    one = diag.loc["paper+mask-only", "steps: probe/C/acc_mean"]
    assert "(no interval) (n=1) inconclusive (n < 3)" in one
    assert "(n=3) reproduces" in diag.loc["paper", "steps: probe/C/acc_mean"]
    # Table 1's adversary (planted 10 points below AdamW) is diagnosed too
    adversary = diag.loc["paper", "algorithms: probe/B/acc_mean (adversarial - adamw)"]
    assert adversary.startswith("-0.1 [") and adversary.endswith("(n=3) reproduces")


def test_a_second_grammar_is_a_robustness_column_beside_its_base(tmp_path):
    """Sizes trials under ``paper+second-grammar`` where the larger model probes *worse*: the
    report's robustness section shows each of its claims beside ``paper``'s, with both
    verdicts; claims it has no trials for are not rows; the diagnosis leaves it out."""
    from analysis.replication import diagnosis_table, protocol_table, robustness_table

    second = sized({"d16-h1-l1-i64": 0.01, "d64-h4-l2-i256": 0.005},
                   {"d16-h1-l1-i64": 0.7, "d64-h4-l2-i256": 0.4}, seeds=(0, 1, 2))
    second = second.assign(protocol="paper+second-grammar", status="FINISHED",
                           **{"pretrain/entropy": 2.0})
    df = pd.concat([planted(), second], ignore_index=True)
    tables = {p: protocol_table(df[df["protocol"] == p], fig1=Fig1Settings(n_boot=10))
              for p in ("paper", "paper+second-grammar")}
    table = robustness_table(tables, "paper+second-grammar").set_index("metric")
    assert set(table.index) == set(tables["paper+second-grammar"]["metric"])
    assert "steps" not in set(tables["paper+second-grammar"]["experiment"])
    row = table.loc["probe/B/acc_mean"]
    row = row.iloc[0] if isinstance(row, pd.DataFrame) else row
    assert row["paper's effect"] == "+6.90 pts"  # Fig. 3a's, not overwritten by a column
    assert row["under paper"].startswith("+") and ": reproduces" in row["under paper"]
    assert row["under paper+second-grammar"].startswith("-30.00 pts")
    assert row["under paper+second-grammar"].endswith(": contradicts")
    assert list(diagnosis_table(tables, df)["protocol"]) == ["paper"]
    write_report(df, tmp_path, fig1=Fig1Settings(n_boot=10))
    md = (tmp_path / "replication.md").read_text()
    assert "## Robustness: protocol `paper+second-grammar`" in md
    assert "## Diagnosis" not in md


def test_a_claim_whose_compared_algorithm_has_no_runs_is_no_row():
    """Algorithms trials without noreg and SAM (a second grammar with AdamW and the adversary
    only): the adversary's and the lookup table's claims are rows, noreg's and SAM's are not
    (they would read "not saturated", which no run measured)."""
    from analysis.replication import protocol_table

    df = planted()
    df = df[~df["train.algorithm"].isin(["noreg", "sam"])]
    rows = protocol_table(df, fig1=Fig1Settings(n_boot=10))
    compared = set(rows.loc[rows["experiment"] == "algorithms", "metric"])
    assert "probe/B/acc_mean (adversarial - adamw)" in compared
    assert "lookup:B (lookup - adamw)" in compared
    assert not any("noreg" in m or "sam" in m for m in compared), compared
    full = protocol_table(planted(), fig1=Fig1Settings(n_boot=10))
    assert (full["metric"] == "probe/B/acc_mean (sam - noreg)").sum() == 1


def test_sgd_rows_name_a_rate_that_departs_from_b2(tmp_path):
    df = planted()
    sgd = df["experiment"] == "sgd"
    write_report(df.assign(**{"train.lr": 0.001}).where(~sgd, df.assign(**{"train.lr": 0.3})),
                 tmp_path, rule=DEFAULT_RULE, fig1=Fig1Settings(n_boot=20))
    claims = pd.read_csv(tmp_path / "claims.csv").fillna("")
    rows = claims[claims["experiment"] == "sgd"]
    assert (rows["deviation"].str.contains("constant 0.3 after warmup, not B.2's 0.001")).all()
    assert not claims[claims["experiment"] != "sgd"]["deviation"].str.len().any()
    md = (tmp_path / "replication.md").read_text()
    assert "deviation: SGD at a constant 0.3" in md


def _damaged_trials(root):
    """Five trials of the replication's layout, four of them damaged one way each."""
    import json

    from flatlm.core.config import to_dict
    from flatlm.experiments.scales import scale

    good = json.dumps(to_dict(scale("testbed").base()))
    for name in "abcde":
        trial = root / "paper" / "steps" / name
        trial.mkdir(parents=True)
        (trial / "config.json").write_text(good)
        (trial / "metrics.jsonl").write_text('{"step": 10000, "pretrain/kl": 0.01}\n')
    with open(root / "paper/steps/a/metrics.jsonl", "a") as f:
        f.write('{"step": 1e400}\n')
    with open(root / "paper/steps/b/metrics.jsonl", "ab") as f:
        f.write(b'{"step": 5, "x": "\xff\xfe"}\n')
    (root / "paper/steps/c/config.json").write_text(good[:50])
    (root / "paper/steps/d/config.json").write_text("[1, 2]")


def test_damaged_records_are_left_out_with_a_warning_not_a_traceback(tmp_path, caplog):
    """Issue 43, item 15: a {"step": 1e400} line, invalid UTF-8, a truncated or list-shaped
    config.json each ended the report in a traceback."""
    from analysis.trials import load_trials

    _damaged_trials(tmp_path)
    df = load_trials(tmp_path)
    assert sorted(set(df["trial"])) == ["a", "b", "e"]  # c and d left out
    assert (df.loc[df["step"] == 10000, "pretrain/kl"] == 0.01).sum() == 3  # the rest read
    assert "c/config.json is not readable JSON" in caplog.text
    assert "d/config.json holds a list" in caplog.text


@pytest.mark.parametrize("script", ["replication", "report"])
def test_the_analysis_scripts_end_bad_trials_in_one_line(tmp_path, script):
    import importlib

    from tests.inprocess import run_main

    main = importlib.import_module(f"analysis.{script}").main
    _damaged_trials(tmp_path / "trials")
    extra = ["--kl-threshold", "0.1"] if script == "report" else []
    for trials in (tmp_path / "trials", tmp_path / "missing"):
        done = run_main(main, ["--trials", trials, "--out", tmp_path / "out", *extra])
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "no such directory" in done.stderr
