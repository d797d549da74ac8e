"""analysis/ on runs of a source without a truth (real text): no pretrain/kl, no
pretrain/entropy. A KL rule selects nothing and says why; the loss rule is to the lowest loss
reached (checked row by row); the report and its tables are written."""

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("scipy")
pytest.importorskip("matplotlib")

REPO = Path(__file__).resolve().parents[2]

from analysis.conclusion import conclusion  # noqa: E402
from analysis.correlate import Bootstrap, correlation_table, saturated, saturation_rule  # noqa: E402
from analysis.tables import summary_table  # noqa: E402
from flatlm.measure import LOSS, TRACE_FISHER  # noqa: E402

ACC = "glue/sst2/accuracy"


@pytest.fixture
def runs() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for run in range(6):
        for step in (10, 20, 30):
            rows.append({"run_id": f"r{run}", "step": step, "algorithm": "adamw",
                         "model": f"m{run % 2}", LOSS: 5.0 - 0.05 * step + 0.1 * run,
                         TRACE_FISHER: rng.uniform(10, 50), ACC: rng.uniform(0.5, 0.9)})
    return pd.DataFrame(rows)


def test_a_kl_rule_selects_nothing_and_says_use_the_loss_tolerance(runs):
    assert not saturated(runs, kl_threshold=0.1).any()
    with pytest.warns(UserWarning, match="measured no pretrain/kl"):
        table = correlation_table(runs, ACC, kl_threshold=0.1, boot=Bootstrap(50))
    assert table.empty
    assert "use --loss-tolerance" in conclusion(runs, table, ACC, kl_threshold=0.1)


def test_the_loss_rule_is_to_the_lowest_loss_reached(runs):
    floor = runs[LOSS].min()
    expected = [loss - floor <= 0.35 for loss in runs[LOSS]]
    assert saturated(runs, loss_tolerance=0.35).tolist() == expected
    assert 0 < sum(expected) < len(runs)
    rule = saturation_rule(loss_tolerance=0.35, df=runs)
    assert rule == "pretrain/loss - min pretrain/loss (no truth) <= 0.35"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        table = correlation_table(runs, ACC, loss_tolerance=0.35, boot=Bootstrap(50))
    assert set(table["x"]) == {TRACE_FISHER, LOSS} and (table["n"] == sum(expected)).all()
    summary = summary_table(runs, ACC, keys=("step", LOSS), match_loss=True)
    assert summary["step mean"].tolist() == [30.0]  # final checkpoints: no KL to match on
