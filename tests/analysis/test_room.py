"""The verdict rule states its room (issue 38): planted tables at the ceiling and at the floor,
measurement error that widens an interval, Holm's adjustment beside the raw verdicts, the lookup
table as one measurement, and Fig. 1's constant-accuracy resamples. Each case failed on the rule
before it (which read "no effect as large as the paper's", ignored the s.e.s and dropped the
resamples)."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import (
    AT_CEILING,
    AT_FLOOR,
    NO_EFFECT,
    NOT_SIGNIFICANT_HOLM,
    REPRODUCES,
    UNDERPOWERED,
    VerdictRule,
    claim_rows,
    with_holm,
)
from analysis.fig1 import Fig1Settings, fig1_rows
from analysis.room import room, room_check, with_accuracy_se
from analysis.uncertainty import holm

KL, TR = "pretrain/kl", "flat/trace_fisher"
N_TEST = 800.0


def probe_columns(task: str, acc: float, se: float, majority: float, stage: str = "probe",
                  n_test: float = N_TEST, ceiling: float | None = None):
    """One arm's probe record as the runs write it (``flatlm.measure`` keys); ``ceiling``: the
    task's Bayes ceiling, recorded where the sentence does not determine the label."""
    out = {f"{stage}/{task}/acc_mean": acc, f"{stage}/{task}/acc_se": se,
           f"{stage}/{task}/majority_acc": majority, f"{stage}/{task}/n_test": n_test}
    if ceiling is not None:
        out[f"{stage}/{task}/bayes_ceiling"] = ceiling
    return out


def sizes_table(acc_small, acc_large, *, se=0.001, majority=0.4, seeds=(0, 1, 2, 3, 4),
                ceiling=None):
    """Two saturated models per seed; task B accuracies given per seed."""
    rows = []
    for seed in seeds:
        for model, accs in (("d16-h1-l1-i64", acc_small), ("d64-h4-l2-i256", acc_large)):
            rows.append({"run_id": f"{model}-{seed}", "experiment": "sizes", "model": model,
                         "train.seed": seed, "step": 10, KL: 0.01,
                         **probe_columns("B", accs[seed], se, majority, ceiling=ceiling)})
    return pd.DataFrame(rows)


def algorithms_table(acc_adamw, acc_other, *, other="adversarial", se=0.001, majority=0.4,
                     lookup=None, lookup_se=0.0):
    """AdamW and one other algorithm per seed at one saturated checkpoint (task B)."""
    rows = []
    for seed, (a, b) in enumerate(zip(acc_adamw, acc_other, strict=True)):
        for alg, acc in (("adamw", a), (other, b)):
            row = {"run_id": f"{alg}{seed}", "experiment": "algorithms", "step": 5,
                   "train.algorithm": alg, "train.seed": seed, KL: 0.01,
                   **probe_columns("B", acc, se, majority)}
            if lookup is not None:
                row |= probe_columns("B", lookup, lookup_se, majority, stage="lookup")
            rows.append(row)
    return pd.DataFrame(rows)


def sgd_table(changes, *, se, start=0.6, n_test=N_TEST):
    """Saturated sgd runs whose task C accuracy rises by ``changes[seed]`` over the window."""
    rows = []
    for seed, change in enumerate(changes):
        for i, kl in enumerate([1.0, 0.015, 0.01]):
            rows.append({"run_id": f"s{seed}", "experiment": "sgd", "train.seed": seed,
                         "step": i, KL: kl,
                         **probe_columns("C", start + (change if i == 2 else 0.0), se, 0.3,
                                         n_test=n_test)})
    return pd.DataFrame(rows)


def row(rows: pd.DataFrame, metric: str) -> pd.Series:
    return rows.set_index("metric").loc[metric]


# -- room: the ceiling and the floor --------------------------------------------------------

