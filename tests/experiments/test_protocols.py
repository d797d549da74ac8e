"""Protocols: the paper's text, the released code, and one switch at a time."""

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from flatlm.commands.replicate import experiments_from_args
from flatlm.core.config import apply_overrides
from flatlm.core.schedules import learning_rate
from flatlm.experiments.paper import EXPERIMENTS, build
from flatlm.experiments.protocols import (
    ABLATION,
    PAPER,
    RELEASED_WARMUP_PROPORTION,
    ROBUSTNESS,
    SWITCHES,
    Switch,
    describe,
    diagnosis_protocols,
    is_ablation,
    is_robustness,
    model_for,
    parse_protocol,
    protocol_overrides,
    register_switch,
    switches_of_kind,
)
from flatlm.experiments.scales import (
    PAPER_LIKE_SOURCE,
    TESTBED_SECOND_SOURCE,
    TINY,
    TINY_DEEP_SOURCE,
)
from flatlm.experiments.scales import scale as get_scale
from flatlm.measure.probes.probe import RELEASED
from flatlm.runs.trial import TrialConfig, labelled_source, validate_trial
from flatlm.sources import SourceSpec, load
from flatlm.sources.pcfg import depth_spans
from flatlm.train.config import resolve
from sweeps.experiment import experiment_of


def test_paper_is_the_text_and_paper_code_is_every_released_switch():
    paper = protocol_overrides("paper")
    # and B.1: Tr(F) from 50 sampled labels per input
    assert paper == {**PAPER, "measure.flatness.labels_per_input": 50}
    assert protocol_overrides("paper+mask-only")["measure.flatness.labels_per_input"] == 50
    assert paper["train.mask"] == "one" and paper["train.schedule"] == "constant"
    assert paper["measure.label_rule"] == "span" and paper["measure.spans"] == "depth"
    assert paper["measure.probe.epochs"] == 100 and paper["measure.probe.seeds"] == 5  # A.6
    assert paper["measure.probe.lr"] == 1e-3
    assert paper["measure.probe.batch_size"] == 512  # not in the text: the released run_lp's
    code = protocol_overrides("paper-code")
    assert "measure.flatness.labels_per_input" not in code  # no sampled labels in its code
    assert code["train.mask"] == 0.15 and code["train.max_predictions"] == 5
    assert code["train.mask_count"] == "fixed"
    assert code["train.schedule"] == "linear" and code["train.warmup_proportion"] == 0.13333
    assert "train.lr" not in code  # the scale's own lr
    assert code["measure.label_rule"] == "inside" and code["measure.spans"] == "released"
    assert code["measure.probe.batch_size"] == RELEASED["batch_size"]
    assert code["measure.probe.epochs"] == RELEASED["epochs"]
    assert code["measure.probe.standardize"] is False
    assert model_for("d16-h1-l1-i64", "paper-code") == "d16-h1-l1-i64-pre"
    assert model_for("d16-h1-l1-i64-pre", "paper-code") == "d16-h1-l1-i64-pre"
    assert model_for("d16-h1-l1-i64", "paper") == "d16-h1-l1-i64"


@pytest.mark.parametrize("scale", ["sweep", "tiny", "gpu"])
def test_labels_resolve_to_the_protocols_rule_and_spans(scale):
    """paper: the span rule with the spans of parse depths 2, 3 (A.1); paper-code: the inside
    rule over the released B = 4, C = 2 words. The trial's source carries both, so that the
    adversary's pool and the probes read the same labels."""
    for protocol, rule in (("paper", "span"), ("paper-code", "inside")):
        cfg = build("algorithms", scale=scale, protocol=protocol, seeds=(0,)).base
        source = load(labelled_source(cfg))
        assert source.label_rule == rule and cfg.measure.label_rule == rule
        longest = source.max_length  # 16 for pcfg:paper (gpu), 8 for the CPU grammars
        want = depth_spans(longest) if protocol == "paper" else {"B": 4, "C": 2}
        assert source.spans == want
        assert validate_trial(cfg)[0].spans == want
    assert depth_spans(32) == {"B": 16, "C": 8}  # the text's depth-6 grammar: L = 32/16/8
    assert depth_spans(16) == {"B": 8, "C": 4}


def test_depth_spans_on_a_32_word_grammar_are_the_texts():
    """The paper-like grammar (sentences up to 32 words): A spans the sentence (up to 32), B the
    first 16 words, C the first 8; every downstream sentence is long enough for both."""
    source = load({**SourceSpec(PAPER_LIKE_SOURCE).to_dict(), "spans": "depth",
                   "label_rule": "span"})
    assert source.max_length == 32 and source.spans == {"B": 16, "C": 8}
    assert source.downstream_min_length == 16


