"""``bench/gpu_session.sh``, the GPU measurements' runbook: its smoke part runs every bench script
it calls with the same flags at toy sizes on the CPU, so a session lent a GPU does not spend its
minutes on a broken command. The scripts' numbers are not checked here, only that each part ran
and wrote its rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("train", "truth", "eval_data", "flatness", "checkpoint_cost", "shared_gpu")


def test_the_runbook_s_smoke_part_runs_every_bench_and_writes_its_rows(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable,
           "WHEELS": str(tmp_path / "no-wheels")}
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh"), "smoke", "cpu"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for part in PARTS:
        rows = json.loads((tmp_path / f"{part}_smoke.json").read_text())
        assert rows, part
    cost = json.loads((tmp_path / "checkpoint_cost_smoke.json").read_text())[0]
    assert cost["measure_share"] == cost["measure_s"] / cost["training_between_checkpoints_s"]
    flat = json.loads((tmp_path / "flatness_smoke.json").read_text())
    assert any(r["metric"] == "seconds_trace_fisher_paper_precision" for r in flat)


def test_an_unknown_part_is_refused_with_the_parts_named(tmp_path):
    done = subprocess.run(["bash", str(REPO / "bench" / "gpu_session.sh"), "everything"],
                          env={**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "use train, large, measure or smoke" in done.stderr
