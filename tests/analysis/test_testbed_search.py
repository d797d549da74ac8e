"""apps/testbed_search/verdicts_first.py: the first search's verdicts on planted rows (the
screen's keep rule, stage 1's pick, stage 2's criteria table) and the longest-first schedule its
times use."""

import pytest

from apps.testbed_search.first import GRIDS
from apps.testbed_search.verdicts_first import best_passing, makespan, screen_verdict, summarise


def _task(majority=0.4, random_init=0.7, lookup=0.9, both=0.8):
    return {"majority": majority, "random_init": random_init, "lookup": lookup,
            "random+lookup": both}


@pytest.mark.parametrize(("change", "kept"), [
    ({}, True), ({"majority": 0.51}, False), ({"random_init": 0.86}, False)])
def test_the_screen_keeps_balanced_tasks_with_room_above_random_features(change, kept):
    row = {"span": {"A": _task(), "B": _task(**change), "C": _task(both=0.75)}}
    assert screen_verdict(row) == (kept, pytest.approx(0.05 if not change.get("random_init")
                                                       else -0.06))


def test_a_row_with_an_error_is_never_kept():
    assert screen_verdict({"error": "T=32 > 16"}) == (False, -1.0)


@pytest.mark.parametrize(("costs", "workers", "end"), [
    ([], 2, 0.0),
    ([5.0], 2, 5.0),
    ([3.0, 3.0, 2.0, 2.0, 2.0], 2, 7.0),  # longest first: 3+2+2 | 3+2 (the optimum, 6, not sought)
    ([4.0, 1.0, 1.0, 1.0, 1.0], 2, 4.0),  # the four short ones share the second worker
    ([1.0] * 8, 3, 3.0),
])
def test_makespan_schedules_the_longest_first(costs, workers, end):
    assert makespan(costs, workers) == end


def _stage1_row(cid, grid, setting, passed):
    return {"id": cid, "grid": grid, "model": GRIDS[grid]["models"][0], "setting_name": setting,
            "passed": passed}


def test_stage1_picks_the_most_paper_like_passing_setting_per_kept_candidate():
    results = {"stage0": {"candidates": [{"id": "a", "kept": True, "score": 0.1},
                                         {"id": "b", "kept": True, "score": 0.3},
                                         {"id": "c", "kept": False, "score": 0.9}]},
               "stage1": {"runs": [_stage1_row("a", "small", "linear", True),
                                   _stage1_row("a", "tiny", "constant", True),
                                   _stage1_row("b", "tiny", "linear", True),
                                   _stage1_row("b", "tiny", "constant", False),
                                   _stage1_row("c", "tiny", "constant", True)]}}
    best = best_passing(results)
    # b first (the higher screen score), then a at its constant rate; c was not kept
    assert [(r["id"], r["setting_name"], r["grid"]) for r in best] == [
        ("b", "linear", "tiny"), ("a", "constant", "tiny")]


def _run(experiment, model, kl, probe, rand, majority, cpu_s, seed=0):
    return {"id": "x", "experiment": experiment, "model": model, "trial": f"{model}_{seed}",
            "cpu_s": cpu_s, "config": {"train": {"seed": seed}},
            "final": {"pretrain/kl": kl, "probe/A/acc_mean": probe,
                      "random_init/A/acc_mean": rand, "probe/A/majority_acc": majority}}


def test_summarise_reads_kl_probe_gain_majority_and_times():
    runs = [_run("sizes", "m1", 0.015, 0.90, 0.70, 0.40, 100.0),
            _run("sizes", "m2", 0.018, 0.85, 0.75, 0.45, 200.0),
            _run("steps", "m2", 0.021, 0.88, 0.72, 0.40, 300.0)]
    s = summarise("x", runs)
    assert s["a_kl"] == {"sizes:m1": 0.015, "sizes:m2": 0.018, "steps:m2": 0.021}
    assert s["a_passed"] is False  # the steps model above 0.02
    assert s["b"]["span"]["A"] == {"best_probe": 0.9, "random_init": 0.75, "gain": 0.15,
                                   "majority": 0.45}
    assert s["b_passed"]["span"] is True and s["b"]["inside"] == {}
    # (c): 5 seeds of each sizes trial (100, 200) and of the steps trial (300) on 2 workers
    assert s["c"]["per_trial_cpu_s"] == {"sizes": [100, 200], "steps": [300]}
    assert s["c"]["replication_one_protocol_s"] == 1500
    assert s["c"]["sweeps_s"] == {"sizes": 200, "steps": 300}