@pytest.mark.parametrize("scale", ["sweep", "tiny", "gpu"])
@pytest.mark.parametrize("experiment", ["steps", "sizes", "algorithms"])
def test_paper_code_runs_at_the_scales_lr(scale, experiment):
    want = get_scale(scale).base().train.lr
    for protocol in ("paper", "paper-code", "paper+linear-schedule"):
        assert build(experiment, scale=scale, protocol=protocol).base.train.lr == want


def test_paper_code_warms_up_as_the_released_run():
    """The released README's run: --lr_schedule step --warmup_proportion 0.13333 --max_steps
    25000 (3333 warmup updates, its --num_warmup_steps), then linear decay."""
    assert RELEASED_WARMUP_PROPORTION == 0.13333
    code = apply_overrides(TrialConfig(), protocol_overrides("paper-code")).train
    assert resolve(dataclasses.replace(code, steps=25_000)).warmup_steps == 3333
    sizes = build("sizes", scale="tiny", protocol="paper-code").base.train
    assert sizes.schedule == "linear"
    assert resolve(sizes).warmup_steps == round(0.13333 * TINY.steps)


@pytest.mark.parametrize("protocol", diagnosis_protocols() + ["paper-code"])
@pytest.mark.parametrize("scale", ["sweep", "tiny", "gpu"])
@pytest.mark.parametrize("experiment", ["steps", "sgd"])
def test_steps_and_sgd_hold_the_rate_after_warmup_under_every_protocol(experiment, scale,
                                                                        protocol):
    """A.5 / B.2: checkpoints at different steps are compared, so the rate stays at its peak
    after warmup (no decay to 0) whatever the protocol's schedule elsewhere."""
    train = resolve(build(experiment, scale=scale, protocol=protocol).base.train)
    assert train.schedule == "constant"
    after = range(train.warmup_steps, train.steps, max(1, train.steps // 50))
    assert {learning_rate(s, peak=train.lr, warmup_steps=train.warmup_steps,
                          total_steps=train.steps, schedule=train.schedule)
            for s in after} == {train.lr}
    if experiment == "sgd":
        assert train.warmup_steps == round(0.12 * train.steps)


def test_the_sweeps_paper_and_the_replications_paper_are_one():
    """``--scale gpu`` / ``--scale sweep`` of the sweeps and ``flatlm replicate --protocol
    paper`` at any scale: the same labels, masking, schedule shape and probe settings (from
    ``PAPER``), whatever the scale."""
    def protocol_part(cfg):
        return (cfg.measure.probe, cfg.measure.label_rule, cfg.measure.spans, cfg.train.mask,
                cfg.train.schedule)

    sweeps = [experiment_of("steps", argparse.Namespace(scale=s)).base
              for s in ("gpu", "sweep")]
    replication = [exp.base for scale in ("tiny", "gpu", "sweep")
                   for exp in experiments_from_args(argparse.Namespace(
                       experiment="steps", protocol="paper", diagnose=False, scale=scale,
                       seeds=None, overrides=[], models=None, algorithms=None,
                       without_selection_measures=False))]
    parts = {protocol_part(cfg) for cfg in sweeps + replication}
    assert len(parts) == 1
    probe = sweeps[0].measure.probe
    assert (probe.epochs, probe.batch_size, probe.seeds, probe.lr) == (100, 512, 5, 1e-3)
    code = {experiment_of("steps", argparse.Namespace(scale="gpu", protocol="paper-code"))
            .base.measure.probe,
            build("steps", scale="tiny", protocol="paper-code").base.measure.probe}
    assert len(code) == 1


def test_a_non_pcfg_source_keeps_its_own_labels():
    dyck = build("steps", scale="tiny", protocol="paper", source="dyck:8").base
    assert dyck.measure.spans is None and dyck.measure.label_rule is None
    assert labelled_source(dyck) == dyck.source
    with pytest.raises(ValueError, match="measure.spans='depth': only a PCFG"):
        labelled_source(apply_overrides(dyck, {"measure.spans": "depth"}))
    with pytest.raises(ValueError, match="measure.spans='deep'"):
        apply_overrides(dyck, {"measure.spans": "deep"})


@pytest.mark.parametrize("name, needle", [("nope", "unknown base 'nope'"),
                                          ("paper+warp", "unknown switch 'warp'")])
def test_bad_protocols_name_what_is_wrong(name, needle):
    with pytest.raises(ValueError, match=needle):
        parse_protocol(name)


def test_diagnosis_turns_on_each_switch_alone():
    names = diagnosis_protocols()
    assert switches_of_kind(ROBUSTNESS) == ("second-grammar",)
    assert switches_of_kind(ABLATION) == ("soft-targets",)
    assert names[0] == "paper" and len(names) == 1 + len(SWITCHES) - 2
    for name in names[1:]:
        assert len(parse_protocol(name)[1]) == 1
    assert not any(is_robustness(name) or is_ablation(name) for name in names)


@pytest.fixture
def own_switches(monkeypatch):
    """The switch table as it is, restored after the test registers its own."""
    saved = dict(SWITCHES)
    yield
    SWITCHES.clear()
    SWITCHES.update(saved)


def test_a_registered_switch_is_a_protocol_like_the_built_in_ones(own_switches):
    """Issue 51, item 1: the protocols are a table plug-ins add to, as the built-ins are in it."""
    register_switch(Switch(name="cosine", description="cosine decay after warmup",
                           overrides={"train.schedule": "cosine"}))
    assert protocol_overrides("paper+cosine")["train.schedule"] == "cosine"
    assert describe("paper+cosine").endswith("+ cosine decay after warmup")
    assert "paper+cosine" in diagnosis_protocols()  # a protocol difference, turned on alone
    register_switch(Switch(name="third-grammar", description="another", kind=ROBUSTNESS))
    assert is_robustness("paper+third-grammar")
    assert "paper+third-grammar" not in diagnosis_protocols()
    with pytest.raises(ValueError, match="unknown switch 'cosin'.*add one with "
                                         "flatlm.experiments.protocols.register_switch"):
        parse_protocol("paper+cosin")
    with pytest.raises(ValueError, match="registered already"):
        register_switch(Switch(name="cosine", description="again"))
    with pytest.raises(ValueError, match="kind='other'"):
        Switch(name="x", description="x", kind="other")
    with pytest.raises(ValueError, match=r"without '\+'"):
        Switch(name="a+b", description="x")


def test_soft_targets_is_an_ablation_that_trains_on_the_truth_and_changes_nothing_else():
    assert is_ablation("paper+soft-targets") and not is_ablation("paper-code")
    assert not is_robustness("paper+soft-targets")
    soft, paper = protocol_overrides("paper+soft-targets"), protocol_overrides("paper")
    assert soft.pop("train.targets") == "truth" and soft == paper


def test_the_second_grammar_changes_the_language_and_nothing_else():
    """``+second-grammar`` (the robustness column) trains and measures as its base, on the
    testbed search's runner-up grammar (its saved q0-7 candidate, bit for bit)."""
    search = json.loads((Path(__file__).parents[2] / "bench" / "results" /
                         "testbed_search.json").read_text())
    runner_up = next(c for c in search["stage0"]["candidates"] if c["id"] == "q0-7")
    assert json.loads(TESTBED_SECOND_SOURCE) == runner_up["spec"] and runner_up["kept"]
    for base in ("paper", "paper-code"):
        plain = dict(build("sizes", scale="testbed", protocol=base).trials())
        second = dict(build("sizes", scale="testbed", protocol=f"{base}+second-grammar").trials())
        assert list(plain) == list(second)
        for name, cfg in second.items():
            assert cfg.source == SourceSpec(TESTBED_SECOND_SOURCE) != plain[name].source
            assert dataclasses.replace(cfg, source=plain[name].source) == plain[name]
    assert is_robustness("paper+second-grammar") and is_robustness("paper-code+second-grammar")
    assert not is_robustness("paper") and not is_robustness("paper+second-grammar+mask-only")


@pytest.mark.parametrize("scale, protocol, needle", [
    ("tiny", "paper+second-grammar", "the tiny scale has no second grammar"),
    ("testbed", "paper+deep-grammar+second-grammar", "both choose the language")])
def test_a_second_grammar_where_there_is_none_is_refused(scale, protocol, needle):
    with pytest.raises(ValueError, match=needle):
        build("sizes", scale=scale, protocol=protocol)


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
    with pytest.raises(ValueError, match="experiment='bogus': use one of steps, sizes"):
        build("bogus")
    with pytest.raises(ValueError, match="train.nonsense"):
        build("steps", overrides={"train.nonsense": 1})
