"""The matched-loss rule (analysis/matched.py) on planted runs whose answer is known: a matched
pair reproduces, a pair whose confound bound swamps the paper's effect reads "loss not
matched", a still-falling loss fails the convergence claims' precondition, and the reading
itself (interpolation, nearest checkpoint, slope) against hand-computed values."""

import numpy as np
import pandas as pd
import pytest

from analysis import matched
from analysis.claims import REPRODUCES, VerdictRule, claim_rows
from analysis.matched import Slope, confound_bound, kl_plateau, read_at, slope_on_kl
from analysis.uncertainty import Interval

KL, KL_SE = "pretrain/kl", "pretrain/kl_se"
ACC, ACC_SE = "probe/B/acc_mean", "probe/B/acc_se"
TARGET = 0.6
RULE = VerdictRule(target_kl=TARGET)
SMALL, LARGE = "d64-h4-l1-i256", "d128-h8-l2-i512"


def run_rows(run_id, *, kls, accs, seed, model=SMALL, algorithm="adamw",
             experiment="sizes", kl_se=0.002, acc_se=0.005, steps=None):
    steps = steps or [250 * (i + 1) for i in range(len(kls))]
    return [{"run_id": run_id, "experiment": experiment, "model": model, "train.seed": seed,
             "train.algorithm": algorithm, "step": s, KL: k, KL_SE: kl_se, ACC: a,
             ACC_SE: acc_se, "probe/B/majority_acc": 0.28, "probe/B/n_test": 20000.0}
            for s, k, a in zip(steps, kls, accs, strict=True)]


def trajectory(kls, *, level, slope, seed):
    """Accuracy linear in the KL: ``level`` at the target, ``slope`` per nat, a seed's offset."""
    return [level + slope * (k - TARGET) + 0.003 * (seed - 1) for k in kls]


def sizes_df(*, gain=0.10, slope=-0.4, large_kls=None, seeds=(0, 1, 2), kl_se=0.002):
    small_kls = np.linspace(0.75, 0.50, 11)
    large_kls = np.linspace(0.72, 0.52, 9) if large_kls is None else large_kls
    rows = []
    for seed in seeds:
        rows += run_rows(f"s{seed}", kls=small_kls, seed=seed, kl_se=kl_se,
                         accs=trajectory(small_kls, level=0.60, slope=slope, seed=seed))
        rows += run_rows(f"l{seed}", kls=large_kls, seed=seed, model=LARGE, kl_se=kl_se,
                         accs=trajectory(large_kls, level=0.60 + gain, slope=slope, seed=seed))
    return pd.DataFrame(rows)


def row_of(rows, figure="Fig. 3a"):
    return rows[rows["figure"].str.startswith(figure)].iloc[0]


# -- reading one run ---------------------------------------------------------------------------

def test_read_at_interpolates_linearly_in_the_kl_between_the_bracketing_checkpoints():
    run = pd.DataFrame(run_rows("r", kls=[0.8, 0.65, 0.55, 0.5], accs=[0.5, 0.6, 0.7, 0.8],
                                seed=0, acc_se=0.01))
    r = read_at(run, TARGET, ACC)
    assert r.how == "interpolated" and r.kl == TARGET
    assert r.value == pytest.approx(0.65)  # halfway from 0.65 to 0.55
    assert r.se == pytest.approx(0.01)  # the fully correlated blend of two 0.01s
    assert r.kl_se == pytest.approx(0.002)


def test_read_at_takes_the_nearest_checkpoint_within_the_tolerance_else_nothing():
    run = pd.DataFrame(run_rows("r", kls=[0.8, 0.7, 0.615], accs=[0.5, 0.6, 0.7], seed=0))
    r = read_at(run, TARGET, ACC, match_tol=0.02)
    assert (r.how, r.kl, r.value) == ("nearest", 0.615, 0.7)
    assert read_at(run, TARGET, ACC, match_tol=0.01).how == ""


