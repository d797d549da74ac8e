"""analysis/invariant_verdicts.py on planted arms whose answer is known: a raw trace that calls
soft targets sharper survives when the invariant measure agrees, does not when it points the
other way, and decides nothing when the traces are equal; the measures re-read are the ones the
committed invariance test found invariant under every rescaling, the CKA left out."""

import numpy as np
import pandas as pd

from analysis.claims import CONTRADICTS, REPRODUCES, VerdictRule
from analysis.invariant_verdicts import (
    invariant_markdown,
    invariant_measures,
    invariant_verdicts,
    survives,
)

TARGET = 0.7
RULE = VerdictRule(target_kl=TARGET)
TRF, TRH, AVG = "flat/trace_fisher", "flat/trace_hessian", "flat/sharpness_avg"
SHARP_SOFT = "soft targets are sharper than sampled words (Tr F)"


def arm(protocol, algorithm, *, trace=10.0, avg=1.0, seeds=(0, 1, 2)):
    """Checkpoints through the target KL; the traces and the average sharpness flat in the KL."""
    rows = []
    for seed in seeds:
        for i, k in enumerate(np.linspace(0.80, 0.60, 9)):
            jitter = 1 + 0.01 * (seed - 1)
            rows.append({
                "run_id": f"{protocol}/algorithms/{algorithm}_seed{seed}", "protocol": protocol,
                "experiment": "algorithms", "model": "d64-h4-l2-i256", "train.seed": seed,
                "train.algorithm": algorithm,
                "train.targets": "truth" if "soft" in protocol else "sampled",
                "step": 250 * (i + 1), "pretrain/kl": k,
                "pretrain/kl_se": 0.002, TRF: trace * jitter, TRF + "_se": 0.05,
                TRH: 2 * trace * jitter, TRH + "_se": 0.1, AVG: avg * jitter,
                "cka/truth": 0.5})
    return rows


def planted(soft_avg):
    return pd.DataFrame(arm("paper", "adamw") + arm("paper", "muon")
                        + arm("paper+soft-targets", "adamw", trace=14.0, avg=soft_avg))


def claim_rows_of(rows, claim):
    return rows[rows["claim"] == claim]


def test_the_measures_re_read_are_invariant_under_every_rescaling_and_not_the_cka():
    got = invariant_measures([TRF, TRH, AVG, "flat/sharpness_worst_linf", "llc/mean",
                              "noise/loss_delta_0.1", "cka/truth", "flat/top_eig_hessian"])
    assert got == ["flat/sharpness_worst_linf", AVG, "noise/loss_delta_0.1"]


def test_a_sharper_raw_trace_survives_when_the_invariant_measure_agrees():
    rows = invariant_verdicts(planted(soft_avg=1.4), RULE)
    soft = claim_rows_of(rows, SHARP_SOFT)
    assert len(soft) == 1 and soft["metric"].iloc[0].startswith(AVG)
    assert soft["raw_verdict"].iloc[0] == REPRODUCES and soft["verdict"].iloc[0] == REPRODUCES
    assert abs(soft["effect"].iloc[0] - 0.4) < 1e-9 and survives(soft) == "yes"


def test_it_does_not_survive_when_the_invariant_measure_points_the_other_way():
    rows = invariant_verdicts(planted(soft_avg=0.7), RULE)
    soft = claim_rows_of(rows, SHARP_SOFT)
    assert soft["verdict"].iloc[0] == CONTRADICTS and survives(soft) == "no"
    muon = claim_rows_of(rows, "Muon is flatter than AdamW (Tr F)")  # equal: nothing decided
    assert muon["raw_verdict"].iloc[0] not in (REPRODUCES, CONTRADICTS)
    assert survives(muon) == "undecided"
    md = invariant_markdown(rows, RULE)
    assert "survives: no" in md and "`flat/sharpness_avg`" in md and "-30.0%" in md


def test_an_arm_that_never_measured_the_measure_reads_not_measured_and_is_no_holm_test():
    """Muon's trainings without the selection measures (its rerun was another model): its
    re-reading says so, rather than "target not reached", and Holm counts only the others."""
    df = planted(soft_avg=1.4)
    df.loc[df["train.algorithm"] == "muon", AVG] = np.nan
    rows = invariant_verdicts(df, RULE)
    muon = claim_rows_of(rows, "Muon is flatter than AdamW (Tr F)")
    assert list(muon["verdict"]) == ["not measured on muon"] and muon["n"].iloc[0] == 0
    assert survives(muon) == "not measured"
    soft = claim_rows_of(rows, SHARP_SOFT)
    assert soft["verdict"].iloc[0] == REPRODUCES  # the rest read as before
    assert list(rows["claim"]).index(SHARP_SOFT) > list(rows["claim"]).index(
        "Muon is flatter than AdamW (Tr F)")  # the claims' own order, not measured ones last
    assert "not measured on muon" in invariant_markdown(rows, RULE)
