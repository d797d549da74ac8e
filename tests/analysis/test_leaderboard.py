"""analysis/leaderboard.py: the head-to-head of measures at equal loss, on planted data
(``tests/analysis/leaderboard_data.py`` says what is planted)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.leaderboard import (
    ALL_SIZES,
    COLUMNS,
    ONE_SHAPE,
    PROBE_COST,
    Group,
    cost_table,
    leaderboard,
    main,
    measure_keys,
    partial_spearman,
    standing,
    timing_key,
    write_leaderboard,
)
from analysis.same_training import merge_same_training
from analysis.selection import cluster_weights
from flatlm.measure import (
    KL,
    LLC,
    LOSS,
    SHARPNESS_AVG,
    TRACE_FISHER,
    TRACE_FISHER_GROWN,
)
from tests.analysis.leaderboard_data import ACC, CKA, SHAPE, planted, write_trials


def stat(board, measure, statistic, group=ONE_SHAPE, task="A"):
    t = board.table
    row = t[(t.group == group) & (t.task == task) & (t.measure == measure)
            & (t.statistic == statistic)]
    assert len(row) == 1, (measure, statistic)
    return row.iloc[0]


def hand_partial_spearman(x, y, z) -> float:
    """Ranks, each residualised on z's ranks by least squares with intercept, Pearson."""
    rx, ry, rz = (stats.rankdata(a) for a in (x, y, z))
    design = np.column_stack([np.ones_like(rz), rz])

    def resid(a):
        return a - design @ np.linalg.lstsq(design, a, rcond=None)[0]

    return float(np.corrcoef(resid(rx), resid(ry))[0, 1])


@pytest.fixture(scope="module")
def board():
    return leaderboard(planted(), tasks=("A",), n_boot=300, seed=0)


def test_the_planted_measure_predicts_beyond_the_loss_and_noise_does_not(board):
    m = stat(board, TRACE_FISHER, "partial_spearman")
    assert m.value > 0.8 and m.ci_low > 0
    noise = stat(board, SHARPNESS_AVG, "partial_spearman")
    assert noise.ci_low < 0 < noise.ci_high
    assert stat(board, TRACE_FISHER, "rank").value == 1
    cka = stat(board, CKA, "partial_spearman")  # -M, higher picked: the same ranking as M
    assert cka.value == pytest.approx(m.value, abs=1e-12)


def test_partial_spearman_equals_the_hand_computation(board):
    df = planted()
    rows = df[df[KL] < 0.02]
    want = hand_partial_spearman(-rows[TRACE_FISHER], rows[ACC], rows[LOSS])
    assert stat(board, TRACE_FISHER, "partial_spearman").value == pytest.approx(want, abs=1e-12)
    assert stat(board, TRACE_FISHER, "n_candidates").value == 36  # the early rows are out
    assert stat(board, TRACE_FISHER, "n_runs").value == 12


def test_weighted_partial_spearman_is_that_of_the_expanded_sample():
    rng = np.random.default_rng(1)
    s, acc, loss = rng.normal(size=9), rng.normal(size=9), rng.normal(size=9)
    acc[3] = acc[5]  # a tie, ranked by average
    w = np.array([[2, 0, 1, 3, 1, 1, 0, 2, 1]], float)
    rows = np.repeat(np.arange(9), w[0].astype(int))
    want = hand_partial_spearman(-s[rows], acc[rows], loss[rows])
    assert partial_spearman(s, acc, loss, w)[0] == pytest.approx(want, abs=1e-12)


