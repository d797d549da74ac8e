"""bench/testbed_v2.py: the room each accuracy claim needs (against the paper's effects by hand),
the screen's keep rule and stage 1's verdict on planted rows, the replication's cost."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # testbed_v2 imports testbed_search as a sibling
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def v2():
    _load("testbed_search")
    return _load("testbed_v2")


def test_room_needed_reads_twice_the_papers_effect_in_its_direction(v2):
    needs = {(n["claim"].split(":")[0], n["task"]): n for n in v2.room_needed()}
    # Fig. 3a: +6.9 points on B -> the compared arm at most 1 - 0.138
    assert needs[("Fig. 3a (2.3)", "B")]["max"] == pytest.approx(0.862)
    # Table 1's lookup on A: -18.7 points -> AdamW at least 0.374 above the majority share
    lookup_a = [n for n in v2.room_needed() if n["claim"].endswith("... and on task A")
                and n["task"] == "A"]
    assert [n["above_majority"] for n in lookup_a] == [pytest.approx(0.374)]
    # claims without a size, and relative (trace) claims, need no room of the probe
    assert all(n["task"] in "ABC" for n in needs.values())
    assert not any("sharper" in n["claim"] or "flatter" in n["claim"] for n in needs.values())


def test_room_met_fails_at_the_ceiling_and_at_the_floor(v2):
    needs = [{"claim": "better", "task": "B", "max": 0.862},
             {"claim": "worse", "task": "B", "above_majority": 0.19}]
    ceiling = v2.room_met({"B": 0.99}, {"B": 0.25}, needs)
    assert [r["met"] for r in ceiling] == [False, True]
    floor = v2.room_met({"B": 0.40}, {"B": 0.25}, needs)
    assert [r["met"] for r in floor] == [True, False]
    assert floor[1]["room"] == pytest.approx(0.15)


def _task(classes=12, majority=0.2, random_init=0.5, lookup=0.8):
    return {"classes_seen": classes, "majority": majority, "random_init": random_init,
            "lookup": lookup, "random+lookup": lookup}


@pytest.mark.parametrize(("change", "kept"), [
    ({}, True), ({"classes": 9}, False), ({"majority": 0.31}, False),
    ({"random_init": 0.81}, False)])
def test_the_screen_keeps_only_tasks_of_the_papers_kind(v2, change, kept):
    row = {"rules": 100, "span": {"A": _task(), "B": _task(**change), "C": _task()}}
    assert v2.screen_verdict(row)[0] is kept


def _probe(levels: dict, random_init=0.4, majority=0.2) -> dict:
    out = {}
    for task, p in levels.items():
        out.update({f"probe/{task}/acc_mean": p, f"random_init/{task}/acc_mean": random_init,
                    f"probe/{task}/majority_acc": majority})
    return out


def test_stage1_verdict_reads_the_band_the_gap_and_the_room(v2):
    needs = v2.room_needed()
    good = v2.learn_verdict({"final_kl": 0.015, "probe": _probe(
        {"A": 0.7, "B": 0.7, "C": 0.7})}, needs)
    assert (good["a"], good["c_band"], good["c_gap"], good["c_room"]) == (True,) * 4
    ceiling = v2.learn_verdict({"final_kl": 0.03, "probe": _probe(
        {"A": 0.7, "B": 0.95, "C": 0.7})}, needs)
    assert (ceiling["a"], ceiling["c_band"], ceiling["c_room"]) == (False, False, False)
    no_gap = v2.learn_verdict({"final_kl": 0.01, "probe": _probe(
        {"A": 0.7, "B": 0.7, "C": 0.7}, random_init=0.65)}, needs)
    assert no_gap["c_gap"] is False


def test_the_replications_cost_schedules_every_trial_longest_first(v2):
    models = {"d48-h3-l1-i192": {"cpu_min": 5.0}, v2.STEPS_MODEL: {"cpu_min": 10.0},
              "d80-h5-l3-i320": {"cpu_min": 20.0}}
    cost = v2.replication_cost(models, {"lambda0.01_seed0": {"cpu_min": 10.0}})
    # 5 x (5 + 10 + 20) + (5 + 3) x 10 + 3 x (10 + 10 + 20 + 12) = 175 + 80 + 156 = 411
    assert cost["16"] >= 20.0 and cost["2"] >= 411 / 2
    assert cost["2"] >= cost["8"] >= cost["16"]


def test_merge_writes_the_rows_of_runs_made_in_parallel_into_the_results(v2, tmp_path):
    """Runs made in parallel each write a copy of the results; --merge brings their rows back
    (a merge that only rewrote the table once lost them at the next --table)."""
    import json

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
