"""bench/testbed_v2.py, the command line: --merge brings back the rows of runs made in parallel,
--check finds the committed table regenerated from the committed JSON, and a table that differs."""

import json
import shutil

import pytest

from tests.bench.conftest import BENCH, bench_script

RESULTS = BENCH / "results"


@pytest.fixture(scope="module")
def v2():
    return bench_script("testbed_v2")


def test_check_finds_the_committed_table_regenerated_and_a_changed_one(v2, tmp_path, capsys):
    for name in ("testbed_v2_search.json", "testbed_v2_search.md"):
        shutil.copy(RESULTS / name, tmp_path / name)
    out = tmp_path / "testbed_v2_search.json"
    assert v2.main(["--check", "--out", str(out)]) == 0
    assert "regenerates" in capsys.readouterr().out
    results = json.loads(out.read_text())
    results["stage0"]["candidates"][0]["T"] += 1  # one cell of the screen's table
    out.write_text(json.dumps(results))
    assert v2.main(["--check", "--out", str(out)]) == 1
    md = tmp_path / "testbed_v2_search.md"  # --check writes nothing
    assert md.read_text() == (RESULTS / "testbed_v2_search.md").read_text()


def test_merge_writes_the_rows_of_runs_made_in_parallel_into_the_results(v2, tmp_path):
    """Runs made in parallel each write a copy of the results; --merge brings their rows back
    (a merge that only rewrote the table once lost them at the next --table)."""
    row = {"id": "L0-1", "spec": {}, "kept": False, "rank": [1, 0], "error": "x"}
    run = {"id": "L0-1", "model": "m", "setting_name": "s", "kl": {"10": 0.5},
           "final_kl": 0.5, "cpu_s": 60.0, "probe": {},
           "verdict": {"a": False, "c_band": False, "c_gap": False, "room": []}}
    mine, other = tmp_path / "r.json", tmp_path / "other.json"
    mine.write_text(json.dumps({"stage0": {"candidates": [], "rounds": {}}}))
    rounds = {"a:0": {"command": "c"}}
    other.write_text(json.dumps({"stage0": {"candidates": [row], "rounds": rounds},
                                 "stage1": {"runs": [run]}}))
    v2.main(["--merge", str(other), "--out", str(mine)])
    v2.main(["--table", "--out", str(mine)])  # read back from the file, not from memory
    merged = json.loads(mine.read_text())
    assert [r["id"] for r in merged["stage0"]["candidates"]] == ["L0-1"]
    assert [r["id"] for r in merged["stage1"]["runs"]] == ["L0-1"]