def test_regret_and_gains_equal_brute_force(board):
    rows = planted().query(f"`{KL}` < 0.02")
    acc = rows[ACC].to_numpy()
    pick_m = acc[np.argmin(rows[TRACE_FISHER].to_numpy())]
    pick_loss = acc[np.argmin(rows[LOSS].to_numpy())]
    regret_m, regret_loss = acc.max() - pick_m, acc.max() - pick_loss
    assert stat(board, TRACE_FISHER, "regret").value == pytest.approx(regret_m, abs=1e-12)
    assert stat(board, LOSS, "regret").value == pytest.approx(regret_loss, abs=1e-12)
    assert stat(board, TRACE_FISHER, "gain_vs_loss").value == pytest.approx(
        regret_loss - regret_m, abs=1e-12)
    random = acc.max() - acc.mean()
    assert stat(board, TRACE_FISHER, "random_regret").value == pytest.approx(random, abs=1e-12)
    assert stat(board, TRACE_FISHER, "gain_vs_random").value == pytest.approx(
        random - regret_m, abs=1e-12)
    tau = stats.kendalltau(-rows[TRACE_FISHER], acc).statistic
    assert stat(board, TRACE_FISHER, "kendall").value == pytest.approx(tau, abs=1e-12)


def test_the_loss_row_is_zero_by_construction(board):
    for statistic in ("partial_spearman", "gain_vs_loss"):
        row = stat(board, LOSS, statistic)
        assert row.value == 0 and math.isnan(row.ci_low) and math.isnan(row.ci_high)


def test_cluster_weights_move_the_rows_of_a_run_together():
    runs = ["a", "a", "a", "b", "c", "c"]
    w = cluster_weights(runs, 50, np.random.default_rng(0))
    assert (w[:, 0] == w[:, 1]).all() and (w[:, 1] == w[:, 2]).all() and (w[:, 4] == w[:, 5]).all()
    assert (w[:, 0] + w[:, 3] + w[:, 4] == 3).all()  # each resample draws 3 runs


def test_the_bootstrap_resamples_runs_not_rows():
    """A run of three identical checkpoints weighs as one: its rank statistics and regret match
    those of one checkpoint per run resample for resample (same draws of runs), which a
    bootstrap over rows would not give."""
    single = planted().query("step == 100").reset_index(drop=True)
    # each run's row three times in a row: the runs first appear in the same order
    triple = single.loc[single.index.repeat(3)].assign(step=[100, 200, 300] * len(single))
    one = leaderboard(single, tasks=("A",), n_boot=200, seed=3)
    three = leaderboard(triple, tasks=("A",), n_boot=200, seed=3)
    for statistic in ("partial_spearman", "regret", "gain_vs_loss"):
        a, b = stat(one, TRACE_FISHER, statistic), stat(three, TRACE_FISHER, statistic)
        assert (a.value, a.ci_low, a.ci_high) == pytest.approx((b.value, b.ci_low, b.ci_high),
                                                               abs=1e-12)
    rows = leaderboard(triple.assign(run_id=[f"x{i}" for i in range(len(triple))]),
                       tasks=("A",), n_boot=200, seed=3)  # every row its own run: narrower
    wide = stat(three, TRACE_FISHER, "partial_spearman")
    narrow = stat(rows, TRACE_FISHER, "partial_spearman")
    assert narrow.ci_high - narrow.ci_low < wide.ci_high - wide.ci_low


def test_groups_keep_only_comparable_measures_across_sizes():
    b = leaderboard(planted(small_runs=4), tasks=("A",), n_boot=20)
    one, every = b.groups
    assert (one.name, every.name) == (ONE_SHAPE, ALL_SIZES)
    assert one.shapes == [SHAPE] and len(one.runs) == 8 and len(every.runs) == 12
    assert TRACE_FISHER in one.measures and TRACE_FISHER not in every.measures
    assert SHARPNESS_AVG not in every.measures
    assert {TRACE_FISHER_GROWN, LLC, CKA} <= set(every.measures)
    measures = set(b.table[b.table.group == ALL_SIZES].measure)
    assert TRACE_FISHER not in measures and TRACE_FISHER_GROWN in measures
    assert stat(b, TRACE_FISHER_GROWN, "n_runs", group=ALL_SIZES).value == 12
    assert stat(b, TRACE_FISHER, "n_runs").value == 8


