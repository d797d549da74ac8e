"""bench/gpu_measure.py, the measurement part of the GPU check: its smoke mode on the CPU, in
process and through bench/gpu_check.sh."""

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"


@pytest.fixture
def gpu_measure(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # it imports bench/truth.py, as run from bench/
    spec = importlib.util.spec_from_file_location("gpu_measure", BENCH / "gpu_measure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_mode_times_each_measurement_and_checks_each_setting(gpu_measure, tmp_path):
    report = json.loads(gpu_measure.main(["--smoke", "--out", str(tmp_path)]).read_text())
    first, second = report["checkpoint"][1:]
    for key in ("time/loss_s", "time/flatness_s", "time/probe_s", "time/lookup_s"):
        assert first["times"][key] > 0, key
    assert "time/lookup_s" not in second["times"]  # once per trial
    assert second["metrics"] == first["metrics"]  # the same model, the cached truth
    settings = {row["setting"]: row for row in report["settings"]}
    assert set(settings) == set(gpu_measure.TOLERANCE)
    assert all(row["within"] for row in settings.values()), settings
    assert settings["fisher_bf16"]["relative_difference"] > 0  # bf16 ran
    assert [row["fused"] for row in report["truth"]] == [True, False]
    assert all(row["rule_evaluations_per_s"] > row["sentences_per_s"] > 0
               for row in report["truth"])

# bench/gpu_check.sh smoke (tests/bench/test_packs.py) runs this script's smoke mode too.
