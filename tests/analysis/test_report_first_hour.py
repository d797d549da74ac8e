"""The report of the README's main job (issue 42, item 6): three runs, so no statistic that
needs more (correlations, model selection), one line saying why instead; tables that say what
they compare and call a loss equal only when it is; the lookup row as the one measurement it
is; ``conclusion.md`` with a title and its settings; the README's names (scale, protocol)."""

from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

from analysis.correlate import Bootstrap  # noqa: E402
from analysis.report import write_report  # noqa: E402
from tests.analysis.glance_runs import readme_runs, steps_runs  # noqa: E402

A = "probe/A/acc_mean"
WHEN = datetime(2026, 11, 28, 9, 30)
DOCS_IMAGES = Path(__file__).parents[2] / "docs" / "images"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("first_hour")
    paths, _ = write_report(readme_runs(), out, A, boot=Bootstrap(50), kl_threshold=0.05, when=WHEN,
                            sweep="scaling")
    return out, {p.name for p in paths}


def test_three_runs_get_no_correlations_and_no_ranking_but_one_line_each(report):
    out, names = report
    text = (out / "correlations.md").read_text()
    assert text.startswith("Correlations left out: 3 run(s) in the saturation regime "
                           "(pretrain/kl < 0.05), fewer than 5")
    assert text.count("\n") == 1 and "[-1, 1]" in text
    assert pd.read_csv(out / "correlations.csv").empty
    selection = (out / "selection.md").read_text()
    assert selection.startswith("**Model selection left out:** 3 candidate checkpoint(s) of "
                                "3 run(s)") and "| selector |" not in selection
    assert "selection.png" not in names and pd.read_csv(out / "selection.csv").empty


def test_table_1_has_its_algorithm_column_and_says_the_losses_are_not_equal(report):
    out, _ = report
    text = (out / "table1_by_algorithm.md").read_text()
    rule, _, table = text.partition("\n\n")
    assert rule.startswith("**Table 1**: task A probe accuracy, loss, KL and flatness by "
                           "algorithm and model, at matched KL (not equal: KL 0.034 vs 0.045")
    assert "equal loss" not in rule.replace("equal loss would be", "")
    assert table.startswith("| algorithm | model | runs | task A probe accuracy | step | "
                            "loss (nats/token) | KL (nats/token) |")
    assert pd.read_csv(out / "table1_by_algorithm.csv")["algorithm"].iloc[0] == "adamw"


def test_the_lookup_row_shows_its_measurement_error_not_a_spread_over_runs(report):
    out, _ = report
    for name in ("table1_by_algorithm.md", "table2_by_model.md"):
        (row,) = [r for r in (out / name).read_text().splitlines() if "lookup table" in r]
        assert "± 0.000" not in row and "0.973 ± 0.005 s.e." in row
        assert row.split("|")[3].strip() == ""  # no run count: one measurement


def test_conclusion_md_has_a_title_and_its_settings(report):
    out, _ = report
    head = (out / "conclusion.md").read_text().splitlines()[:8]
    assert head[:2] == ["# Report: sweep `scaling`", ""]
    assert head[2:] == ["- sweep: `scaling`, 3 runs, 9 checkpoints",
                        "- scale / protocol: sweep / paper",
                        "- task: A (`probe/A/acc_mean`)",
                        "- saturation rule: pretrain/kl < 0.05",
                        "- cluster bootstrap: 50 resamples of runs, seed 0",
                        "- date: 2026-11-28 09:30"]


def test_runs_csv_names_where_runs_ran_as_the_readme_does(report):
    out, _ = report
    runs = pd.read_csv(out / "runs.csv")
    assert "preset" not in runs and set(runs["scale"]) == {"sweep"}
    assert set(runs["protocol"]) == {"paper"}


def test_equal_loss_is_said_where_the_kls_are_within_two_standard_errors(tmp_path):
    df = readme_runs()
    last = df["step"] == 2000
    df.loc[last, "pretrain/kl"] = [0.0400, 0.0410, 0.0405]  # within 2 s.e. (0.0017) of each
    write_report(df, tmp_path, A, boot=Bootstrap(50), kl_threshold=0.05, when=WHEN)
    rule = (tmp_path / "table1_by_algorithm.md").read_text().split("\n\n")[0]
    assert "at equal loss (KL 0.04 to 0.041 nats/token, within 2 s.e.)" in rule
    assert "# Report: sweep `scaling`" in (tmp_path / "conclusion.md").read_text()


def test_five_runs_get_their_correlations(tmp_path):
    write_report(steps_runs(5), tmp_path, A, boot=Bootstrap(50), kl_threshold=0.05, when=WHEN)
    assert "| y | x | method |" in (tmp_path / "correlations.md").read_text()
    assert len(pd.read_csv(tmp_path / "correlations.csv")) > 0
    assert "| selector | statistic |" in (tmp_path / "selection.md").read_text()


@pytest.mark.parametrize(("committed", "drawn"), [("fig1_after.png", "fig1_accuracy_scatter.png"),
                                                  ("fig3_after.png", "fig3_over_size.png")])
def test_the_docs_after_figures_are_this_report_s_byte_for_byte(report, committed, drawn):
    """docs/results.md shows these two figures of this report: a change to the figures fails
    here until they are redrawn (copy the report's files over them)."""
    out, _ = report
    assert (DOCS_IMAGES / committed).read_bytes() == (out / drawn).read_bytes()
