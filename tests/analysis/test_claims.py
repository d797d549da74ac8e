"""Claims: effects against hand-computed values, the verdict rule, and interval coverage."""

import numpy as np
import pandas as pd
import pytest

from analysis.claims import (
    algorithm_effects,
    claim_rows,
    mean_ci,
    plateau_effects,
    size_effects,
    verdict,
)

ACC_B, ACC_C, TR, KL = "probe/B/acc_mean", "probe/C/acc_mean", "flat/trace_fisher", "pretrain/kl"


def steps_runs(kls, accs, seeds=(0, 1, 2), slope=0.01):
    rows = []
    for seed in seeds:
        for i, (kl, a) in enumerate(zip(kls, accs, strict=True)):
            rows.append({"run_id": f"s{seed}", "experiment": "steps", "train.seed": seed,
                         "step": 100 * i, KL: kl, ACC_C: a + slope * seed * i,
                         ACC_B: a, TR: 100.0 - 10 * i, "probe/C/acc_se": 0.01})
    return pd.DataFrame(rows)


def test_plateau_starts_where_the_kl_is_within_tol_of_the_final_kl():
    df = steps_runs(kls=[1.0, 0.30, 0.21, 0.20], accs=[0.5, 0.6, 0.62, 0.65])
    res = plateau_effects(df, ACC_C, tol=0.02)
    # plateau = steps 200 and 300 (KL 0.21, 0.20); effect = acc(300) - acc(200) per seed
    assert res["effects"] == pytest.approx([0.03, 0.04, 0.05])
    assert res["precondition"]
    assert plateau_effects(df, TR, tol=0.02)["effects"] == pytest.approx([-10.0] * 3)


def test_no_plateau_is_an_unmet_precondition():
    df = steps_runs(kls=[1.0, 0.6, 0.3, 0.1], accs=[0.5, 0.6, 0.62, 0.65])
    assert not plateau_effects(df, ACC_C, tol=0.02)["precondition"]


def sized(kl_by_model, acc_by_model, seeds=(0, 1)):
    rows = []
    for seed in seeds:
        for model, kl in kl_by_model.items():
            rows.append({"run_id": f"{model}-{seed}", "experiment": "sizes", "model": model,
                         "train.seed": seed, "step": 10, KL: kl,
                         ACC_B: acc_by_model[model] + 0.01 * seed})
    return pd.DataFrame(rows)


def test_sizes_compare_the_largest_and_smallest_saturated_models():
    models = {"d16-h1-l1-i64": 0.50, "d32-h2-l1-i128": 0.21, "d64-h4-l2-i256": 0.20}
    accs = {"d16-h1-l1-i64": 0.4, "d32-h2-l1-i128": 0.6, "d64-h4-l2-i256": 0.7}
    res = size_effects(sized(models, accs), ACC_B, tol=0.02)
    assert res["precondition"] and res["effects"] == pytest.approx([0.1, 0.1])
    assert "d64-h4-l2-i256 vs d32-h2-l1-i128" in res["note"]
    far = size_effects(sized(models, accs), ACC_B, tol=0.001)  # one saturated: shown, unmet
    assert not far["precondition"] and far["effects"] == pytest.approx([0.3, 0.3])


def test_algorithms_pair_by_seed_and_check_the_loss_gap():
    rows = []
    for seed in (0, 1, 2):
        for alg, a, kl in (("adamw", 0.7, 0.2), ("adversarial", 0.6, 0.21)):
            rows.append({"run_id": f"{alg}{seed}", "experiment": "algorithms", "step": 5,
                         "train.algorithm": alg, "train.seed": seed, KL: kl,
                         ACC_B: a + 0.02 * seed, "lookup/B/acc_mean": 0.9})
    df = pd.DataFrame(rows)
    res = algorithm_effects(df, ACC_B, "adversarial", "adamw", tol=0.02)
    assert res["effects"] == pytest.approx([-0.1] * 3) and res["precondition"]
    assert not algorithm_effects(df, ACC_B, "adversarial", "adamw", tol=0.001)["precondition"]
    look = algorithm_effects(df, "lookup:B", "lookup", "adamw", tol=0.3)
    assert look["effects"] == pytest.approx([0.2, 0.18, 0.16]) and look["precondition"]


def test_verdict_rule():
    assert verdict(+1, (0.01, 0.2), True) == "reproduces"
    assert verdict(-1, (0.01, 0.2), True) == "contradicts"
    assert verdict(-1, (-0.2, -0.01), True) == "reproduces"
    assert verdict(+1, (-0.1, 0.2), True) == "inconclusive"
    assert verdict(+1, (0.01, 0.2), False) == "inconclusive (precondition)"


@pytest.mark.parametrize("n", [2, 3, 5])
def test_t_interval_covers_the_true_effect_95_percent(n):
    rng = np.random.default_rng(n)
    hits = 0
    reps = 4000
    for _ in range(reps):
        _, low, high, _ = mean_ci(rng.normal(0.3, 1.0, size=n))
        hits += low <= 0.3 <= high
    assert abs(hits / reps - 0.95) < 0.015


def test_one_seed_uses_the_measurement_standard_error():
    mean, low, high, n = mean_ci([0.1], ses=[0.05])
    assert n == 1 and mean == 0.1 and high - low == pytest.approx(2 * 1.959964 * 0.05)
    assert np.isnan(mean_ci([0.1])[1])


def test_claim_rows_give_every_claim_with_data_a_row():
    df = steps_runs(kls=[1.0, 0.30, 0.21, 0.20], accs=[0.5, 0.6, 0.62, 0.65])
    rows = claim_rows(df, tol=0.02)
    assert set(rows["metric"]) == {ACC_C, TR, ACC_B}
    tr = rows[rows["metric"] == TR].iloc[0]
    assert tr["verdict"] == "reproduces" and tr["effect"] == pytest.approx(-10.0)


def test_seeds_to_resolve_is_where_the_t_interval_would_exclude_zero():
    from scipy import stats

    from analysis.claims import seeds_to_resolve

    values = [0.002, 0.0045]  # mean 0.00325, sd 0.00177
    n = seeds_to_resolve(values)
    sd, mean = np.std(values, ddof=1), np.mean(values)
    assert stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) < mean
    assert stats.t.ppf(0.975, n - 2) * sd / np.sqrt(n - 1) >= mean  # the fewest
    assert np.isnan(seeds_to_resolve([0.1]))
