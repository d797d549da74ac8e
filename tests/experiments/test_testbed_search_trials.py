"""apps/testbed_search: the screen regenerates a committed stage-0 row bit for bit
(both label rules), a committed scale's jobs reuse the runs of the same config, the steps run's
variants change only what they name."""

import json
from pathlib import Path

import pytest
import torch

from apps.testbed_search.first import STEPS_VARIANTS
from apps.testbed_search.jobs import finalist_jobs, scale_jobs
from apps.testbed_search.pool import one_thread
from apps.testbed_search.trials import (
    candidate_pins,
    candidate_scale,
    expected_cost,
    experiment_trials,
    screen,
)
from apps.testbed_search.verdicts_first import screen_kept
from flatlm.core.config import from_dict, to_dict
from flatlm.experiments.scales import scale
from flatlm.runs.trial import TrialConfig

RESULTS = Path(__file__).parents[2] / "bench" / "results"


@pytest.mark.slow  # 14 s: a real screen (no training), 3 feature sets x 3 tasks x 2 rules
def test_the_screen_regenerates_a_committed_row_under_both_rules():
    """c0-14, kept by the first search's stage 0 (so screened under ``inside`` too), as committed;
    its CPU and wall seconds aside."""
    threads = torch.get_num_threads()
    one_thread()  # as the search ran it
    committed = next(r for r in json.loads((RESULTS / "testbed_search.json").read_text())
                     ["stage0"]["candidates"] if r["id"] == "c0-14")
    try:
        row = screen({"id": "c0-14", "spec": committed["spec"]}, keep=screen_kept)
    finally:
        torch.set_num_threads(threads)
    assert "inside" in row
    times = ("cpu_s", "wall_s", "kept", "score", "space")
    assert {k: v for k, v in row.items() if k not in times} == {
        k: v for k, v in committed.items() if k not in times}


def test_a_spec_longer_than_the_cpu_limit_is_an_error_row_not_a_crash():
    spec = {"kind": "pcfg", "seed": 0, "max_length": 32, "random": {"vocab": 12, "depth": 5}}
    row = screen({"id": "long", "spec": spec}, keep=screen_kept)
    assert row["error"].startswith("T=") and "> 16" in row["error"]


def test_a_committed_scales_jobs_reuse_the_runs_of_the_same_config(tmp_path):
    trials = experiment_trials(scale("testbed"), ["sizes"], [0])
    _, first_trial, config = trials[0]
    runs = [{"id": "q0-23", "experiment": "sizes", "trial": "other-name", "config": config,
             "final": {"pretrain/kl": 0.01}}]
    jobs = scale_jobs("scale:testbed", scale("testbed"), ["sizes"], [0], tmp_path, runs)
    assert [j["trial"] for j in jobs] == [t for _, t, _ in trials[1:]]
    assert all(j["inside"] and j["work"] == str(tmp_path) for j in jobs)
    copied = runs[-1]
    assert (copied["id"], copied["reused_from"], copied["final"]) == (
        "scale:testbed", "q0-23", {"pretrain/kl": 0.01})


@pytest.mark.parametrize("variants_only", [False, True])
def test_the_steps_variants_change_only_what_they_name(tmp_path, variants_only):
    sc = scale("testbed")
    (_, trial, config), = experiment_trials(sc, ["steps"], [0])
    jobs = finalist_jobs("x", sc, ["steps"], [0], tmp_path, variants=["lr2e-3", "nodrop"],
                         variants_only=variants_only, long_steps=9000)
    variants = [j for j in jobs if j["experiment"] == "steps-variant"]
    assert len(jobs) == 2 + (not variants_only)
    assert [j["trial"] for j in variants] == [f"{trial}_lr2e-3_9000", f"{trial}_nodrop_9000"]
    for job, name in zip(variants, ("lr2e-3", "nodrop"), strict=True):
        (key, value), = STEPS_VARIANTS[name].items()
        changed = job["config"]
        assert changed["train"][key.removeprefix("train.")] == value
        if variants_only:  # the loss only, every 1500 steps
            assert changed["measure"]["what"] == ["loss"]
            steps = changed["train"]["steps"]
            assert changed["train"]["checkpoint_steps"] == list(range(1500, steps + 1, 1500))
            changed = {**changed, "measure": config["measure"], "train": {
                **changed["train"], "checkpoint_steps": config["train"]["checkpoint_steps"]}}
        assert {**changed, "train": {**changed["train"], key.removeprefix("train."): (
            config["train"][key.removeprefix("train.")])}} == config
    assert config["measure"]["what"] != ["loss"]  # the experiment's own config untouched


def test_expected_cost_orders_wider_longer_and_sam_trials_first():
    def job(model, steps, algorithm="adamw"):
        return {"config": {"model": model, "train": {"steps": steps, "algorithm": algorithm}}}

    costs = [expected_cost(job("d16-h1-l1-i64", 100)), expected_cost(job("d64-h4-l2-i256", 100)),
             expected_cost(job("d64-h4-l2-i256", 100, "sam")),
             expected_cost(job("d64-h4-l2-i256", 300))]
    assert costs == [100, 300, 600, 900]


def _common(built: dict, committed: dict) -> dict:
    """``built`` cut to the keys ``committed`` has (settings added since keep their defaults)."""
    return {k: _common(v, committed[k]) if isinstance(v, dict) and isinstance(committed[k], dict)
            else v for k, v in built.items() if k in committed}


def test_stage_2_rebuilds_its_committed_trials_with_the_setting_s_schedule():
    """The finalist's stage-2 trials as committed: the sizes and algorithms runs at its setting's
    linear decay and every trial with the search's measurement settings (the paper protocol's
    constant rate, probe and B.1 labels would replace them without ``candidate_pins``), the long
    runs constant."""
    search = json.loads((RESULTS / "testbed_search.json").read_text())
    (finalist,) = search["stage2"]["finalists"]
    spec = next(c["spec"] for c in search["stage0"]["candidates"] if c["id"] == finalist["id"])
    sc = candidate_scale(spec, finalist["grid"], finalist["setting"], finalist["long_steps"])
    runs = {(r["experiment"], r["trial"]): r["config"] for r in search["stage2"]["runs"]
            if r["experiment"] in ("sizes", "algorithms", "steps", "sgd")}
    built = {(e, t): c for e, t, c in
             experiment_trials(sc, ("sizes", "algorithms", "steps", "sgd"), (0,),
                               pins=candidate_pins(finalist["setting"]))}
    assert set(runs) <= set(built)
    for key, committed in runs.items():
        # read as this version reads it: an algorithm's section at its defaults is not stored
        expected = _common(to_dict(from_dict(TrialConfig, committed)), committed)
        assert _common(built[key], committed) == expected, key
    assert {runs[k]["train"]["schedule"] for k in runs if k[0] in ("sizes", "algorithms")} == {
        "linear"}