def test_trials_of_one_training_count_as_one_run():
    """A trial with the settings of another but its checkpoint steps, or sharing an identical
    checkpoint with it, is the same training: one cluster, its checkpoints at one step one row."""
    df = planted(n_runs=4).assign(**{"train.seed": lambda d: d.run_id.str[1:].astype(int)})
    again = df[df.run_id == "r0"].assign(run_id="r0_again", step=lambda d: d.step * 2)
    again.loc[again.step == 600, TRACE_FISHER_GROWN] = 7.0  # only this trial measured it there
    copy = df[df.run_id == "r1"].assign(run_id="r1_copy", **{"train.seed": 99})  # same values
    merged, label = merge_same_training(pd.concat([df, again, copy], ignore_index=True))
    assert label["r0_again"] == label["r0"] == "r0 = r0_again"
    assert label["r1_copy"] == "r1 = r1_copy" and label["r2"] == "r2"
    r0 = merged[merged.run_id == "r0 = r0_again"].set_index("step")
    assert sorted(r0.index) == [50, 100, 200, 300, 400, 600]  # 100, 200 of r0 and of r0_again
    assert r0.loc[600, TRACE_FISHER_GROWN] == 7.0
    assert len(merged[merged.run_id == "r1 = r1_copy"]) == 4
    b = leaderboard(pd.concat([df, copy], ignore_index=True), tasks=("A",), n_boot=5)
    assert stat(b, TRACE_FISHER, "n_runs").value == 4
    assert stat(b, TRACE_FISHER, "n_candidates").value == 12
    assert any("r1 = r1_copy" in note for note in b.notes)


def test_an_unset_setting_is_one_setting_whether_none_or_nan():
    """Two trials of one training loaded from two record roots: an unset setting is NaN where
    its column holds numbers in that frame and None where it holds none; still one run."""
    df = planted(n_runs=2).assign(**{"train.seed": lambda d: d.run_id.str[1:].astype(int)})
    first = df.assign(**{"train.warmup_proportion": np.nan})
    first.loc[first.run_id == "r1", "train.warmup_proportion"] = 0.12  # a float column
    again = df[df.run_id == "r0"].assign(run_id="r0_again", **{"train.warmup_proportion": None},
                                         step=lambda d: d.step * 2)
    _, label = merge_same_training(pd.concat([first, again], ignore_index=True))
    assert label["r0_again"] == label["r0"] == "r0 = r0_again" and label["r1"] == "r1"


def test_cost_ratio_to_one_training_step():
    df = pd.DataFrame({"run_id": ["r", "r"], "step": [100, 300], "time/train_s": [10.0, 40.0],
                       "time/flatness_s": [5.0, 8.0], "time/loss_s": [0.1, 0.2],
                       "time/probe_s": [1.0, 1.0]})
    group = Group("g", ["r"], [TRACE_FISHER, "flat/trace_hessian"], [SHAPE], "")
    cost = cost_table(df, group).set_index("measure")
    # 0.1 s then 0.2 s a step: 5 / 0.1 = 50 and 8 / 0.2 = 40 steps
    assert cost.loc[TRACE_FISHER, "cost_steps"] == pytest.approx(45)
    assert cost.loc[TRACE_FISHER, "shared_with"] == "flat/trace_hessian"
    assert cost.loc[LOSS, "cost_steps"] == pytest.approx((1 + 1) / 2)
    assert cost.loc[PROBE_COST, "cost_steps"] == pytest.approx((10 + 5) / 2)


def test_timing_keys():
    assert timing_key(TRACE_FISHER) == timing_key("flat/trace_hessian") == "time/flatness_s"
    assert timing_key(TRACE_FISHER_GROWN) == "time/flatness_grown_s"
    assert timing_key("flat/trace_fisher_grown_head_norm") == "time/flatness_grown_head_norm_s"
    assert timing_key("flat/sharpness_worst_l2") == "time/landscape_s"
    assert timing_key("noise/loss_delta_0.1") == "time/noise_s"
    with pytest.raises(ValueError, match="no registered measurement declares it"):
        timing_key("flat/unknown")


