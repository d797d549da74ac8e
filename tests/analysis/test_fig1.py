"""Fig. 1 as a partial correlation given the KL: against a hand computation (residual on
residual, numpy), inside the saturated window only, one parameterisation per row, a cluster
bootstrap over runs with its distinct resamples counted, and no interval below 5 runs."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import NO_SIZE, NOT_SATURATED, REPRODUCES, VerdictRule
from analysis.correlate import Bootstrap, partial_correlation_ci
from analysis.fig1 import Fig1Settings, fig1_rows

ACC_B, TR, TR_GROWN, KL = ("probe/B/acc_mean", "flat/trace_fisher", "flat/trace_fisher_grown",
                           "pretrain/kl")


def residual_on_residual(x, y, z, ranks: bool) -> float:
    """The textbook partial correlation, by hand: residuals of x and y after least squares on
    [1, z], then Pearson of the residuals (on ranks for Spearman's)."""
    x, y, z = (np.asarray(a, float) for a in (x, y, z))
    if ranks:
        x, y, z = (stats.rankdata(a) for a in (x, y, z))
    design = np.column_stack([np.ones_like(z), z])

    def resid(a):
        return a - design @ np.linalg.lstsq(design, a, rcond=None)[0]

    return float(np.corrcoef(resid(x), resid(y))[0, 1])


def table(runs=6, per_run=3, model="d16-h1-l1-i64", seed=0, kl_scale=0.015):
    """Saturated checkpoints where a flatter model probes better beyond what the KL explains."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(runs):
        for i in range(per_run):
            kl = kl_scale * rng.uniform(0.1, 1.0)
            tr = rng.uniform(50, 150)
            rows.append({"run_id": f"{model}/r{r}", "model": model, "train.algorithm": "adamw",
                         "experiment": "steps", "step": 100 * i, KL: kl, TR: tr,
                         ACC_B: 0.9 - 0.002 * tr - 3 * kl + rng.normal(0, 0.02)})
    return pd.DataFrame(rows)


def test_partial_correlation_matches_the_hand_computation():
    df = table()
    for method, ranks in (("spearman", True), ("pearson", False)):
        (row,) = fig1_rows(df, settings=Fig1Settings(method=method, n_boot=200)).to_dict(
            "records")
        assert row["effect"] == pytest.approx(residual_on_residual(df[TR], df[ACC_B], df[KL],
                                                                   ranks), abs=1e-12)
        assert row["checkpoints"] == 18 and row["n"] == 6


def test_the_interval_is_a_cluster_bootstrap_over_runs():
    df = table(runs=5)
    res = partial_correlation_ci(df[TR], df[ACC_B], df[KL], df["run_id"], method="pearson",
                                 boot=Bootstrap(300, seed=7))
    # by hand: the same draws of runs, all of each drawn run's checkpoints
    runs = pd.factorize(df["run_id"])[0]
    picks = np.random.default_rng(7).integers(0, 5, size=(300, 5))
    boot = []
    for pick in picks:
        rows = np.concatenate([np.flatnonzero(runs == c) for c in pick])
        boot.append(residual_on_residual(df[TR].to_numpy()[rows], df[ACC_B].to_numpy()[rows],
                                         df[KL].to_numpy()[rows], ranks=False))
    boot = np.array(boot)
    boot = boot[np.isfinite(boot)]
    assert (res["ci_low"], res["ci_high"]) == pytest.approx(tuple(np.quantile(boot,
                                                                              [0.025, 0.975])))
    assert res["distinct"] == len({tuple(sorted(p)) for p in picks.tolist()})
    assert res["distinct"] <= math.comb(2 * 5 - 1, 5) and res["runs"] == 5


def test_two_runs_have_at_most_three_distinct_resamples():
    df = table(runs=2, per_run=4)
    res = partial_correlation_ci(df[TR], df[ACC_B], df[KL], df["run_id"], boot=Bootstrap(100))
    assert res["distinct"] == 3  # {a, a}, {a, b}, {b, b}


def test_a_strong_planted_correlation_reproduces_with_enough_runs():
    (row,) = fig1_rows(table(runs=8), settings=Fig1Settings(n_boot=300)).to_dict("records")
    assert row["effect"] < -0.5 and row["ci_high"] < 0 and row["verdict"] == REPRODUCES
    assert "8 runs" in row["note"] and "distinct" in row["note"]


def test_fewer_than_five_runs_give_no_interval_and_no_verdict():
    (row,) = fig1_rows(table(runs=4), settings=Fig1Settings(n_boot=100)).to_dict("records")
    assert np.isfinite(row["effect"]) and np.isnan(row["ci_low"]) and np.isnan(row["ci_high"])
    assert row["verdict"] == "inconclusive (runs < 5)"


def test_only_saturated_checkpoints_count():
    df = table()
    early = df.assign(**{KL: 0.5, TR: df[TR] * 3, ACC_B: 1 - df[ACC_B], "step": df["step"] - 1})
    (row,) = fig1_rows(pd.concat([df, early]), settings=Fig1Settings(n_boot=50)).to_dict(
        "records")
    assert row["effect"] == pytest.approx(residual_on_residual(df[TR], df[ACC_B], df[KL], True),
                                          abs=1e-12)
    assert row["checkpoints"] == len(df)
    (far,) = fig1_rows(early, settings=Fig1Settings(n_boot=50)).to_dict("records")
    assert far["verdict"] == NOT_SATURATED
    looser = VerdictRule(saturation=1.0)  # a named setting: the early ones now count
    (loose,) = fig1_rows(pd.concat([df, early]), looser, Fig1Settings(n_boot=50)).to_dict(
        "records")
    assert loose["checkpoints"] == 2 * len(df)


def test_one_parameterisation_per_row():
    small = table(model="d16-h1-l1-i64")
    large = table(model="d64-h4-l2-i256", seed=1).assign(**{TR: lambda d: 10 * d[TR]})
    both = pd.concat([small, large])
    grown = both.assign(**{TR_GROWN: both[TR] / 2, "measure.grow_to": "d64-h4-l2-i256"})
    rows = fig1_rows(grown, settings=Fig1Settings(n_boot=50))
    assert sorted(rows["metric"].str.split(", ").str[-1]) == [
        "grown (measure.grow_to=d64-h4-l2-i256)", "model d16-h1-l1-i64", "model d64-h4-l2-i256"]
    per_model = rows[rows["metric"].str.contains("model d16")].iloc[0]
    assert per_model["effect"] == pytest.approx(
        residual_on_residual(small[TR], small[ACC_B], small[KL], True), abs=1e-12)
    assert rows[rows["metric"].str.contains("grown")].iloc[0]["checkpoints"] == len(both)


def test_other_algorithms_are_left_out_by_default():
    df = table()
    adversarial = table(seed=3).assign(**{"train.algorithm": "adversarial",
                                          "run_id": lambda d: "adv/" + d["run_id"]})
    (row,) = fig1_rows(pd.concat([df, adversarial]), settings=Fig1Settings(n_boot=20)
                       ).to_dict("records")
    assert row["checkpoints"] == len(df)
    (every,) = fig1_rows(pd.concat([df, adversarial]),
                         settings=Fig1Settings(n_boot=20, algorithm=None)).to_dict("records")
    assert every["checkpoints"] == 2 * len(df)


def test_an_interval_through_zero_is_inconclusive_without_a_paper_size():
    rng = np.random.default_rng(5)
    df = table(runs=6).assign(**{ACC_B: lambda d: rng.normal(0.5, 0.05, len(d))})
    (row,) = fig1_rows(df, settings=Fig1Settings(n_boot=300)).to_dict("records")
    assert row["ci_low"] < 0 < row["ci_high"] and row["verdict"] == NO_SIZE


def test_settings_are_checked():
    with pytest.raises(ValueError, match="Fig1Settings.method"):
        Fig1Settings(method="kendall")
    with pytest.raises(ValueError, match="Fig1Settings.min_runs"):
        Fig1Settings(min_runs=1)


def test_list_valued_growth_settings_group_and_growth_compare_is_no_parameterisation():
    """``measure.growth_compare`` is a list param (extra keys, not this measure's setting): the
    grown rows group on the construction alone; a list-valued cell is no error."""
    both = pd.concat([table(model="d16-h1-l1-i64"), table(model="d32-h2-l1-i128", seed=1)])
    grown = both.assign(**{TR_GROWN: both[TR] / 2, "measure.grow_to": "d64-h4-l2-i256",
                           "measure.growth_construction": "paper"})
    grown["measure.growth_compare"] = [["head-norm"]] * len(grown)
    rows = fig1_rows(grown, settings=Fig1Settings(n_boot=50))
    labels = [m for m in rows["metric"] if "grown" in m]
    assert len(labels) == 1 and "growth_compare" not in labels[0]
    assert "measure.growth_construction=paper" in labels[0]


def test_a_training_repeated_by_two_experiments_is_one_run():
    """The sizes trial of the base shape repeats the steps trial of its seed (other
    checkpoints of one training): the bootstrap counts it once, over the union of its
    checkpoints, and r is the one of the distinct checkpoints."""
    df = table(runs=5).assign(**{"pretrain/loss": lambda d: 3.2 + d[KL]})
    twin = df[df["run_id"] == "d16-h1-l1-i64/r0"].assign(run_id="sizes/r0", experiment="sizes")
    extra = twin.iloc[[0]].assign(step=250, **{KL: 0.004, TR: 90.0, ACC_B: 0.7,
                                               "pretrain/loss": 3.204})
    (alone,) = fig1_rows(pd.concat([df, extra.assign(run_id="d16-h1-l1-i64/r0")]),
                         settings=Fig1Settings(n_boot=200)).to_dict("records")
    (both,) = fig1_rows(pd.concat([df, twin, extra]), settings=Fig1Settings(n_boot=200)
                        ).to_dict("records")
    assert both["n"] == alone["n"] == 5 and both["checkpoints"] == alone["checkpoints"] == 16
    assert both["effect"] == pytest.approx(alone["effect"], abs=1e-12)
