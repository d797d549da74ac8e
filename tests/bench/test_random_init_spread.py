"""bench/random_init_spread.py: its init 0 is the trial's own random-init reference (the library's
``random_init/*`` rows on the same evaluation data, equal to the last digit), further inits are
other models, and the committed reading matched the trial's recorded reference."""

import dataclasses
import json

import pytest

from flatlm.core.config import from_dict
from flatlm.measure.run import eval_data, measure_model
from flatlm.runs.trial import TrialConfig, validate_trial
from tests.bench.conftest import BENCH, bench_script

TRIAL = BENCH / "results/replication_testbed_v2/trials/paper/sizes/d64-h4-l1-i256_seed0"
COMMITTED = BENCH / "results/random_init_spread.json"


@pytest.fixture(scope="module")
def bench():
    return bench_script("random_init_spread")


def test_init_zero_is_the_libraries_random_init_reference_and_init_one_another_model(bench):
    got = bench.spread(TRIAL, 2, n_downstream=300)
    cfg = from_dict(TrialConfig, json.loads((TRIAL / "config.json").read_text()))
    measure = dataclasses.replace(cfg.measure, what=("probe",), n_downstream=300)
    source, model_cfg = validate_trial(cfg)
    data = eval_data(source, measure, model_cfg, device="cpu")  # builds the reference's model
    reference = measure_model(data.random_model, source, data, measure, "cpu")
    tasks = sorted(got["tasks"])
    assert tasks == ["A", "B", "C"]
    first, second = got["rows"]
    for task in tasks:
        assert first[f"probe/{task}/acc_mean"] == reference[f"random_init/{task}/acc_mean"]
    assert any(first[f"probe/{task}/acc_mean"] != second[f"probe/{task}/acc_mean"]
               for task in tasks)
    assert all(got["tasks"][t]["sd_over_inits"] >= 0 for t in tasks)


def test_the_committed_reading_rebuilt_the_trials_own_reference():
    result = json.loads(COMMITTED.read_text())
    assert result["inits"] >= 5 and result["n_downstream"] == 20_000
    assert all(t["init0_matches_record"] for t in result["tasks"].values())