def test_the_slope_on_the_kl_is_recovered_with_each_seed_its_own_intercept():
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(3):
        kls = np.linspace(0.7, 0.5, 9)
        accs = 0.5 + 0.05 * seed - 0.4 * (kls - TARGET) + rng.normal(0, 0.002, len(kls))
        runs.append(pd.DataFrame(run_rows(str(seed), kls=kls, accs=accs, seed=seed,
                                          acc_se=1e-4)))
    s = slope_on_kl(runs, TARGET, ACC, window=0.1)
    assert s.points == 27
    assert abs(s.slope + 0.4) < 3 * s.se and s.se < 0.02  # intercepts do not bias it
    # a pooled fit without per-seed intercepts would be off: the seeds' offsets are 0.05
    floored = slope_on_kl(runs, TARGET, ACC, window=0.1, se_column="probe/B/majority_acc")
    assert floored.se > s.se  # the measurement s.e. floors the residual one


def test_confound_bound_is_the_steepest_slope_times_the_kl_difference_with_their_se():
    z = 1.959963984540054
    bound = confound_bound([Slope(-0.4, 0.05, 9), Slope(-0.2, 0.01, 9)], 0.01, 0.002, 0.95)
    assert bound == pytest.approx((0.4 + z * 0.05) * (0.01 + z * 0.002))
    assert np.isnan(confound_bound([Slope(np.nan, np.nan, 0)], 0.0, 0.0, 0.95))


def test_a_plateau_is_a_kl_slope_within_its_se_of_zero():
    flat = pd.DataFrame(run_rows("f", kls=[0.6, 0.5, 0.401, 0.399, 0.402, 0.398], seed=0,
                                 accs=[0.5] * 6))
    falling = pd.DataFrame(run_rows("d", kls=[0.6, 0.5, 0.45, 0.42, 0.40, 0.38], seed=0,
                                    accs=[0.5] * 6))
    assert kl_plateau(flat, 4)[0]
    assert not kl_plateau(falling, 4)[0]


# -- planted claims ----------------------------------------------------------------------------

def test_a_matched_pair_with_the_papers_effect_reproduces_at_matched_loss():
    df = sizes_df(gain=0.10)
    rows = claim_rows(df, RULE)
    r = row_of(rows)
    assert r["regime"] == matched.MATCHED and r["target_kl"] == TARGET
    assert r["effect"] == pytest.approx(0.10, abs=1e-9)  # read at the target, both arms
    # interpolated: the only KL difference left is the KL's measurement s.e. (0.002 each)
    slopes = [slope_on_kl([g for _, g in df[df["model"] == m].groupby("run_id")], TARGET, ACC)
              for m in (LARGE, SMALL)]
    assert all(s.slope == pytest.approx(-0.4) for s in slopes)
    assert r["confound_bound"] == pytest.approx(
        confound_bound(slopes, 0.0, np.hypot(0.002, 0.002), 0.95))
    assert 0 < r["confound_bound"] < 0.25 * 0.069
    assert r["verdict"] == REPRODUCES
    assert r["ci_low"] > 0
    assert "matched loss at KL 0.6" in r["decided_by"]


def test_the_confound_bound_widens_the_interval_by_itself():
    rows_loose = claim_rows(sizes_df(gain=0.10, kl_se=0.004), RULE)
    rows_tight = claim_rows(sizes_df(gain=0.10, kl_se=0.0), RULE)
    loose, tight = row_of(rows_loose), row_of(rows_tight)
    assert tight["confound_bound"] == pytest.approx(0.0)  # interpolated, no KL error
    assert loose["confound_bound"] > 0
    widening = (loose["ci_high"] - loose["ci_low"]) - (tight["ci_high"] - tight["ci_low"])
    assert widening == pytest.approx(2 * loose["confound_bound"])


def test_a_confound_bound_above_a_quarter_of_the_papers_effect_is_loss_not_matched():
    # the large model's run stops at KL 0.615 (nearest, within 0.02): 0.015 nats left, on a
    # steep slope (-2 points per 0.01 nats) the bound is far above 0.25 x 6.9 points
    large = np.linspace(0.80, 0.615, 8)
    rows = claim_rows(sizes_df(gain=0.10, slope=-2.0, large_kls=large), RULE)
    r = row_of(rows)
    assert r["regime"] == matched.MATCHED
    assert r["confound_bound"] > 0.25 * 0.069
    assert r["verdict"] == matched.NOT_MATCHED
    assert "confound bound" in r["decided_by"] and "> 0.25 x |paper effect +0.069|" in \
        r["decided_by"]


