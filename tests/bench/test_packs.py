"""bench/packs.py: its update-cost rows on the CPU at toy sizes; its comparison with separate
processes and its GPU part (the testbed's sizes experiment packed) run in bench/gpu_check.sh's
smoke run (tests/bench/test_gpu_check.py)."""

import importlib.util
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
