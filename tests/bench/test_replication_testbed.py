"""bench/replication_testbed.py: which trials count as finished, and the criteria it measures on
them (the testbed's (a) and (d) against hand-computed values)."""

import json

import pytest

from analysis.trials import load_trials
from tests.bench.conftest import bench_script


@pytest.fixture(scope="module")
def bench():
    return bench_script("replication_testbed")


def trial(root, path, algorithm, seed, kls, steps=(10, 20)):
    out = root / path
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({
        "model": "d16-h1-l1-i64", "train": {"algorithm": algorithm, "seed": seed,
                                            "checkpoint_steps": list(steps)}}))
    rows = [{"step": s, "pretrain/kl": kl, "time/train_s": 60.0, "time/measure_s": 30.0}
            for s, kl in zip(steps, kls, strict=False)]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_only_trials_with_their_last_checkpoint_are_finished(bench, tmp_path):
    trial(tmp_path, "paper/steps/seed0", "adamw", 0, [0.05, 0.01])
    trial(tmp_path, "paper/steps/seed1", "adamw", 1, [0.05])  # still running
    trial(tmp_path, "paper/selection/adamw_lr0.002_seed0", "adamw", 0, [0.05, 0.01])  # not the
    trial(tmp_path, "eval_cache/paper/x/y", "adamw", 0, [0.05, 0.01])  # paper's; a cache
    done, running = bench.finished_trials(tmp_path)
    assert [d.name for d in done] == ["seed0"] and [r.name for r in running] == ["seed1"]
    done, _ = bench.finished_trials(tmp_path, experiments=("steps", "selection"))
    assert [d.name for d in done] == ["adamw_lr0.002_seed0", "seed0"]


def test_criteria_a_and_d_on_planted_runs(bench, tmp_path):
    trial(tmp_path, "paper/algorithms/adamw_seed0", "adamw", 0, [0.05, 0.015])
    trial(tmp_path, "paper/algorithms/adversarial_seed0", "adversarial", 0, [0.9, 0.05])
    trial(tmp_path, "paper/algorithms/adamw_seed1", "adamw", 1, [0.05, 0.03])
    trial(tmp_path, "paper/algorithms/adversarial_seed1", "adversarial", 1, [0.9, 0.04])
    df = load_trials(tmp_path)
    final = bench.final_rows(df)
    a = {r["run"]: (r["kl"], r["met"]) for r in bench.criterion_a(final)}
    assert a == {"algorithms/adamw_seed0": (0.015, True), "algorithms/adamw_seed1": (0.03, False)}
    d = {r["seed"]: (r["gap"], r["met"]) for r in bench.criterion_d(final)}
    assert d[0][0] == pytest.approx(0.035) and not d[0][1]
    assert d[1][0] == pytest.approx(0.01) and d[1][1]
    c = bench.criterion_c(df, wall_min=None)
    assert (c["trials"], c["cpu_min"]) == (4, pytest.approx(4 * 2 * 90 / 60))
