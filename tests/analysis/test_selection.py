"""analysis/selection.py: selection by flatness vs by the loss, exact on planted data.

Planted: 8 runs x 3 checkpoints in the regime. Accuracy is a strictly decreasing function of the
Fisher trace (so ranking by it is perfect: Spearman = Kendall = 1, regret 0), the loss is
unrelated to accuracy by construction, and an early checkpoint outside the regime would win every
ranking if the rule were ignored.
"""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[2]

from analysis.selection import (  # noqa: E402
    RANDOM,
    default_selectors,
    selection_stats,
    selection_table,
    verdict,
    write_selection,
)
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN  # noqa: E402

ACC = "probe/B/acc_mean"


def planted(n_runs: int = 8, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for run in range(n_runs):
        for step in (100, 200, 300):
            flat = rng.uniform(10, 100)
            rows.append({"run_id": f"r{run}", "step": step, KL: 0.01, TRACE_FISHER: flat,
                         TRACE_HESSIAN: rng.uniform(10, 100), LOSS: 2 + rng.uniform(0, 0.01),
                         "flat/trace_fisher_se": 1.0, ACC: 0.9 - 0.002 * flat})
        rows.append({"run_id": f"r{run}", "step": 0, KL: 1.0, TRACE_FISHER: 1.0,
                     TRACE_HESSIAN: 1.0, LOSS: 0.0, ACC: 0.99})  # outside the regime
    return pd.DataFrame(rows)


def _value(table, selector, statistic, column="value"):
    return table.set_index(["selector", "statistic"]).loc[(selector, statistic), column]


def test_planted_ranking_is_recovered_exactly():
    df = planted()
    table = selection_table(df, ACC, kl_threshold=0.05, n_boot=300)
    inside = df[df[KL] < 0.05]
    acc = inside[ACC].to_numpy()
    assert table.attrs["n"] == 24 and table.attrs["runs"] == 8
    assert _value(table, TRACE_FISHER, "spearman") == pytest.approx(1.0, abs=1e-12)
    assert _value(table, TRACE_FISHER, "kendall") == pytest.approx(1.0, abs=1e-12)
    assert _value(table, TRACE_FISHER, "regret") == 0.0
    by_loss = acc.max() - acc[inside[LOSS].to_numpy().argmin()]
    assert _value(table, LOSS, "regret") == pytest.approx(by_loss, abs=1e-15)
    assert _value(table, RANDOM, "regret") == pytest.approx(acc.max() - acc.mean(), abs=1e-15)
    assert _value(table, TRACE_FISHER, "gain_vs_loss") == pytest.approx(by_loss, abs=1e-15)
    rho = stats.spearmanr(-inside[TRACE_HESSIAN], acc).statistic
    assert _value(table, TRACE_HESSIAN, "spearman") == pytest.approx(rho, abs=1e-12)
    # a perfect selector's interval sits at 1 and its gain over the loss is significant
    assert _value(table, TRACE_FISHER, "spearman", "ci_low") == pytest.approx(1.0)
    assert _value(table, TRACE_FISHER, "gain_vs_loss", "ci_low") > 0
    assert _value(table, TRACE_FISHER, "gain_vs_loss", "p") < 0.05
    assert "flat/trace_fisher picks better models than the loss" in verdict(table)


def test_the_regime_rule_is_applied_before_ranking():
    df = planted()
    table = selection_table(df, ACC, kl_threshold=2.0, n_boot=0)  # the early rows come in
    assert _value(table, TRACE_FISHER, "regret") == 0.0  # the early row: flattest and best
    assert math.isnan(_value(table, TRACE_FISHER, "regret", "ci_low"))  # n_boot=0: none


def test_ties_in_the_selector_average_the_picked_accuracy():
    acc = np.array([0.5, 0.7, 0.9])
    out = selection_stats(acc, {LOSS: np.array([1.0, 1.0, 2.0])})
    assert out[LOSS, "regret"][0] == pytest.approx(0.9 - 0.6)


def test_weighted_statistics_equal_scipy_on_the_expanded_sample():
    """A bootstrap resample is a weighting; each statistic must equal the one of the sample with
    every row repeated, ties included (scipy: average ranks, tau-b)."""
    rng = np.random.default_rng(5)
    acc = rng.choice([0.5, 0.6, 0.7, 0.8], size=12)  # ties in accuracy
    s = rng.choice([1.0, 2.0, 3.0, 4.0, 5.0], size=12)  # ties in the selector
    w = rng.integers(0, 3, size=(6, 12))
    got = selection_stats(acc, {LOSS: s, TRACE_FISHER: -s}, w)
    for b, weights in enumerate(w):
        a, x = np.repeat(acc, weights), np.repeat(s, weights)
        assert got[LOSS, "spearman"][b] == pytest.approx(stats.spearmanr(-x, a).statistic)
        assert got[LOSS, "kendall"][b] == pytest.approx(stats.kendalltau(-x, a).statistic)
        assert got[LOSS, "regret"][b] == pytest.approx(a.max() - a[x == x.min()].mean())
        assert got[RANDOM, "regret"][b] == pytest.approx(a.max() - a.mean())
        assert got[TRACE_FISHER, "gain_vs_loss"][b] == pytest.approx(
            got[LOSS, "regret"][b] - (a.max() - a[x == x.max()].mean()))


def test_bootstrap_resamples_runs_and_is_seeded():
    df = planted(seed=3)
    df[TRACE_FISHER] = np.random.default_rng(9).uniform(size=len(df))  # no signal now
    a = selection_table(df, ACC, kl_threshold=0.05, n_boot=200, seed=1)
    b = selection_table(df, ACC, kl_threshold=0.05, n_boot=200, seed=1)
    pd.testing.assert_frame_equal(a, b)
    row = a.set_index(["selector", "statistic"]).loc[(TRACE_FISHER, "spearman")]
    assert row.ci_low < row.value < row.ci_high
    one_run = df[df.run_id == "r0"]
    table = selection_table(one_run, ACC, kl_threshold=0.05, n_boot=50)
    assert "only 1 run" in table.attrs["note"] and "only 1 run" in verdict(table)


def test_selectors_default_and_errors():
    df = planted()
    assert default_selectors(df.columns) == [TRACE_FISHER, TRACE_HESSIAN, LOSS]
    with pytest.raises(ValueError, match="saturation rule"):
        selection_table(df, ACC)
    with pytest.raises(ValueError, match="flat/sharpness"):
        selection_table(df, ACC, ["flat/sharpness"], kl_threshold=0.05)


def test_write_selection_files(tmp_path):
    paths = write_selection(planted(), tmp_path, ACC, kl_threshold=0.05, n_boot=100)
    assert {p.name for p in paths} == {"selection.md", "selection.csv", "selection.png"}
    assert (tmp_path / "selection.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "selection.md").read_text()
    assert "| selector | statistic |" in text and "random choice" in text
    empty = write_selection(planted(), tmp_path / "e", ACC, kl_threshold=1e-9, n_boot=10)
    assert "nothing to select from" in (tmp_path / "e" / "selection.md").read_text()
    assert len(empty) == 2


def test_the_docs_selection_figure_redraws_from_committed_records(tmp_path, monkeypatch,
                                                                   capsys):
    """docs/selection.md's command, run as written there (its --out here), draws the figure the
    page shows, byte for byte, from the committed trial records."""
    import shlex

    from analysis.selection import main
    from tests.test_readme import shell_lines

    page = (REPO / "docs" / "selection.md").read_text()
    (line,) = [x for x in shell_lines(page) if "replication_testbed/trials" in x]
    words = shlex.split(line, comments=True)
    assert words[:2] == ["python", "analysis/selection.py"]
    argv = words[2:]
    argv[argv.index("--out") + 1] = str(tmp_path)
    monkeypatch.chdir(REPO)  # the page's paths are the checkout's
    assert main(argv) == 0
    assert "18 candidate checkpoints of 12 runs" in capsys.readouterr().out  # as the page says
    drawn = (tmp_path / "selection.png").read_bytes()
    assert drawn == (REPO / "docs" / "images" / "selection_testbed.png").read_bytes()