def test_an_arm_that_never_reaches_the_target_reads_not_reached():
    rows = claim_rows(sizes_df(large_kls=np.linspace(0.9, 0.7, 5)), RULE)
    r = row_of(rows)
    assert r["verdict"] == matched.NOT_REACHED
    assert "did not reach KL 0.6" in r["decided_by"]
    assert "treated seed 0 (KL 0.900 -> 0.700: above the target at its last)" in r["decided_by"]


def test_an_arm_already_below_the_target_at_its_first_checkpoint_is_named_so():
    rows = claim_rows(sizes_df(large_kls=np.linspace(0.57, 0.45, 5)), RULE)
    r = row_of(rows)
    assert r["verdict"] == matched.NOT_REACHED
    assert "(KL 0.570 -> 0.450: below the target from its first checkpoint)" in r["decided_by"]


def steps_df(kls):
    rows = []
    for seed in range(3):
        rows += run_rows(f"t{seed}", kls=kls, seed=seed, experiment="steps",
                         accs=list(np.linspace(0.5, 0.6, len(kls)) + 0.01 * seed))
    return pd.DataFrame(rows).rename(columns={ACC: "probe/C/acc_mean",
                                              ACC_SE: "probe/C/acc_se",
                                              "probe/B/majority_acc": "probe/C/majority_acc",
                                              "probe/B/n_test": "probe/C/n_test"})


def test_a_still_falling_loss_fails_the_convergence_claims_precondition():
    rows = claim_rows(steps_df([0.9, 0.8, 0.72, 0.66, 0.61, 0.57]), RULE)
    r = row_of(rows, "Fig. 2a")
    assert r["regime"] == matched.MATCHED
    assert r["verdict"] == matched.STILL_FALLING
    assert np.isnan(r["p_value"]) or r["verdict"] not in ("reproduces", "contradicts")
    assert "3/3 runs without a KL plateau" in r["decided_by"]


def test_a_measured_plateau_lets_the_convergence_claim_be_read():
    rows = claim_rows(steps_df([0.9, 0.7, 0.602, 0.598, 0.601, 0.599]), RULE)
    r = row_of(rows, "Fig. 2a")
    assert r["verdict"] != matched.STILL_FALLING
    assert r["n"] == 3 and np.isfinite(r["confound_bound"])


def test_a_plateau_above_the_target_is_a_stall_not_convergence():
    # flat (slope within its s.e.) at KL 1.25, where the target is 0.6: SGD on testbed v2
    rows = claim_rows(steps_df([1.5, 1.27, 1.252, 1.248, 1.251, 1.249]), RULE)
    r = row_of(rows, "Fig. 2a")
    assert r["verdict"] == matched.STALLED
    assert "3/3 runs flat above the target KL 0.6" in r["decided_by"]
    assert np.isnan(r["p_value"])


def test_the_lookup_table_at_kl_zero_is_no_matched_comparison():
    rows = []
    for seed in range(3):
        kls = np.linspace(0.75, 0.5, 6)
        part = run_rows(f"a{seed}", kls=kls, seed=seed, experiment="algorithms",
                        accs=list(np.linspace(0.5, 0.6, 6)))
        rows += [{**r, "lookup/B/acc_mean": 0.7, "lookup/B/acc_se": 0.003} for r in part]
    out = claim_rows(pd.DataFrame(rows), RULE)
    r = out[out["metric"].str.startswith("lookup:B")].iloc[0]
    assert r["verdict"] == matched.LOOKUP_AT_ZERO


def test_without_a_target_the_saturation_rule_alone_reads_and_adds_no_columns():
    rows = claim_rows(sizes_df(), VerdictRule())
    assert "regime" not in rows and "confound_bound" not in rows
    assert row_of(rows)["verdict"] == "inconclusive (not saturated)"


@pytest.mark.parametrize("field,value", [("target_kl", 0.0), ("match_tol", -1.0),
                                         ("plateau_points", 2)])
def test_bad_matched_settings_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"VerdictRule.{field}"):
        VerdictRule(**{field: value})


def test_the_report_reads_the_matched_regime_and_states_its_rule(tmp_path):
    from analysis.fig1 import Fig1Settings
    from analysis.replication import write_report

    df = sizes_df(gain=0.10).assign(protocol="paper", status="FINISHED",
                                    **{"pretrain/entropy": 2.64})
    write_report(df, tmp_path, rule=RULE, fig1=Fig1Settings(n_boot=10))
    claims = pd.read_csv(tmp_path / "claims.csv")
    row = claims[claims["figure"].str.startswith("Fig. 3a")].iloc[0]
    assert row["regime"] == matched.MATCHED and row["verdict"] == REPRODUCES
    assert np.isfinite(row["confound_bound"])
    text = (tmp_path / "replication.md").read_text()
    assert "**Matched loss**" in text and "crosses 0.6 nats/token" in text
    assert "| regime |" in text and "| confound |" in text  # the columns are shown


