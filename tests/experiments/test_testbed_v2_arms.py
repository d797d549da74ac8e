"""testbed-v2's beyond-the-paper arms (issue 54): Muon at the rate its committed pilot search
chose, checkpointed around its own crossing of the target KL, and soft targets under
``paper+soft-targets`` around theirs; the settings follow the arm and nothing else."""

import json

import pytest

from flatlm.experiments.paper import build
from flatlm.experiments.scales import TESTBED_V2_SECOND_PILOT_KL, scale
from flatlm.sources.spec import SourceSpec
from tests.bench.conftest import BENCH, bench_script

PILOT = BENCH / "results" / "replication_testbed_v2" / "pilot.json"


def pilot_module():
    return bench_script("testbed_v2_pilot")


def trials(protocol="paper", algorithms=("adamw", "muon")):
    exp = build("algorithms", scale="testbed-v2", protocol=protocol, seeds=(0,),
                algorithms=algorithms, selection_measures=False)
    return dict(exp.trials())


def test_muon_runs_at_the_rate_its_committed_search_chose():
    pilot, mod = json.loads(PILOT.read_text()), pilot_module()
    search = mod.muon_search(pilot["curves"], pilot["target_kl"], pilot["diverged"])
    assert search == pilot["muon"]  # the committed JSON is what its curves say
    cfg = trials()["muon_seed0"]
    assert cfg.train.settings("muon").lr == float(search["chosen"]) == 0.01


def test_sgd_runs_at_the_searched_rate_that_ends_lowest_since_none_reaches_the_target():
    pilot, mod = json.loads(PILOT.read_text()), pilot_module()
    search = mod.sgd_search(pilot["curves"], pilot["target_kl"], pilot["diverged"])
    assert search == pilot["sgd"]  # the committed JSON is what its curves say
    assert search["chosen"] is None  # no rate reached KL 0.7: the arm reads "target not reached"
    trained = {lr: row for lr, row in search["rates"].items() if row["diverged_at"] is None}
    assert len(trained) < len(search["rates"])  # the search went as far as a rate that diverges
    best = min(trained, key=lambda lr: trained[lr]["final_kl"])
    assert float(best) == scale("testbed-v2").sgd_lr == 0.3
    got = dict(build("sgd", scale="testbed-v2", protocol="paper", seeds=(0,),
                     selection_measures=False).trials())
    assert {cfg.train.lr for cfg in got.values()} == {0.3}


def test_a_diverged_rate_is_named_with_its_step_and_never_chosen():
    mod = pilot_module()
    curves = {"d64-h4-l2-i256": {"250": 0.9, "500": 0.6},
              "sgd-0.3": {"250": 0.9, "500": 0.8}, "sgd-1": {"250": 0.8, "500": 0.65}}
    search = mod.sgd_search(curves, 0.7, {"sgd-3": 750})
    assert search["chosen"] == "1" and "3" not in search["rates"]  # no curve, no row
    search = mod.sgd_search({**curves, "sgd-3": {"250": 0.9}}, 0.7, {"sgd-3": 250})
    assert search["rates"]["3"]["diverged_at"] == 250 and search["chosen"] == "1"


def test_each_arm_is_checkpointed_around_its_own_crossing_of_the_target():
    pilot = json.loads(PILOT.read_text())
    got = trials()
    target = pilot["target_kl"]
    for name, curve, cfg in (("muon", "muon-0.01", got["muon_seed0"]),
                             ("adamw", "d64-h4-l2-i256", got["adamw_seed0"]),
                             ("soft", "soft-targets",
                              trials("paper+soft-targets", ("adamw",))["adamw_seed0"])):
        kl = pilot["curves"][curve]
        steps = cfg.train.checkpoint_steps
        assert max(steps) == cfg.train.steps
        read = [kl[str(s)] for s in steps]  # the pilot's KL at each checkpoint (seed 0)
        assert read[0] > target >= read[-1], (name, read)  # brackets the crossing


def test_the_arm_settings_reach_no_other_arm():
    got = trials()
    assert tuple(got["adamw_seed0"].train.checkpoint_steps) == scale("testbed-v2").checkpoint_steps
    assert got["adamw_seed0"].train.targets == "sampled"
    soft = trials("paper+soft-targets", ("adamw",))["adamw_seed0"]
    assert soft.train.targets == "truth" and soft.train.steps == 1250