def test_measure_keys_and_standing():
    cols = [LOSS, TRACE_FISHER, "flat/trace_fisher_se", "noise/loss_delta_0.1",
            "noise/loss_delta_0.01", "cka/truth_random_init", CKA, "flat/hessian_fisher_gap"]
    assert measure_keys(cols) == [TRACE_FISHER, "noise/loss_delta_0.01",
                                  "noise/loss_delta_0.1", CKA]
    assert standing({"partial_spearman": (0, -0.1, 0.2), "gain_vs_loss": (0, -1, 1)}) == \
        "indistinguishable from the loss"
    assert standing({"partial_spearman": (0, 0.1, 0.2), "gain_vs_loss": (0, -1, 1)}) == \
        "predicts beyond the loss"
    assert standing({"partial_spearman": (0, -0.3, 0.2), "gain_vs_loss": (0, -1, -0.5)}) == \
        "worse than the loss"


def test_outputs_and_the_few_runs_message(board, tmp_path):
    paths = write_leaderboard(board, tmp_path, command="python x", wall_min=12.5,
                              hardware="2 CPU cores")
    assert [p.name for p in paths] == ["leaderboard.md", "leaderboard.csv", "leaderboard.png"]
    md = (tmp_path / "leaderboard.md").read_text()
    assert "Only 12 runs in the window" in md and "fewer than 30" in md
    assert "Best pick: " in md and "12.5 min" in md and "2 CPU cores" in md
    csv = pd.read_csv(tmp_path / "leaderboard.csv")
    assert list(csv.columns) == list(COLUMNS)
    assert {"partial_spearman", "gain_vs_loss", "cost_steps"} <= set(csv.statistic)
    many = leaderboard(planted(n_runs=30), tasks=("A",), n_boot=5)
    assert not any("fewer than" in n for n in many.notes)


def test_main_on_trial_directories(tmp_path):
    trials = write_trials(tmp_path / "trials", planted(n_runs=4))
    out = tmp_path / "out"
    assert main(["--trials", str(trials), "--out", str(out), "--tasks", "A",
                 "--n-boot", "10"]) == 0
    assert "Task A, one shape" in (out / "leaderboard.md").read_text()
    with pytest.raises(SystemExit, match="probe/Z/acc_mean"):
        main(["--trials", str(trials), "--out", str(out), "--tasks", "Z"])


def test_a_matched_band_ranks_the_checkpoints_inside_it_and_no_others(tmp_path):
    """Testbed v2's window: a band around the target KL below saturation. The planted runs moved
    into the band [0.65, 0.75) give the saturated board's table exactly; checkpoints on either
    side (which would win every pick if counted) stay out; the rule says which window it is."""
    saturated_board = leaderboard(planted(), tasks=("A",), n_boot=20)
    df = planted()
    inside = df[KL] == 0.01
    df.loc[inside, KL] = 0.70
    df.loc[~inside, KL] = 0.90  # above the band
    below = df[~inside].assign(step=400, **{KL: 0.50})  # below it: further trained
    band = leaderboard(pd.concat([df, below], ignore_index=True), tasks=("A",), n_boot=20,
                       kl_threshold=0.75, kl_from=0.65)
    pd.testing.assert_frame_equal(band.table, saturated_board.table)
    assert band.matched and band.rule == "0.65 <= pretrain/kl < 0.75"
    write_leaderboard(band, tmp_path)
    assert "the matched window, 0.65 <= pretrain/kl < 0.75" in (
        tmp_path / "leaderboard.md").read_text()
    with pytest.raises(ValueError, match="--kl-from 0.8: the band's lower edge"):
        leaderboard(df, tasks=("A",), n_boot=5, kl_threshold=0.75, kl_from=0.8)