def test_a_direction_only_claims_bound_is_judged_against_what_the_seeds_resolve():
    # the paper's effect, where given, is the scale; the design's resolution never replaces it
    assert matched.confounded(0.02, 0.069, 0.0, 0.25, resolution=1.0)
    assert not matched.confounded(0.01, 0.069, 0.0, 0.25, resolution=1.0)
    # a direction only: a null effect read at matched KLs (bound 0.0056) is not called
    # unmatched when the design resolves only +-0.146 (the first beyond table at n = 2) ...
    assert not matched.confounded(0.0056, None, 0.006, 0.25, resolution=0.146)
    assert matched.confound_scale(None, 0.006, 0.146) == pytest.approx(0.146)
    # ... as it was against our mean alone; a bound above a quarter of both still is
    assert matched.confounded(0.0056, None, 0.006, 0.25)
    assert matched.confounded(0.05, None, 0.006, 0.25, resolution=0.1)
    assert matched.confounded(np.nan, None, 0.5, 0.25, resolution=0.5)  # unknown bound


def test_the_resolution_is_the_interval_before_the_confound_widened_it():
    iv = Interval(0.01, -0.02, 0.04, 3, 0.5, 0.025, 0.004)  # half-width 0.03
    wide = matched.widen(iv, 0.005, 0.95)
    assert (wide.low, wide.high) == pytest.approx((-0.025, 0.045))
    assert matched.resolution(wide, 0.005) == pytest.approx(0.03)
    assert matched.resolution(wide, np.nan) == pytest.approx(0.035)


def test_a_robustness_protocol_is_read_at_its_own_target(tmp_path):
    """A second grammar whose models reach only KL 0.8 in the budget: at the main target (0.6)
    its arms read "target not reached"; at its own (--protocol-target-kl) they are matched,
    and the report says which target the column was read at."""
    from analysis.fig1 import Fig1Settings
    from analysis.replication import write_report

    main = sizes_df(gain=0.10).assign(protocol="paper")
    shifted = sizes_df(gain=0.10).assign(protocol="paper+second-grammar")
    shifted[KL] += 0.2  # every checkpoint 0.2 nats further from the truth
    df = pd.concat([main, shifted], ignore_index=True).assign(
        status="FINISHED", **{"pretrain/entropy": 2.64})
    write_report(df, tmp_path / "one", rule=RULE, fig1=Fig1Settings(n_boot=10))
    own = VerdictRule(target_kl=TARGET, protocol_targets=(("paper+second-grammar", 0.8),))
    write_report(df, tmp_path / "own", rule=own, fig1=Fig1Settings(n_boot=10))
    for out, verdict in (("one", matched.NOT_REACHED), ("own", REPRODUCES)):
        claims = pd.read_csv(tmp_path / out / "claims.csv")
        rows = claims[claims["figure"].str.startswith("Fig. 3a")].set_index("protocol")
        assert rows.loc["paper", "verdict"] == REPRODUCES
        assert rows.loc["paper+second-grammar", "verdict"] == verdict
    assert "its own target, KL 0.8" in (tmp_path / "own" / "replication.md").read_text()
    assert "its own target" not in (tmp_path / "one" / "replication.md").read_text()


def test_a_protocol_target_is_checked_before_any_work():
    from analysis.replication import parse_args

    with pytest.raises(ValueError, match="paper\\+second-grammar=0"):
        VerdictRule(protocol_targets=(("paper+second-grammar", 0.0),))
    for bad in ("paper+second-grammar", "paper+second-grammar=-1", "nonsense=0.9"):
        with pytest.raises(SystemExit):
            parse_args(["--trials", ".", "--out", "x", "--protocol-target-kl", bad])
    args = parse_args(["--trials", ".", "--out", "x", "--protocol-target-kl",
                       "paper+second-grammar=0.9"])
    assert args.protocol_target_kl == [("paper+second-grammar", 0.9)]