@pytest.mark.parametrize("steps, kls, expected", [
    ([250, 500, 750], [0.9, 0.8, 0.6], 625.0),  # halfway from 0.8 to 0.6
    ([250, 500], [0.9, 0.8], None),  # never reached
    ([250, 500], [0.65, 0.6], 250.0),  # already below at the first checkpoint
])
def test_the_crossing_step_is_linear_between_the_bracketing_checkpoints(steps, kls, expected):
    assert pilot_module()._interpolated_crossing(steps, kls, 0.7) == expected


@pytest.mark.parametrize("name", ["testbed", "testbed-v2", "gpu"])
def test_sgd_in_the_algorithms_grid_trains_at_the_scales_sgd_rate(name):
    # AdamW's 1e-3 would leave SGD untrained on a CPU scale: the arm takes the sgd experiment's
    got = dict(build("algorithms", scale=name, protocol="paper", seeds=(0,),
                     algorithms=("adamw", "sgd"), selection_measures=False).trials())
    assert got["sgd_seed0"].train.lr == scale(name).sgd_lr
    assert got["adamw_seed0"].train.lr == 1e-3
    pinned = dict(build("algorithms", scale=name, protocol="paper", seeds=(0,),
                        algorithms=("sgd",), selection_measures=False,
                        overrides={"train.lr": 0.05}).trials())
    assert pinned["sgd_seed0"].train.lr == 0.05  # --set wins


def test_noreg_is_checkpointed_before_the_step_its_first_runs_were_already_below_the_target():
    # its first runs at AdamW's checkpoints (2000-3500) read KL 0.664-0.692 at step 2000
    cfg = trials(algorithms=("adamw", "noreg"))
    noreg, adamw = cfg["noreg_seed0"].train, cfg["adamw_seed0"].train
    assert min(noreg.checkpoint_steps) < 2000 <= max(noreg.checkpoint_steps) == noreg.steps
    assert tuple(adamw.checkpoint_steps) == scale("testbed-v2").checkpoint_steps


SECOND_PILOT = BENCH / "results" / "replication_testbed_v2" / "pilot_second_grammar.json"


def test_the_second_grammar_is_read_at_its_own_target_with_each_arm_around_its_crossing():
    """The robustness column's grammar (L0-17) learns slower than v2's: its pilot fixes its own
    target KL, and each arm's checkpoints bracket that arm's crossing of it in the pilot."""
    pilot = json.loads(SECOND_PILOT.read_text())
    sc = scale("testbed-v2").under("paper+second-grammar")
    assert pilot["target_kl"] == TESTBED_V2_SECOND_PILOT_KL == 0.85
    assert sc.target_kl == 0.88 != scale("testbed-v2").target_kl  # moved by the runs' KL
    target = pilot["target_kl"]  # the checkpoints were placed around the pilot's crossings
    sizes = dict(build("sizes", scale="testbed-v2", protocol="paper+second-grammar", seeds=(0,),
                       models=("d64-h4-l1-i256", "d128-h8-l2-i512"),
                       selection_measures=False).trials())
    algos = trials("paper+second-grammar", ("adamw", "noreg", "sam"))
    arms = {"d64-h4-l1-i256": sizes["d64-h4-l1-i256_seed0"],
            "d128-h8-l2-i512": sizes["d128-h8-l2-i512_seed0"],
            "d64-h4-l2-i256": algos["adamw_seed0"], "noreg": algos["noreg_seed0"],
            "sam": algos["sam_seed0"]}
    for curve, cfg in arms.items():
        assert cfg.source == SourceSpec(sc.second_source)
        kl = pilot["curves"][curve]
        steps = cfg.train.checkpoint_steps
        assert max(steps) == cfg.train.steps
        read = [kl[str(s)] for s in steps if str(s) in kl]  # the pilot's KL there (seed 0)
        assert read[0] > target >= min(read), (curve, read)  # brackets the crossing
    # the main grammar's arms are untouched by the second grammar's fields
    assert tuple(trials()["adamw_seed0"].train.checkpoint_steps) == \
        scale("testbed-v2").checkpoint_steps


def test_a_switch_replaces_the_scale_fields_it_names_and_nothing_else():
    sc = scale("testbed-v2")
    assert sc.under("paper") is sc and sc.under("paper+soft-targets") is sc
    second = sc.under("paper-code+second-grammar")
    assert second.target_kl == 0.88 and second.models == sc.models
    assert second.algorithm_overrides["noreg"]["train.steps"] == 3250
    assert "muon" not in second.algorithm_overrides  # the fields are replaced, not merged
