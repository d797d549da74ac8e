"""bench/selection_leaderboard.py: the files it writes and what its JSON counts, on planted
trials."""

import json
from pathlib import Path

import pytest

from tests.analysis.leaderboard_data import planted, write_trials
from tests.bench.conftest import bench_script


def _bench():
    return bench_script("selection_leaderboard")


def test_the_benchmark_writes_the_leaderboard_and_its_counts(tmp_path):
    bench = _bench()
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


def _move_to_selection(trials: Path, runs) -> Path:
    """The runs ``runs`` moved from ``trials/paper/steps`` to a second root's selection
    experiment (the lr axis the leaderboard reads beside the paper's experiments)."""
    other = trials.parent / "selection_root"
    for run in runs:
        target = other / "paper" / "selection" / run
        target.parent.mkdir(parents=True, exist_ok=True)
        (trials / "paper" / "steps" / run).rename(target)
    return other


def test_two_roots_count_as_one_and_the_selection_records_are_kept(tmp_path):
    bench = _bench()
    trials = write_trials(tmp_path / "trials", planted(n_runs=5, small_runs=2))
    other = _move_to_selection(trials, ["r3", "r4"])
    out = tmp_path / "out"
    assert bench.main(["--trials", str(trials), str(other), "--out", str(out), "--tasks", "A",
                       "--n-boot", "10"]) == 0
    record = json.loads((out / "leaderboard.json").read_text())
    assert record["trials"] == 5 and record["checkpoints"] == 20
    assert record["records_copied"] == ["paper/selection/r3", "paper/selection/r4"]
    for run in ("r3", "r4"):  # the records, byte for byte; never the paper's experiments
        for name in ("config.json", "metrics.jsonl"):
            copied = out / "trials" / "paper" / "selection" / run / name
            assert copied.read_bytes() == (other / "paper" / "selection" / run / name).read_bytes()
    assert not (out / "trials" / "paper" / "steps").exists()
    # the committed records rebuild the same board from the repository alone
    again = tmp_path / "again"
    assert bench.main(["--trials", str(trials), str(out / "trials"), "--out", str(again),
                       "--tasks", "A", "--n-boot", "10"]) == 0
    assert (again / "leaderboard.csv").read_text() == (out / "leaderboard.csv").read_text()


def test_a_trial_under_two_roots_is_refused(tmp_path):
    bench = _bench()
    trials = write_trials(tmp_path / "trials", planted(n_runs=3))
    with pytest.raises(SystemExit, match="paper/steps/r0 is under more than one root"):
        bench.main(["--trials", str(trials), str(trials), "--out", str(tmp_path / "out"),
                    "--tasks", "A", "--n-boot", "10"])


def test_only_the_chosen_protocols_trials_count(tmp_path):
    """A paper-code trial beside the paper ones (another label rule and probe: its accuracy
    does not compare) is left out by default and counted when named; a protocol with no trial
    is refused, naming the ones there."""
    bench = _bench()
    trials = write_trials(tmp_path / "trials", planted(n_runs=5, small_runs=2))
    code = trials / "paper-code" / "steps"
    code.mkdir(parents=True)
    (trials / "paper" / "steps" / "r4").rename(code / "r4")
    out = tmp_path / "out"
    assert bench.main(["--trials", str(trials), "--out", str(out), "--tasks", "A",
                       "--n-boot", "10"]) == 0
    record = json.loads((out / "leaderboard.json").read_text())
    assert record["trials"] == 4 and record["protocols"] == ["paper"]
    assert "Trials of protocol `paper` only" in (out / "leaderboard.md").read_text()
    assert bench.main(["--trials", str(trials), "--out", str(out), "--tasks", "A",
                       "--n-boot", "10", "--protocol", "paper,paper-code"]) == 0
    assert json.loads((out / "leaderboard.json").read_text())["trials"] == 5
    with pytest.raises(SystemExit, match="--protocol 'paper-cod': no trial of it under "
                                         "--trials; the protocols there: paper, paper-code"):
        bench.main(["--trials", str(trials), "--out", str(out), "--protocol", "paper-cod"])


def test_the_invariant_re_reading_is_written_from_the_merged_trials(tmp_path):
    from tests.analysis.test_invariant_verdicts import planted as planted_arms
    paths = _bench().write_invariant_verdicts(planted_arms(soft_avg=0.7), 0.7, tmp_path)
    assert [p.name for p in paths] == ["invariant_verdicts.md", "invariant_verdicts.csv"]
    assert "survives: no" in paths[0].read_text()
