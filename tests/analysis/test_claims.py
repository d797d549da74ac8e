"""Claims: effects against hand-computed values, the verdict rule on planted tables (no verdict
below 3 seeds or off saturation; inconclusive split by the paper's effect), interval coverage,
and the claims' attribution to the paper."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.claims import (
    CLAIMS,
    CONTRADICTS,
    LOSSES_DIFFER,
    NO_EFFECT,
    NO_SIZE,
    NOT_SATURATED,
    REPRODUCES,
    UNDERPOWERED,
    VerdictRule,
    algorithm_effects,
    claim_rows,
    mean_ci,
    saturated_window,
    seeds_to_resolve,
    size_effects,
    verdict,
    window_effects,
)

ACC_A, ACC_B, ACC_C = "probe/A/acc_mean", "probe/B/acc_mean", "probe/C/acc_mean"
TR, TR_GROWN, KL = "flat/trace_fisher", "flat/trace_fisher_grown", "pretrain/kl"
DECISIVE = {REPRODUCES, CONTRADICTS, NO_EFFECT, UNDERPOWERED, NO_SIZE}
RULE = VerdictRule()


def steps_runs(kls, accs, seeds=(0, 1, 2), slope=0.01, experiment="steps"):
    """One run per seed; acc C gains ``slope * seed`` per checkpoint on top of ``accs``."""
    rows = []
    for seed in seeds:
        for i, (kl, a) in enumerate(zip(kls, accs, strict=True)):
            rows.append({"run_id": f"{experiment}{seed}", "experiment": experiment,
                         "train.seed": seed, "step": 100 * i, KL: kl,
                         ACC_C: a + slope * seed * i, ACC_B: a, ACC_A: a,
                         TR: 100.0 - 10 * i})
    return pd.DataFrame(rows)


# -- steps / sgd: the saturated window -----------------------------------------------------

def test_the_window_is_the_final_stretch_at_kl_within_the_saturation_tolerance():
    run = steps_runs(kls=[1.0, 0.019, 0.5, 0.015, 0.012, 0.010], accs=[0.5] * 6, seeds=(0,))
    assert saturated_window(run)["step"].tolist() == [300, 400, 500]  # 0.019 is cut off by 0.5
    assert saturated_window(run, saturation=0.011)["step"].tolist() == [500]
    rising_again = steps_runs(kls=[1.0, 0.01, 0.01, 0.03], accs=[0.5] * 4, seeds=(0,))
    assert saturated_window(rising_again).empty


def test_window_effects_compare_the_first_and_last_saturated_checkpoints():
    df = steps_runs(kls=[1.0, 0.30, 0.018, 0.015, 0.012], accs=[0.5, 0.6, 0.62, 0.63, 0.65])
    res = window_effects(df, ACC_C)
    # window = steps 200..400; effect = acc(400) - acc(200) = 0.03 + 2 * 0.01 * seed
    assert res.values == pytest.approx([0.03, 0.05, 0.07])
    assert res.saturated and res.same_loss
    assert res.kl_max == pytest.approx(0.018) and res.kl_spread == pytest.approx(0.006)
    relative = window_effects(df, TR, relative=True)  # Tr 80 -> 60
    assert relative.values == pytest.approx([60 / 80 - 1] * 3)


def test_a_monotone_curve_far_from_the_truth_is_not_saturated():
    # KL falls monotonically to 0.5 and flattens: the old rule ("plateau = checkpoints within
    # tol of the final KL") was met here, and the rising accuracy would have read "reproduces"
    df = steps_runs(kls=[1.2, 0.8, 0.6, 0.51, 0.505, 0.50], accs=[0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    for experiment in ("steps", "sgd"):
        rows = claim_rows(df.assign(experiment=experiment))
        assert len(rows) and (rows["verdict"] == NOT_SATURATED).all(), experiment
        assert (~rows["saturated"]).all()
        assert (rows["effect"] > 0).loc[rows["metric"].str.startswith("probe")].all()


def test_a_saturated_rising_curve_reproduces_with_three_seeds():
    df = steps_runs(kls=[1.0, 0.3, 0.015, 0.012, 0.010], accs=[0.5, 0.6, 0.6, 0.65, 0.7])
    rows = claim_rows(df).set_index("metric")
    assert rows.loc[ACC_C, "verdict"] == REPRODUCES
    assert rows.loc[ACC_C, "n"] == 3 and rows.loc[ACC_C, "saturated"]


def test_one_run_unsaturated_makes_the_claim_unsaturated():
    good = steps_runs(kls=[1.0, 0.015, 0.012, 0.010], accs=[0.5, 0.6, 0.65, 0.7])
    bad = steps_runs(kls=[1.0, 0.6, 0.55, 0.50], accs=[0.5, 0.6, 0.65, 0.7], seeds=(3,))
    res = window_effects(pd.concat([good, bad]), ACC_C)
    assert not res.saturated and len(res.values) == 4 and "3/4 runs" in res.note


# -- the rule ------------------------------------------------------------------------------

def test_no_verdict_below_three_seeds_on_any_planted_table():
    saturated_steps = [1.0, 0.015, 0.012, 0.010]
    for seeds in ((0,), (0, 1)):
        tables = [steps_runs(saturated_steps, [0.5, 0.6, 0.7, 0.8], seeds=seeds),
                  steps_runs(saturated_steps, [0.5, 0.6, 0.7, 0.8], seeds=seeds,
                             experiment="sgd"),
                  sized({"d16-h1-l1-i64": 0.01, "d64-h4-l2-i256": 0.005},
                        {"d16-h1-l1-i64": 0.4, "d64-h4-l2-i256": 0.7}, seeds=seeds),
                  algorithms_table(seeds=seeds)]
        rows = pd.concat([claim_rows(t) for t in tables], ignore_index=True)
        assert len(rows) > 10 and (rows["n"] < 3).all()
        assert not rows["verdict"].isin(DECISIVE).any(), rows["verdict"].unique()
        assert (rows["verdict"] == "inconclusive (n < 3)").all()
        if len(seeds) == 1:
            assert rows["ci_low"].isna().all()  # one seed: no interval at all


def test_verdict_order_and_kinds():
    kw = {"n": 5, "paper_effect": 0.05, "saturated": True}
    assert verdict(+1, (0.01, 0.2), **kw) == REPRODUCES
    assert verdict(-1, (0.01, 0.2), **kw) == CONTRADICTS
    assert verdict(-1, (-0.2, -0.01), **{**kw, "paper_effect": -0.05}) == REPRODUCES
    assert verdict(+1, (0.01, 0.2), **{**kw, "saturated": False}) == NOT_SATURATED
    assert verdict(+1, (0.01, 0.2), **{**kw, "n": 1, "saturated": False}) == NOT_SATURATED
    assert verdict(+1, (0.01, 0.2), **kw, same_loss=False) == LOSSES_DIFFER
    assert verdict(+1, (0.01, 0.2), **{**kw, "n": 2}) == "inconclusive (n < 3)"
    strict = VerdictRule(min_seeds=5)
    assert verdict(+1, (0.01, 0.2), **{**kw, "n": 4}, rule=strict) == "inconclusive (n < 5)"


@pytest.mark.parametrize("sign, ci, paper, expected", [
    (+1, (-0.01, 0.03), 0.05, NO_EFFECT),  # contains 0, excludes +5 pts
    (+1, (-0.01, 0.06), 0.05, UNDERPOWERED),  # contains both
    (+1, (-0.01, 0.05), 0.05, UNDERPOWERED),  # the edge counts as inside
    (-1, (-0.03, 0.01), -0.069, NO_EFFECT),  # a "worse" claim: -6.9 pts outside
    (-1, (-0.08, 0.01), -0.069, UNDERPOWERED),
    (+1, (-0.01, 0.06), None, NO_SIZE),  # the paper gives a direction only
    (+1, (np.nan, np.nan), 0.05, "inconclusive (no interval)"),
])
def test_inconclusive_is_split_by_the_papers_effect(sign, ci, paper, expected):
    assert verdict(sign, ci, n=5, paper_effect=paper, saturated=True) == expected


def test_the_split_through_claim_rows_on_constructed_intervals():
    # sgd acc C (paper: +1.6 pts): per-seed effects with mean 0 and a known t interval
    def table(spread):
        accs = {0: -spread, 1: 0.0, 2: spread}
        rows = []
        for seed, end in accs.items():
            for i, kl in enumerate([1.0, 0.015, 0.01]):
                rows.append({"run_id": f"s{seed}", "experiment": "sgd", "train.seed": seed,
                             "step": i, KL: kl, ACC_C: 0.5 + (end if i == 2 else 0.0)})
        return pd.DataFrame(rows)

    half = stats.t.ppf(0.975, 2) * 1.0 / np.sqrt(3)  # the t half-width per unit of spread
    narrow = claim_rows(table(0.01 / half)).set_index("metric").loc[ACC_C]  # CI +-0.01
    wide = claim_rows(table(0.03 / half)).set_index("metric").loc[ACC_C]  # CI +-0.03
    assert narrow["ci_high"] == pytest.approx(0.01) and wide["ci_high"] == pytest.approx(0.03)
    assert narrow["verdict"] == NO_EFFECT and not narrow["paper_in_ci"]
    assert wide["verdict"] == UNDERPOWERED and bool(wide["paper_in_ci"])
    assert wide["paper_effect"] == pytest.approx(0.016)


def test_each_row_carries_what_decided_it():
    df = steps_runs(kls=[1.0, 0.3, 0.015, 0.012, 0.010], accs=[0.5, 0.6, 0.6, 0.65, 0.7])
    rule = VerdictRule(saturation=0.016, tol=0.01, min_seeds=3, level=0.9)
    row = claim_rows(df, rule).set_index("metric").loc[ACC_C]
    assert (row["saturation"], row["tol"], row["min_seeds"], row["level"]) == (0.016, 0.01, 3,
                                                                               0.9)
    assert row["n"] == 3 and np.isfinite(row["ci_low"]) and np.isnan(row["paper_effect"])
    for needle in ("largest compared KL 0.0150 <= 0.016", "n=3 >= 3", "90% CI",
                   "paper: a direction only"):
        assert needle in row["decided_by"]


def test_rule_settings_are_checked():
    with pytest.raises(ValueError, match="VerdictRule.saturation"):
        VerdictRule(saturation=-1)
    with pytest.raises(ValueError, match="VerdictRule.min_seeds"):
        VerdictRule(min_seeds=1)
    with pytest.raises(ValueError, match="VerdictRule.level"):
        VerdictRule(level=95)


# -- sizes and algorithms ------------------------------------------------------------------

def sized(kl_by_model, acc_by_model, seeds=(0, 1, 2)):
    rows = []
    for seed in seeds:
        for model, kl in kl_by_model.items():
            kl = kl(seed) if callable(kl) else kl
            rows.append({"run_id": f"{model}-{seed}", "experiment": "sizes", "model": model,
                         "train.seed": seed, "step": 10, KL: kl,
                         ACC_B: acc_by_model[model] + 0.01 * seed, ACC_A: 0.5,
                         TR_GROWN: 10.0 * len(model)})
    return pd.DataFrame(rows)


SMALL, MID, LARGE = "d16-h1-l1-i64", "d32-h2-l1-i128", "d64-h4-l2-i256"


def test_sizes_compare_the_largest_and_smallest_saturated_models():
    models = {SMALL: 0.05, MID: 0.015, LARGE: 0.010}
    accs = {SMALL: 0.4, MID: 0.6, LARGE: 0.7}
    res = size_effects(sized(models, accs), ACC_B)
    assert res.saturated and res.values == pytest.approx([0.1] * 3)
    assert f"{LARGE} vs {MID}" in res.note
    grown = size_effects(sized(models, accs), TR_GROWN, relative=True)
    assert grown.values == pytest.approx([len(LARGE) / len(MID) - 1] * 3)


def test_a_model_unsaturated_in_one_seed_is_not_saturated():
    models = {SMALL: 0.01, MID: lambda seed: 0.03 if seed == 2 else 0.01, LARGE: 0.5}
    accs = {SMALL: 0.4, MID: 0.6, LARGE: 0.7}
    res = size_effects(sized(models, accs), ACC_B)  # only SMALL is saturated everywhere
    assert not res.saturated and res.values == pytest.approx([0.3] * 3)  # shown: all sizes
    rows = claim_rows(sized(models, accs))
    assert (rows["verdict"] == NOT_SATURATED).all()


def test_one_saturated_model_alone_is_too_few_to_compare_and_says_so():
    rows = claim_rows(sized({MID: 0.015}, {MID: 0.6}))  # every KL below the bound, one size
    assert (rows["verdict"] == NOT_SATURATED).all()
    assert rows["decided_by"].str.contains("0.0150 <= 0.02; too few saturated to compare").all()


def algorithms_table(kls=None, seeds=(0, 1, 2)):
    kls = kls or {"adamw": 0.010, "adversarial": 0.012, "noreg": 0.011, "sam": 0.015}
    accs = {"adamw": 0.7, "adversarial": 0.6, "noreg": 0.68, "sam": 0.69}
    trace = {"adamw": 100.0, "adversarial": 250.0, "noreg": 140.0, "sam": 90.0}
    rows = []
    for seed in seeds:
        for alg, kl in kls.items():
            rows.append({"run_id": f"{alg}{seed}", "experiment": "algorithms", "step": 5,
                         "train.algorithm": alg, "train.seed": seed, KL: kl, TR: trace[alg],
                         ACC_B: accs[alg] + 0.02 * seed, ACC_A: accs[alg], ACC_C: accs[alg],
                         "lookup/B/acc_mean": 0.6, "lookup/A/acc_mean": 0.6})
    return pd.DataFrame(rows)


def test_algorithms_pair_by_seed_and_need_every_compared_checkpoint_saturated():
    df = algorithms_table()
    res = algorithm_effects(df, ACC_B, "adversarial", "adamw")
    assert res.values == pytest.approx([-0.1] * 3) and res.saturated and res.same_loss
    sharper = algorithm_effects(df, TR, "adversarial", "adamw", relative=True)
    assert sharper.values == pytest.approx([1.5] * 3)
    look = algorithm_effects(df, "lookup:B", "lookup", "adamw")
    assert look.values == pytest.approx([-0.1, -0.12, -0.14]) and look.saturated
    far = algorithms_table({"adamw": 0.010, "adversarial": 0.3})
    assert not algorithm_effects(far, ACC_B, "adversarial", "adamw").saturated
    lookup_far = algorithms_table({"adamw": 0.03, "adversarial": 0.01})
    assert not algorithm_effects(lookup_far, "lookup:B", "lookup", "adamw").saturated
    close = VerdictRule(tol=0.001)  # saturated, but 0.002 apart
    res = algorithm_effects(df, ACC_B, "adversarial", "adamw", close)
    assert res.saturated and not res.same_loss
    rows = claim_rows(df, close)
    adversarial = rows[rows["metric"].str.contains("adversarial - adamw")]
    assert (adversarial["verdict"] == LOSSES_DIFFER).all()


def test_claim_rows_on_a_saturated_algorithms_table():
    rows = claim_rows(algorithms_table()).set_index("metric")
    adv = rows.loc[f"{ACC_B} (adversarial - adamw)"]
    # per-seed effect -0.1 exactly: a zero-width interval below 0 and below the paper's -6.9
    assert adv["verdict"] == REPRODUCES and adv["effect"] == pytest.approx(-0.1)
    noreg = rows.loc[f"{TR} (noreg - adamw)"]
    assert noreg["effect"] == pytest.approx(0.4) and noreg["analogue"]
    assert noreg["paper_effect"] == pytest.approx(34.91 / 24.55 - 1)


# -- intervals -----------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 5])
def test_t_interval_covers_the_true_effect_95_percent(n):
    rng = np.random.default_rng(n)
    hits = 0
    reps = 4000
    for _ in range(reps):
        _, low, high, _ = mean_ci(rng.normal(0.3, 1.0, size=n))
        hits += low <= 0.3 <= high
    assert abs(hits / reps - 0.95) < 0.015


def test_one_seed_has_no_interval():
    mean, low, high, n = mean_ci([0.1])
    assert n == 1 and mean == 0.1 and np.isnan(low) and np.isnan(high)


def test_seeds_to_resolve_is_where_the_t_interval_would_exclude_zero():
    values = [0.002, 0.0045]  # mean 0.00325, sd 0.00177
    n = seeds_to_resolve(values)
    sd, mean = np.std(values, ddof=1), np.mean(values)
    assert stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) < mean
    assert stats.t.ppf(0.975, n - 2) * sd / np.sqrt(n - 1) >= mean  # the fewest
    assert np.isnan(seeds_to_resolve([0.1]))


# -- attribution ---------------------------------------------------------------------------

def by_figure(prefix):
    return [c for c in CLAIMS if c.figure.startswith(prefix)]


def test_fig4_and_fig10_are_read_off_sgd_and_the_steps_claim_is_fig2a():
    assert {c.experiment for c in by_figure("Fig. 4")} == {"sgd"}
    assert {c.experiment for c in by_figure("Fig. 10")} == {"sgd"}
    steps = [c for c in CLAIMS if c.experiment == "steps"]
    assert [c.figure for c in steps] == ["Fig. 2a (2.3)"] and steps[0].metric == ACC_C
    assert "41M" in steps[0].setting and steps[0].effect_size is None


def test_the_one_point_six_points_belong_to_the_235m_sgd_model_on_task_c():
    (claim,) = [c for c in CLAIMS if c.effect_size == pytest.approx(0.016)]
    assert claim.experiment == "sgd" and claim.metric == ACC_C
    assert "235M" in claim.setting and "SGD" in claim.setting


def test_fig5_numbers_and_the_other_datasets_claims_are_marked_analogues():
    fig5 = {c.metric: c for c in by_figure("Fig. 5")}
    assert fig5[TR_GROWN].effect_size == pytest.approx(12.6 / 19.8 - 1)
    assert fig5[TR_GROWN].relative and fig5[ACC_B].effect_size == pytest.approx(0.101)
    # Fig. 5 under both growth constructions (the verdict depends on it): the same claim
    head_norm = fig5[TR_GROWN + "_head_norm"]
    assert (head_norm.effect_size, head_norm.sign) == (fig5[TR_GROWN].effect_size, -1)
    assert "not B.4.2's" in head_norm.setting
    analogues = {(c.compare, c.metric) for c in CLAIMS if c.analogue}
    assert analogues == {(("noreg", "adamw"), ACC_B), (("noreg", "adamw"), TR),
                         (("sam", "noreg"), ACC_B), (("sam", "noreg"), TR)}
    for c in CLAIMS:
        if c.analogue:
            assert "BookCorpus" in c.setting and "BookCorpus" in c.analogue
        else:
            assert "PCFG" in c.setting


def test_every_numbered_claim_has_its_effect_size_with_the_papers_sign():
    assert sum(c.effect_size is not None for c in CLAIMS) == 15
    for c in CLAIMS:
        if c.effect_size is not None:
            assert np.sign(c.effect_size) == c.sign, c.statement
    table = {(c.compare, c.metric): c.effect_size for c in CLAIMS if c.compare}
    assert table[(("adversarial", "adamw"), TR)] == pytest.approx(19.34 / 8.01 - 1)
    assert table[(("adversarial", "adamw"), ACC_C)] == pytest.approx(-0.055)
    assert table[(("lookup", "adamw"), "lookup:B")] == pytest.approx(-0.095)
    assert table[(("lookup", "adamw"), "lookup:A")] == pytest.approx(-0.187)


def test_the_papers_claims_are_one_class_and_one_table():
    """Issue 39, item 3: one Claim class and one table of the paper's claims in analysis/ (the
    sweep conclusions read analysis.paper_claims.sweep_claims, the report CLAIMS)."""
    import re
    from pathlib import Path

    root = Path(__file__).parents[2] / "analysis"
    classes = [p.name for p in root.glob("*.py") if re.search(r"^class Claim\b", p.read_text(),
                                                                re.M)]
    tables = [p.name for p in root.glob("*.py")
              if re.search(r"^(CLAIMS|PAPER)\b.*=", p.read_text(), re.M)]
    assert classes == ["paper_claims.py"] and tables == ["paper_claims.py"]


def test_a_claim_declares_what_its_effect_compares_and_is_read_by_it_whatever_its_experiment():
    """Issue 51, item 1: the claim carries its effect kind; claim_rows reads a sizes effect by
    the kind, not by the experiment's name, and a kind without its arms is refused."""
    from analysis.paper_claims import ARMS_EFFECT, SIZES_EFFECT, WINDOW_EFFECT, Claim

    assert {c.effect for c in CLAIMS} == {ARMS_EFFECT, SIZES_EFFECT, WINDOW_EFFECT}
    models = {SMALL: 0.05, MID: 0.015, LARGE: 0.010}
    runs = sized(models, {SMALL: 0.4, MID: 0.6, LARGE: 0.7}).assign(experiment="widths")
    claim = Claim("widths", "plug-in", "a wider model probes better", ACC_B, +1, "+5 pts",
                  "planted", 0.05, effect=SIZES_EFFECT)
    row = claim_rows(runs, RULE, claims=(claim,)).iloc[0]
    assert row["effect"] == pytest.approx(0.1) and row["verdict"] == REPRODUCES
    with pytest.raises(ValueError, match="effect='grid'.*window, sizes, arms"):
        Claim("widths", "x", "x", ACC_B, +1, "x", "x", effect="grid")
    with pytest.raises(ValueError, match="'arms' effect names"):
        Claim("algorithms", "x", "x", ACC_B, +1, "x", "x")  # two arms, none named
