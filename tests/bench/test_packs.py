"""bench/packs.py: its update-cost rows and its GPU part (the testbed's sizes experiment packed)
run on the CPU at toy sizes; bench/gpu_check.sh's smoke part (spawned processes) is slow-marked."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "bench" / "packs.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("packs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_update_costs_time_every_way_of_batching(bench):
    row = bench.update_costs("d16-h1-l1-i64", 2, 8, repeats=2)
    for name in ("hand_batched_s", "torch_func_vmap_gradient_s", "k_single_models_s"):
        assert row[name] > 0, name
    assert row["speedup_hand_batched"] == pytest.approx(
        row["k_single_models_s"] / row["hand_batched_s"], rel=1e-2)


def test_the_gpu_part_trains_each_size_of_the_testbed_as_one_pack(bench):
    rows = bench.sizes_packed("cpu", 2, steps=2, smoke=True)
    assert [r["model"] for r in rows] == ["d64-h4-l2-i256", "d64-h4-l3-i256", "d64-h4-l4-i256"]
    for r in rows:  # two members, each a finite loss (no Diverged in their place)
        assert len(r["last_loss"]) == 2 and all(isinstance(x, float) for x in r["last_loss"])


@pytest.mark.slow
def test_the_gpu_check_s_smoke_part_writes_its_json(tmp_path):
    """bench/gpu_check.sh smoke cpu: the whole script (spawned processes) at toy sizes."""
    subprocess.run(["bash", str(SCRIPT.parent / "gpu_check.sh"), "smoke", "cpu"], check=True,
                   capture_output=True, env={**os.environ, "OUT": str(tmp_path),
                                             "PYTHON": sys.executable,
                                             "WHEELS": str(tmp_path / "no-wheels")})
    report = json.loads((tmp_path / "packs_smoke.json").read_text())
    assert report["baseline"].startswith("K separate trial processes")
    (row,) = report["rows"]
    assert row["ratio_packed_over_separate"] == pytest.approx(
        row["packed_model_steps_per_s"] / row["separate_model_steps_per_s"], rel=1e-2)
    assert len(report["sizes_packed"]) == 3
    assert json.loads((tmp_path / "train_gpu_check_smoke.json").read_text())  # issue 40's parts
    assert json.loads((tmp_path / "measure_cpu.json").read_text())["settings"]
    for part in ("truth", "eval_data", "flatness", "checkpoint_cost", "shared_gpu"):  # the rest
        assert json.loads((tmp_path / f"{part}_smoke.json").read_text()), part
    cost = json.loads((tmp_path / "checkpoint_cost_smoke.json").read_text())[0]
    assert cost["measure_share"] == cost["measure_s"] / cost["training_between_checkpoints_s"]
    flat = json.loads((tmp_path / "flatness_smoke.json").read_text())
    assert any(r["metric"] == "seconds_trace_fisher_paper_precision" for r in flat)


def test_the_gpu_check_refuses_an_unknown_part_naming_its_parts(tmp_path):
    done = subprocess.run(["bash", str(SCRIPT.parent / "gpu_check.sh"), "everything"],
                          env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "use train, measure, packs, large, flatness or smoke" in done.stderr
    assert not any(tmp_path.iterdir())  # refused before anything ran