def test_a_better_claim_at_the_ceiling_reads_ceiling_not_no_effect():
    # Fig. 3a (paper +6.9 points): both sizes probe B at 99.9-100%, so 6.9 points do not fit
    small = [0.999, 1.0, 0.9995, 0.999, 1.0]
    large = [1.0, 0.999, 0.9995, 1.0, 0.999]
    fig3a = row(claim_rows(sizes_table(small, large)), "probe/B/acc_mean")
    fig3a = fig3a.iloc[0] if isinstance(fig3a, pd.DataFrame) else fig3a
    assert fig3a["ci_low"] < 0 < fig3a["ci_high"] and not fig3a["paper_in_ci"]
    assert fig3a["verdict"] == AT_CEILING  # the old rule: "no effect as large as the paper's"
    assert fig3a["room"] == pytest.approx(1 - np.mean(small))
    assert fig3a["room"] < 2 * 0.069 and fig3a["bound"] == "ceiling"
    assert "at its ceiling" in fig3a["decided_by"]


def test_room_enough_and_no_arm_at_a_bound_keeps_no_effect():
    # the same claim at 60%: 40 points of room, the interval excludes +6.9: no effect
    small = [0.60, 0.61, 0.59, 0.60, 0.605]
    large = [0.61, 0.60, 0.595, 0.605, 0.60]
    rows = claim_rows(sizes_table(small, large, se=0.005))
    fig3a = rows[rows["figure"] == "Fig. 3a (2.3)"].iloc[0]
    assert fig3a["verdict"] == NO_EFFECT and fig3a["bound"] == ""
    assert fig3a["room"] == pytest.approx(1 - np.mean(small))


def test_a_worse_claim_at_the_floor_reads_floor():
    # Table 1 (paper -6.9 points): AdamW probes B one point above the majority share (41%)
    adamw = [0.42, 0.421, 0.419]
    adversarial = [0.421, 0.418, 0.42]
    rows = claim_rows(algorithms_table(adamw, adversarial, se=0.017, majority=0.41))
    table1 = row(rows, "probe/B/acc_mean (adversarial - adamw)")
    assert table1["ci_low"] < 0 < table1["ci_high"]
    assert table1["verdict"] == AT_FLOOR  # the old rule: "no effect as large as the paper's"
    assert table1["room"] == pytest.approx(np.mean(adamw) - 0.41)


def test_an_arm_within_two_se_of_the_ceiling_is_at_its_ceiling_whatever_the_room():
    # a "worse" claim has 58 points of room above the majority share, but AdamW probes 100%
    # in every seed: the task cannot show how much worse the other arm's features are
    rows = claim_rows(algorithms_table([1.0, 1.0, 1.0], [0.999, 1.0, 0.9985], se=0.0))
    table1 = row(rows, "probe/B/acc_mean (adversarial - adamw)")
    assert table1["room"] == pytest.approx(0.6) and table1["verdict"] == AT_CEILING
    assert "within 2 s.e." in table1["decided_by"]


def test_a_bound_does_not_overturn_an_interval_off_zero():
    # the lookup table probes B 4 points below an AdamW at 100%: a ceiling hides effects,
    # it does not make one, so the interval's verdict stands
    rows = claim_rows(algorithms_table([1.0] * 3, [0.99] * 3, lookup=0.96, lookup_se=0.005))
    lookup = row(rows, "lookup:B (lookup - adamw)")
    assert lookup["bound"] == "ceiling" and lookup["verdict"] == REPRODUCES


# -- the Bayes ceiling: labels the sentence does not determine (issue 50) ---------------------

def test_the_room_of_a_better_claim_ends_at_the_bayes_ceiling():
    assert room(+1, control=0.7, majority=0.4, ceiling=0.9) == pytest.approx(0.9 - 0.7)
    assert room(+1, control=0.7, majority=0.4) == pytest.approx(1 - 0.7)  # no ceiling: 1
    assert room(-1, control=0.7, majority=0.4, ceiling=0.9) == pytest.approx(0.7 - 0.4)


