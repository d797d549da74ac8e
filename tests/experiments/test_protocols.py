"""Protocols: the paper's text, the released code, and one switch at a time."""

import pytest

from flatlm.core.config import apply_overrides
from flatlm.experiments.paper import EXPERIMENTS, build
from flatlm.experiments.protocols import (
    SWITCHES,
    diagnosis_protocols,
    model_for,
    parse_protocol,
    protocol_overrides,
)
from flatlm.experiments.scales import TINY, TINY_DEEP_SOURCE
from flatlm.measure.probe import RELEASED
from flatlm.sources import SourceSpec


def test_paper_is_the_defaults_and_paper_code_is_every_released_switch():
    # the paper's text is the library's defaults but for B.1's 50 sampled labels per input
    assert protocol_overrides("paper") == {"measure.flatness.labels_per_input": 50}
    assert protocol_overrides("paper+mask-only")["measure.flatness.labels_per_input"] == 50
    code = protocol_overrides("paper-code")
    assert "measure.flatness.labels_per_input" not in code  # no sampled labels in its code
    assert code["train.mask"] == 0.15 and code["train.max_predictions"] == 5
    assert code["train.schedule"] == "linear" and code["train.warmup_proportion"] == 0.2
    assert code["train.lr"] == 5e-4 and code["measure.label_rule"] == "inside"
    assert code["measure.probe.batch_size"] == RELEASED["batch_size"]
    assert code["measure.probe.standardize"] is False
    assert model_for("d16-h1-l1-i64", "paper-code") == "d16-h1-l1-i64-pre"
    assert model_for("d16-h1-l1-i64-pre", "paper-code") == "d16-h1-l1-i64-pre"
    assert model_for("d16-h1-l1-i64", "paper") == "d16-h1-l1-i64"


@pytest.mark.parametrize("name, needle", [("nope", "unknown base 'nope'"),
                                          ("paper+warp", "unknown switch 'warp'")])
def test_bad_protocols_name_what_is_wrong(name, needle):
    with pytest.raises(ValueError, match=needle):
        parse_protocol(name)


def test_diagnosis_turns_on_each_switch_alone():
    names = diagnosis_protocols()
    assert names[0] == "paper" and len(names) == 1 + len(SWITCHES)
    for name in names[1:]:
        assert len(parse_protocol(name)[1]) == 1


@pytest.mark.parametrize("protocol", diagnosis_protocols() + ["paper-code"])
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_builds_valid_trials_under_every_protocol(experiment, protocol):
    exp = build(experiment, scale="tiny", protocol=protocol, seeds=(0,))
    trials = exp.trials()
    assert trials and len({name for name, _ in trials}) == len(trials)
    for _, cfg in trials:
        apply_overrides(cfg, {})  # re-validates
        if "pre-ln" in parse_protocol(protocol)[1]:
            assert str(cfg.model).endswith("-pre")
        if "deep-grammar" in protocol:
            assert cfg.source == SourceSpec(TINY_DEEP_SOURCE)
        else:
            assert cfg.source == SourceSpec(TINY.source)


def test_experiment_grids_are_the_claims():
    sizes = build("sizes", protocol="paper")
    assert sizes.grid["model"] == list(TINY.models)
    assert sizes.grid["train.seed"] == list(TINY.seeds)
    assert sizes.base.measure.grow_to == TINY.models[-1]  # the least common shape
    assert sizes.base.measure.flatness.labels_per_input == 50  # B.1
    assert build("sizes", protocol="paper-code").base.measure.flatness.labels_per_input == 8
    # Fig. 5 by the paper's growth construction (B.4.2), and by flatlm's for comparison
    assert sizes.base.measure.growth_construction == "paper"
    assert sizes.base.measure.growth_compare == ("head-norm",)
    algorithms = build("algorithms", protocol="paper", seeds=(0, 1))
    assert algorithms.grid["train.algorithm"] == ["adamw", "adversarial", "noreg", "sam"]
    assert len(algorithms.trials()) == 8
    sgd = build("sgd", protocol="paper").base.train
    assert sgd.algorithm == "sgd" and sgd.warmup_proportion == 0.12
    assert sgd.schedule == "constant" and sgd.lr == TINY.sgd_lr
    steps = build("steps", protocol="paper").base.train
    assert steps.steps == TINY.long_steps and len(steps.checkpoint_steps) == TINY.checkpoints + 1


def test_overrides_come_last_and_are_checked():
    exp = build("steps", protocol="paper", overrides={"train.steps": 40,
                                                      "train.checkpoint_steps": [0, 40]})
    assert exp.base.train.steps == 40
    with pytest.raises(ValueError, match="experiment 'bogus'"):
        build("bogus")
    with pytest.raises(ValueError, match="train.nonsense"):
        build("steps", overrides={"train.nonsense": 1})
