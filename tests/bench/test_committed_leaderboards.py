"""A committed leaderboard is made from the committed trials it names: the trials its command's
``--trials`` roots hold under its ``--protocol`` (default ``paper``) are as many as it counted.
Trials folded into a root after the leaderboard was made (testbed v2's steps experiment was,
once) leave it stale, and the README quoting it with it; regenerate it with its own command."""

import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEADERBOARDS = ("bench/results/selection", "bench/results/selection_v2")


def _option(argv: list[str], name: str) -> list[str]:
    """The values after ``name`` up to the next option."""
    if name not in argv:
        return []
    values = argv[argv.index(name) + 1:]
    return values[:next((i for i, v in enumerate(values) if v.startswith("--")), len(values))]


def committed_trials(command: str) -> int:
    """The trial directories (a ``metrics.jsonl``) under ``command``'s roots and protocols."""
    argv = shlex.split(command)
    protocols = (_option(argv, "--protocol") or ["paper"])[0].split(",")
    return sum(1 for root in _option(argv, "--trials")
               for records in (ROOT / root).rglob("metrics.jsonl")
               if records.parent.relative_to(ROOT / root).parts[0] in protocols)


@pytest.mark.parametrize("folder", LEADERBOARDS)
def test_a_committed_leaderboard_counts_every_committed_trial_it_reads(folder):
    made = json.loads((ROOT / folder / "leaderboard.json").read_text())
    assert committed_trials(made["command"]) == made["trials"], (
        f"{folder}/leaderboard.json counted {made['trials']} trials; its roots now hold "
        f"{committed_trials(made['command'])}: run `{made['command']}`")


def test_the_count_reads_the_protocols_and_the_roots(tmp_path, monkeypatch):
    for trial in ("paper/sizes/a", "paper/sizes/b", "paper-code/sizes/a"):
        (tmp_path / "r" / trial).mkdir(parents=True)
        (tmp_path / "r" / trial / "metrics.jsonl").write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert committed_trials("python x.py --trials r --out o") == 2
    assert committed_trials("python x.py --trials r --protocol paper,paper-code") == 3