def test_a_recorded_bayes_ceiling_gives_the_room_below_it():
    # the claim of test_room_enough_and_no_arm_at_a_bound_keeps_no_effect, on labels whose
    # Bayes accuracy is 90%: room 0.9 - control, and the verdict is unchanged (30 points fit)
    small = [0.60, 0.61, 0.59, 0.60, 0.605]
    large = [0.61, 0.60, 0.595, 0.605, 0.60]
    rows = claim_rows(sizes_table(small, large, se=0.005, ceiling=0.9))
    fig3a = rows[rows["figure"] == "Fig. 3a (2.3)"].iloc[0]
    assert fig3a["room"] == pytest.approx(0.9 - np.mean(small))
    assert fig3a["verdict"] == NO_EFFECT and fig3a["bound"] == ""
    # at a ceiling of 62%, 6.9 points do not fit twice: the claim is at its ceiling
    near = row(claim_rows(sizes_table(small, large, se=0.005, ceiling=0.62)), "probe/B/acc_mean")
    near = near.iloc[0] if isinstance(near, pd.DataFrame) else near
    assert near["room"] == pytest.approx(0.62 - np.mean(small)) and near["verdict"] == AT_CEILING


def ceiling_pairs(ceiling: float | None) -> pd.DataFrame:
    """Three seeds' arms 0.15 below and 0.0015 below 90% on a large test set (s.e. 0.001)."""
    pairs = pd.DataFrame({"treated": [0.8985] * 3, "control": [0.75] * 3,
                          "treated_se": [0.001] * 3, "control_se": [0.001] * 3,
                          "majority": [0.4] * 3, "n_test": [1e6] * 3})
    return pairs if ceiling is None else pairs.assign(ceiling=ceiling)


def test_the_ceiling_bound_is_within_bound_se_of_the_bayes_ceiling_not_of_100_percent():
    bound, space, words = room_check(with_accuracy_se(ceiling_pairs(0.9)), +1, None)
    assert bound == "ceiling" and space == pytest.approx(0.15)
    assert words.endswith("treated 0.8985 within 2 s.e. (0.0010) of the Bayes ceiling 0.9000")
    for absent in (None, np.nan):  # no ceiling recorded: 1, and 0.8985 is far from it
        assert room_check(with_accuracy_se(ceiling_pairs(absent)), +1, None)[0] == ""
    assert room_check(with_accuracy_se(ceiling_pairs(1.0)), +1, None)[:2] == (
        "", pytest.approx(0.25))


# -- measurement error ----------------------------------------------------------------------

def test_a_larger_measurement_se_widens_the_interval_over_the_same_seeds():
    changes = [0.010, 0.020, 0.015]
    widths = []
    for se in (0.001, 0.005, 0.02):  # a test set of 1e6 sentences: above the binomial floor
        sgd = row(claim_rows(sgd_table(changes, se=se, n_test=1e6)), "probe/C/acc_mean")
        widths.append(sgd["ci_high"] - sgd["ci_low"])
        assert sgd["effect"] == pytest.approx(0.015)
        # half-width = sqrt(t_half^2 + (z se_meas)^2), se_meas = sqrt(se^2 + se^2)
        t_half = stats.t.ppf(0.975, 2) * np.std(changes, ddof=1) / np.sqrt(3)
        assert sgd["ci_seed_half"] == pytest.approx(t_half)
        assert sgd["se_meas"] == pytest.approx(np.sqrt(2) * se)
        assert widths[-1] / 2 == pytest.approx(np.hypot(t_half, 1.959964 * np.sqrt(2) * se))
    assert widths[0] < widths[1] < widths[2]


def test_an_accuracy_at_100_percent_is_not_measured_exactly():
    # the plug-in binomial s.e. of 800 sentences all right is 0; the Laplace floor is not
    rows = claim_rows(sgd_table([0.0, 0.0, 0.0], se=0.0, start=1.0))
    sgd = row(rows, "probe/C/acc_mean")
    floor = np.sqrt((801 / 802) * (1 / 802) / 800)
    assert sgd["se_meas"] == pytest.approx(np.sqrt(2) * floor)
    assert sgd["ci_low"] < 0 < sgd["ci_high"] and sgd["verdict"] == AT_CEILING


