"""apps/testbed_search/verdicts_second.py: the room each accuracy claim needs (against the paper's
effects by hand), the screen's keep rule and stage 1's verdict on planted rows, the replication's
cost."""

import pytest

from apps.testbed_search.second import STEPS_MODEL
from apps.testbed_search.verdicts_second import (
    learn_verdict,
    replication_cost,
    room_met,
    room_needed,
    screen_verdict,
)


def test_room_needed_reads_twice_the_papers_effect_in_its_direction():
    needs = {(n["claim"].split(":")[0], n["task"]): n for n in room_needed()}
    # Fig. 3a: +6.9 points on B -> the compared arm at most 1 - 0.138
    assert needs[("Fig. 3a (2.3)", "B")]["max"] == pytest.approx(0.862)
    # Table 1's lookup on A: -18.7 points -> AdamW at least 0.374 above the majority share
    lookup_a = [n for n in room_needed() if n["claim"].endswith("... and on task A")
                and n["task"] == "A"]
    assert [n["above_majority"] for n in lookup_a] == [pytest.approx(0.374)]
    # claims without a size, and relative (trace) claims, need no room of the probe
    assert all(n["task"] in "ABC" for n in needs.values())
    assert not any("sharper" in n["claim"] or "flatter" in n["claim"] for n in needs.values())


def test_room_met_fails_at_the_ceiling_and_at_the_floor():
    needs = [{"claim": "better", "task": "B", "max": 0.862},
             {"claim": "worse", "task": "B", "above_majority": 0.19}]
    ceiling = room_met({"B": 0.99}, {"B": 0.25}, needs)
    assert [r["met"] for r in ceiling] == [False, True]
    floor = room_met({"B": 0.40}, {"B": 0.25}, needs)
    assert [r["met"] for r in floor] == [True, False]
    assert floor[1]["room"] == pytest.approx(0.15)


def _task(classes=12, majority=0.2, random_init=0.5, lookup=0.8):
    return {"classes_seen": classes, "majority": majority, "random_init": random_init,
            "lookup": lookup, "random+lookup": lookup}


@pytest.mark.parametrize(("change", "kept"), [
    ({}, True), ({"classes": 9}, False), ({"majority": 0.31}, False),
    ({"random_init": 0.81}, False)])
def test_the_screen_keeps_only_tasks_of_the_papers_kind(change, kept):
    row = {"rules": 100, "span": {"A": _task(), "B": _task(**change), "C": _task()}}
    assert screen_verdict(row)[0] is kept


def _probe(levels: dict, random_init=0.4, majority=0.2) -> dict:
    out = {}
    for task, p in levels.items():
        out.update({f"probe/{task}/acc_mean": p, f"random_init/{task}/acc_mean": random_init,
                    f"probe/{task}/majority_acc": majority})
    return out


def test_stage1_verdict_reads_the_band_the_gap_and_the_room():
    needs = room_needed()
    good = learn_verdict({"final_kl": 0.015, "probe": _probe(
        {"A": 0.7, "B": 0.7, "C": 0.7})}, needs)
    assert (good["a"], good["c_band"], good["c_gap"], good["c_room"]) == (True,) * 4
    ceiling = learn_verdict({"final_kl": 0.03, "probe": _probe(
        {"A": 0.7, "B": 0.95, "C": 0.7})}, needs)
    assert (ceiling["a"], ceiling["c_band"], ceiling["c_room"]) == (False, False, False)
    no_gap = learn_verdict({"final_kl": 0.01, "probe": _probe(
        {"A": 0.7, "B": 0.7, "C": 0.7}, random_init=0.65)}, needs)
    assert no_gap["c_gap"] is False


def test_the_replications_cost_schedules_every_trial_longest_first():
    models = {"d48-h3-l1-i192": {"cpu_min": 5.0}, STEPS_MODEL: {"cpu_min": 10.0},
              "d80-h5-l3-i320": {"cpu_min": 20.0}}
    cost = replication_cost(models, {"lambda0.01_seed0": {"cpu_min": 10.0}})
    # 5 x (5 + 10 + 20) + (5 + 3) x 10 + 3 x (10 + 10 + 20 + 12) = 175 + 80 + 156 = 411
    assert cost["16"] >= 20.0 and cost["2"] >= 411 / 2
    assert cost["2"] >= cost["8"] >= cost["16"]
