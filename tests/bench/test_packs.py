"""bench/packs.py: its update-cost and optimizer-cost rows on the CPU at toy sizes (the latter
through ``--only-optimizer``, as it is run); its comparison with separate processes and its GPU
part (the testbed's sizes experiment packed) run in bench/gpu_check.sh's smoke run
(tests/bench/test_gpu_check.py)."""

import json

import pytest

from tests.bench.conftest import bench_script


@pytest.fixture(scope="module")
def bench():
    return bench_script("packs")


def test_update_costs_time_every_way_of_batching(bench):
    row = bench.update_costs("d16-h1-l1-i64", 2, 8, repeats=2)
    for name in ("hand_batched_s", "torch_func_vmap_gradient_s", "k_single_models_s"):
        assert row[name] > 0, name
    assert row["speedup_hand_batched"] == pytest.approx(
        row["k_single_models_s"] / row["hand_batched_s"], rel=1e-2)


def test_only_optimizer_times_every_way_of_stepping(bench, tmp_path):
    bench.main(["--smoke", "--only-optimizer", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "packs_optimizer_smoke.json").read_text())
    assert report["baseline"] == bench.OPTIMIZER_BASELINE
    assert [row["kind"] for row in report["optimizer_costs"]] == ["adamw", "sgd"]
    for row in report["optimizer_costs"]:
        assert row["stock_per_member_s"] > 0 and row["k_single_optimizers_s"] > 0
        assert row["ratio_stock_per_member_over_hand_batched"] == pytest.approx(
            row["stock_per_member_s"] / row["hand_batched_s"], rel=2e-2)