def test_measurement_error_turns_a_tight_seed_interval_inconclusive():
    # three seeds agree on +1.1 points; one shared test set of 800 sentences measures each
    # accuracy to 1 point (1.7, the binomial floor at 60%)
    sgd_df = sgd_table([0.010, 0.011, 0.012], se=0.01)
    seeds_only = row(claim_rows(sgd_df, VerdictRule(measurement_error=False)),
                     "probe/C/acc_mean")
    counted = row(claim_rows(sgd_df), "probe/C/acc_mean")
    assert seeds_only["verdict"] == REPRODUCES  # the old rule's verdict
    assert counted["ci_low"] < 0 < counted["ci_high"]
    assert counted["verdict"] == UNDERPOWERED  # contains 0 and the paper's +1.6 points
    assert counted["p_value"] > 0.05 > seeds_only["p_value"]


# -- the lookup table: one measurement, not one per seed ------------------------------------

@pytest.mark.parametrize("measurement_error", [True, False])
def test_the_lookup_arm_is_not_narrowed_by_repeating_it(measurement_error):
    rule = VerdictRule(measurement_error=measurement_error)
    lookup_se = 0.02
    halves = {}
    for n in (3, 30):
        adamw = 0.9 + 0.002 * np.sin(np.arange(n))  # a little seed spread
        df = algorithms_table(adamw, adamw, lookup=0.85, lookup_se=lookup_se, se=0.001)
        lookup = row(claim_rows(df, rule), "lookup:B (lookup - adamw)")
        halves[n] = (lookup["ci_high"] - lookup["ci_low"]) / 2
        # its s.e. enters once, however many trials repeat it
        assert halves[n] >= stats.norm.ppf(0.975) * lookup_se
    assert halves[30] == pytest.approx(halves[3], rel=0.05)


# -- Holm -----------------------------------------------------------------------------------

def holm_family(marginal_p=0.03, others=9):
    """One marginal "reproduces" among ``others`` tests with an interval verdict, and a row
    that reached no interval verdict (not a test of the family)."""
    rows = [{"verdict": REPRODUCES, "p_value": marginal_p}]
    rows += [{"verdict": NO_EFFECT, "p_value": 0.5}] * others
    rows += [{"verdict": "inconclusive (not saturated)", "p_value": 0.001}]
    return pd.DataFrame(rows)


def test_holm_turns_a_marginal_reproduces_inconclusive_beside_the_raw_verdict():
    out = with_holm(holm_family())
    assert out.loc[0, "verdict"] == REPRODUCES  # the raw verdict stays
    assert out.loc[0, "p_holm"] == pytest.approx(10 * 0.03)  # 10 tests; the 11th is none
    assert out.loc[0, "verdict_holm"] == NOT_SIGNIFICANT_HOLM
    assert np.isnan(out.loc[10, "p_holm"])
    assert (out["verdict_holm"].iloc[1:] == out["verdict"].iloc[1:]).all()
    alone = with_holm(holm_family(others=0))  # one test: Holm is the raw p
    assert alone.loc[0, "verdict_holm"] == REPRODUCES


def test_holm_matches_the_step_down_by_brute_force():
    p = np.array([0.04, 0.001, 0.03, 0.2, 0.01])
    m = len(p)
    order = np.argsort(p)
    expected = np.empty(m)
    for rank, i in enumerate(order):
        expected[i] = max(min(1, (m - j) * p[order[j]]) for j in range(rank + 1))
    assert holm(p) == pytest.approx(expected)


