"""bench/selection_leaderboard.py: the files it writes and what its JSON counts, on planted
trials."""

import importlib.util
import json
from pathlib import Path

from tests.analysis.leaderboard_data import planted, write_trials

SCRIPT = Path(__file__).parents[2] / "bench" / "selection_leaderboard.py"


def test_the_benchmark_writes_the_leaderboard_and_its_counts(tmp_path):
    spec = importlib.util.spec_from_file_location("selection_leaderboard", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    trials = write_trials(tmp_path / "trials", planted(n_runs=5, small_runs=2))
    out = tmp_path / "out"
    assert bench.main(["--trials", str(trials), "--out", str(out), "--tasks", "A",
                       "--n-boot", "10", "--wall-min", "90"]) == 0
    assert {p.name for p in out.iterdir()} == {"leaderboard.md", "leaderboard.csv",
                                               "leaderboard.png", "leaderboard.json"}
    record = json.loads((out / "leaderboard.json").read_text())
    assert record["trials"] == 5 and record["checkpoints"] == 20
    assert record["data_wall_min"] == 90 and "--n-boot 10" in record["command"]
    one, every = record["groups"]["one shape"], record["groups"]["all sizes"]
    assert (one["runs"], every["runs"]) == (3, 5)
    assert one["tasks"]["A"] == {"n_candidates": 9, "n_runs": 3}
    assert every["tasks"]["A"] == {"n_candidates": 15, "n_runs": 5}
