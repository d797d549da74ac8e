"""Issue 55's gaps in the verdict rule, each pinned: which scale decides (the points; a logit
interval on another side of 0 is flagged), a verdict that a small change of a threshold flips
(fragile), Holm's family and its per-protocol sensitivity, and ties at r = 0 in Fig. 1's
bootstrap."""

import numpy as np
import pandas as pd

from analysis.claims import (
    NOT_SIGNIFICANT_HOLM,
    REPRODUCES,
    VerdictRule,
    claim_rows,
    scales_agree,
    with_holm,
)
from analysis.correlate import _untied
from analysis.uncertainty import Interval

KL, ACC_B = "pretrain/kl", "probe/B/acc_mean"


def iv(low, high):
    return Interval((low + high) / 2, low, high, 3, np.nan, np.nan, 0.0)


def test_the_points_decide_and_a_logit_interval_on_another_side_is_flagged():
    assert scales_agree(iv(0.01, 0.05), iv(0.1, 0.4)) is True
    assert scales_agree(iv(0.01, 0.05), iv(-0.1, 0.4)) is False  # excludes 0 in points only
    assert scales_agree(iv(-0.01, 0.05), iv(-0.1, 0.4)) is True  # both contain 0
    assert np.isnan(scales_agree(iv(0.01, 0.05), None))


def algorithms_at(kl):
    """adversarial vs adamw, 3 seeds, the adversary 10 points worse on B, both at KL ``kl``."""
    rows = []
    for seed in range(3):
        for algorithm, acc in (("adamw", 0.60 + 0.01 * seed), ("adversarial", 0.50)):
            rows.append({"run_id": f"{algorithm}{seed}", "experiment": "algorithms",
                         "train.algorithm": algorithm, "train.seed": seed, "step": 100, KL: kl,
                         ACC_B: acc, "probe/B/acc_se": 0.005, "probe/B/majority_acc": 0.25,
                         "probe/B/n_test": 4000.0})
    return pd.DataFrame(rows)


def test_a_verdict_at_the_edge_of_a_threshold_is_fragile_and_names_the_change():
    edge = claim_rows(algorithms_at(0.0195), VerdictRule())
    row = edge[edge["metric"].str.startswith(ACC_B)].iloc[0]
    assert row["verdict"] == REPRODUCES
    assert "saturation 0.018: inconclusive (not saturated)" in row["fragile"]
    safe = claim_rows(algorithms_at(0.005), VerdictRule())
    assert safe[safe["metric"].str.startswith(ACC_B)].iloc[0]["fragile"] == ""


def test_holm_is_one_family_over_the_report_with_the_per_protocol_family_beside_it():
    rows = pd.DataFrame({"protocol": ["a", "a", "b", "b"], "verdict": [REPRODUCES] * 4,
                         "p_value": [0.02, 0.03, 0.001, 0.5]})
    out = with_holm(rows)
    # one family of 4: 0.001 x 4, then 0.02 x 3 = 0.06 > 0.05 demotes the rest
    assert out["verdict_holm"].tolist() == [NOT_SIGNIFICANT_HOLM, NOT_SIGNIFICANT_HOLM,
                                            REPRODUCES, NOT_SIGNIFICANT_HOLM]
    # family a alone: 0.02 x 2 = 0.04 and 0.03 -> both stay
    assert out["verdict_holm_protocol"].tolist() == [REPRODUCES, REPRODUCES, REPRODUCES,
                                                     NOT_SIGNIFICANT_HOLM]
    assert np.allclose(out["p_holm_protocol"], [0.04, 0.04, 0.002, 0.5])


def test_a_bootstrap_correlation_of_zero_up_to_rounding_is_a_tie_on_both_sides():
    assert _untied(np.array([1e-16, -3e-17, 0.2, -1e-13])).tolist() == [0.0, 0.0, 0.2, 0.0]
    # a tie sits on both sides of the count: the p-value of ties alone is 1, whatever the
    # sign their rounding took
    boot = _untied(np.array([1e-16, -1e-16] * 5))
    tail = min((boot <= 0).sum(), (boot >= 0).sum())
    assert min(1.0, 2 * (tail + 1) / (boot.size + 1)) == 1.0