def test_the_report_has_verdict_holm_over_all_protocols(tmp_path):
    from analysis.replication import write_report

    base = algorithms_table([0.70, 0.71, 0.69], [0.60, 0.62, 0.61], se=0.005)
    df = pd.concat([base.assign(protocol="paper"), base.assign(protocol="paper-code")])
    df = df.assign(status="FINISHED", model="d16-h1-l1-i64", **{"pretrain/entropy": 2.0})
    write_report(df, tmp_path, fig1=Fig1Settings(n_boot=10))
    claims = pd.read_csv(tmp_path / "claims.csv")
    for column in ("room", "effect_logit", "logit_low", "p_value", "p_holm", "verdict_holm",
                   "se_meas", "bound"):
        assert column in claims, column
    tested = claims["p_holm"].notna()
    assert tested.sum() == 2  # one claim with data, in two protocols: one family of two
    assert claims.loc[tested, "p_holm"].to_numpy() == pytest.approx(
        holm(claims.loc[tested, "p_value"]))
    md = (tmp_path / "replication.md").read_text()
    assert "verdict_holm" in md and "logit" in md and "Holm" in md


# -- the logit scale ------------------------------------------------------------------------

def test_the_logit_effect_is_averaged_per_seed():
    adamw, adversarial = [0.70, 0.71, 0.69], [0.60, 0.62, 0.61]
    table1 = row(claim_rows(algorithms_table(adamw, adversarial, se=0.005)),
                 "probe/B/acc_mean (adversarial - adamw)")

    def logit(p):
        p = np.asarray(p)
        return np.log((p * N_TEST + 0.5) / ((1 - p) * N_TEST + 0.5))

    assert table1["effect_logit"] == pytest.approx(np.mean(logit(adversarial) - logit(adamw)))
    assert table1["logit_low"] < table1["effect_logit"] < table1["logit_high"]


# -- Fig. 1: constant-accuracy resamples ----------------------------------------------------

def fig1_table(constant_runs=3, varying_runs=2, per_run=3, seed=0):
    """Saturated AdamW checkpoints: some runs probe B at 100% at every checkpoint, the others
    vary, flatter probing better."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(constant_runs + varying_runs):
        for i in range(per_run):
            constant = r < constant_runs  # the flattest runs, at the ceiling
            tr = rng.uniform(20, 40) if constant else rng.uniform(50, 150)
            acc = 1.0 if constant else 0.99 - 0.0001 * tr + rng.normal(0, 1e-4)
            rows.append({"run_id": f"r{r}", "model": "d16-h1-l1-i64", "experiment": "steps",
                         "train.algorithm": "adamw", "step": 100 * i,
                         KL: 0.015 * rng.uniform(0.1, 1.0), TR: tr, "probe/B/acc_mean": acc})
    return pd.DataFrame(rows)


def test_a_constant_accuracy_resample_counts_as_zero_and_is_not_dropped():
    df = fig1_table()
    settings = Fig1Settings(n_boot=400, seed=3)
    (kept,) = fig1_rows(df, settings=settings).to_dict("records")
    # by hand: the same draws; those of the constant runs only have constant accuracy
    picks = np.random.default_rng(3).integers(0, 5, size=(400, 5))
    codes = pd.factorize(df["run_id"])[0]  # r0, r1, r2 are the constant runs
    constant = int(sum((pick < 3).all() for pick in picks))
    assert constant > 0.05 * 400 and kept["resamples_constant"] == constant
    assert set(codes) == set(range(5))
    (dropped,) = fig1_rows(df, settings=Fig1Settings(n_boot=400, seed=3,
                                                     constant_as_zero=False)).to_dict("records")
    # the old rule dropped them: its interval lay on the paper's side of 0 ("reproduces")
    assert dropped["ci_high"] < 0 and dropped["verdict"] == REPRODUCES
    # kept as r = 0 (more than 5% of them), the interval reaches 0: the ceiling
    assert kept["ci_high"] >= 0 and kept["verdict"] == AT_CEILING
    assert "counted as r = 0" in kept["decided_by"]
