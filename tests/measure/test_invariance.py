"""Which measures survive function-preserving reparameterisations, by test (issue 54): each
(measure, reparameterisation) of ``flatlm.experiments.invariance`` is measured before and after on
a tiny trained BERT and its verdict asserted, so that a measure changing status fails here. The
committed ``bench/results/invariance.json`` must hold the same verdicts.

The verdicts (``invariance.VERDICTS``): E exact, W within noise, C changes, U undefined after
(finite before, NaN after), NA not measurable after (no Adam moments for added blocks). A
verdict in ``FRAGILE`` is within a factor 2 of its tolerance: it is asserted to stay there, not
to stay on its side (another platform's float sums may move it across).

About two minutes in all: the training and the baseline (~10 s), each control permutation and
each case (~6-12 s) are measured once, by the first test that needs them.
"""

import json
import math
from pathlib import Path

import pytest

from analysis.leaderboard import measure_keys
from flatlm.experiments import invariance as inv

E, W, C, U, NA = inv.VERDICTS
CASE_NAMES = ("query-key", "value-output", "layer-norm", "permutation", "grow-width-paper",
              "grow-width-head-norm", "grow-depth-paper", "grow-depth-head-norm")
EXPECTED = {  # measure -> its verdict under each case of CASE_NAMES
    "pretrain/loss": (E, E, E, E, E, E, E, E),
    "flat/trace_fisher": (C, C, C, E, C, C, C, C),
    "flat/trace_hessian": (C, C, C, W, W, W, W, W),
    "flat/top_eig_hessian": (C, C, C, E, C, C, C, C),
    "flat/top_eig_fisher": (C, C, C, E, C, C, C, C),
    "flat/sharpness_worst_linf": (E, E, E, W, W, W, C, C),
    "flat/sharpness_worst_l2": (E, E, E, W, C, C, C, C),
    "flat/sharpness_avg": (E, E, E, W, W, W, W, W),
    "flat/precond_sharpness": (C, C, C, E, C, C, NA, NA),
    "flat/critical_sharpness": (C, U, C, E, C, C, C, C),
    "llc/mean": (C, C, C, W, C, W, W, W),
    "flat/trace_fisher_grown": (C, C, C, E, E, C, E, C),
    "flat/trace_hessian_grown": (C, C, C, W, E, W, E, W),
    "noise/loss_delta_0.03": (E, E, E, W, W, W, W, W),
    "noise/loss_delta_0.1": (E, E, E, W, W, W, W, W),
    "cka/truth": (E, E, E, E, E, E, E, E),
    "cka/truth_token": (E, E, E, E, E, E, E, E),
}
FRAGILE = {("flat/trace_hessian", "grow-width-paper"),
           ("flat/sharpness_worst_linf", "grow-width-paper"),
           ("flat/sharpness_worst_linf", "grow-width-head-norm"),
           ("flat/trace_hessian_grown", "grow-width-head-norm")}
RESULTS = Path(__file__).parents[2] / "bench" / "results" / "invariance.json"


def expected(measure: str, case: str) -> str:
    return EXPECTED[measure][CASE_NAMES.index(case)]


class Table:
    """The baseline, and each control and case measured once, when first asked for."""

    def __init__(self, workdir: Path):
        self.base = inv.baseline(workdir)
        self.controls: dict[int, dict] = {}
        self.rows: dict[str, dict[str, inv.Row]] = {}

    def control(self, seed: int) -> dict:
        if seed not in self.controls:
            self.controls[seed] = inv.control_metrics(self.base, seed)
        return self.controls[seed]

    def case(self, name: str) -> dict[str, inv.Row]:
        if name not in self.rows:
            levels = inv.noise(self.base.metrics, [self.control(s) for s in inv.CONTROL_SEEDS])
            case = next(c for c in inv.CASES if c.name == name)
            self.rows[name] = {r.measure: r for r in inv.case_rows(self.base, levels, case)}
        return self.rows[name]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return Table(tmp_path_factory.mktemp("invariance"))


def test_the_table_covers_every_case_and_measure():
    assert tuple(c.name for c in inv.CASES) == CASE_NAMES
    assert tuple(EXPECTED) == inv.TESTED_MEASURES
    assert {case for _, case in FRAGILE} <= set(CASE_NAMES)


def test_every_measure_the_leaderboard_ranks_is_tested(table):
    """What ``analysis.leaderboard`` would rank in these metrics is among ``TESTED_MEASURES``."""
    ranked = measure_keys(table.base.metrics)
    assert set(ranked) <= set(inv.TESTED_MEASURES), set(ranked) - set(inv.TESTED_MEASURES)
    assert len(ranked) == len(inv.TESTED_MEASURES) - 1  # all but the loss, the maps' own check


@pytest.mark.parametrize("seed", inv.CONTROL_SEEDS)
def test_a_control_leaves_the_exact_estimators_exact(table, seed):
    """Under every control permutation, the measures exact under the table's permutation are
    exact too: their estimators' draws do not depend on the coordinates."""
    metrics = table.control(seed)
    for measure in inv.TESTED_MEASURES:
        if expected(measure, "permutation") == E:
            change = inv.relative_change(table.base.metrics[measure], metrics[measure])
            assert change <= inv.FLOOR, (measure, change)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_each_case_keeps_the_logits(table, case):
    """float64: the exact maps to rounding, growth and layer-norm to LayerNorm's eps terms."""
    rows = table.case(case)
    assert rows[inv.LOSS].max_logit_change < 1e-8
    assert rows[inv.LOSS].verdict == E


@pytest.mark.parametrize(("case", "measure"), [(case, measure) for case in CASE_NAMES
                                               for measure in inv.TESTED_MEASURES])
def test_the_verdict(table, case, measure):
    row = table.case(case)[measure]
    if (measure, case) in FRAGILE:
        assert row.fragile and row.verdict in (W, C), row
    else:
        assert row.verdict == expected(measure, case), row


def test_the_committed_table_has_these_verdicts():
    record = json.loads(RESULTS.read_text())
    assert [c["name"] for c in record["cases"]] == list(CASE_NAMES)
    assert record["measures"] == list(inv.TESTED_MEASURES)
    for row in record["rows"]:
        key = (row["measure"], row["case"])
        assert row["verdict"] == expected(*key), row
        assert row["fragile"] == (key in FRAGILE), row
        assert row["invariant"] == inv.is_invariant(row["verdict"]), row


def test_the_rule():
    """exact <= FLOOR < within noise <= tolerance < changes; NaN after: undefined; a missing
    state or a NaN before: n/a."""
    tol = inv.tolerance(0.1)
    assert tol == pytest.approx(0.3) and inv.tolerance(0.0) == inv.FLOOR
    assert inv.verdict(2.0, 2.0 * (1 + 1e-7), tol) == E
    assert inv.verdict(2.0, 2.5, tol) == W
    assert inv.verdict(2.0, 3.0, tol) == C
    assert inv.verdict(2.0, math.nan, tol) == U
    assert inv.verdict(math.nan, 2.0, tol) == NA
    assert inv.verdict(2.0, 2.0, tol, lacks_state=True) == NA
    assert inv.is_fragile(C, 0.5, tol) and not inv.is_fragile(C, 0.7, tol)
    assert [inv.is_invariant(v) for v in inv.VERDICTS] == [True, True, False, False, None]
