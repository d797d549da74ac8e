"""The ``testbed`` scale (issue 23, item 3; chosen by bench/testbed_search.py) exists and builds
every experiment under both protocols; its source labels by the paper's span rule."""

import json

import pytest

from flatlm.experiments.grids import EXPERIMENTS, EXTRA_EXPERIMENTS
from flatlm.experiments.paper import build
from flatlm.experiments.scales import SCALES, scale
from flatlm.measure.curvature.grown import lcm_shape
from flatlm.models.presets import shape_string
from flatlm.runs.trial import validate_trial
from flatlm.sources import load


def test_the_testbed_scale_is_registered():
    assert scale("testbed") is SCALES["testbed"]
    assert scale("testbed").kl_threshold == 0.02  # the search's criterion (a)


def test_the_testbed_source_labels_by_the_span_rule_with_spans_by_parse_depth():
    source = load(scale("testbed").source)
    assert source.label_rule == "span"
    T = source.max_length
    assert source.spans == {"B": T // 2, "C": T // 4}


@pytest.mark.parametrize("protocol", ["paper", "paper-code"])
@pytest.mark.parametrize("experiment", [*EXPERIMENTS, *EXTRA_EXPERIMENTS])
def test_every_experiment_builds_valid_trials_at_the_testbed_scale(experiment, protocol):
    exp = build(experiment, scale="testbed", protocol=protocol, seeds=(0,))
    trials = exp.trials()
    assert trials
    for _, cfg in trials:
        validate_trial(cfg)
        assert cfg.source.to_dict() == json.loads(scale("testbed").source)
    if experiment == "sizes":
        models = [str(cfg.model) for _, cfg in trials]
        assert exp.base.measure.grow_to == shape_string(lcm_shape(models))


def test_every_adamw_trial_of_the_testbed_runs_at_the_papers_constant_rate():
    # A.5: AdamW at a constant 1e-3 after warmup; the testbed's steps were chosen for it
    for name in ("steps", "sizes", "algorithms"):
        train = build(name, scale="testbed").base.train
        assert (train.lr, train.schedule, train.steps) == (1e-3, "constant", 10000)
    sgd = build("sgd", scale="testbed").base.train
    assert (sgd.lr, sgd.schedule) == (scale("testbed").sgd_lr, "constant")
    # the released code's protocol decays the same rate linearly
    code = build("sizes", scale="testbed", protocol="paper-code").base.train
    assert (code.lr, code.schedule) == (1e-3, "linear")


def test_the_testbed_adversary_uses_the_searched_lambda():
    train = build("algorithms", scale="testbed").base.train
    assert train.settings("adversarial").lambda_ == pytest.approx(0.01)
    assert train.settings("adversarial").task == "B"


@pytest.mark.parametrize(("experiment", "key", "value"), [
    ("sizes", "model", "d16-h1-l1-i64"), ("steps", "train.seed", -1),
    ("algorithms", "train.algorithm", "sam")])
def test_a_set_of_a_key_the_experiment_varies_is_refused_not_ignored(experiment, key, value):
    """Issue 43, item 13: ``flatlm replicate --set model=...`` was silently replaced by the
    sizes grid in every trial (the sweeps refused it); build() now refuses it for every
    runner."""
    with pytest.raises(ValueError, match=f"--set {key}: the {experiment} experiment varies"):
        build(experiment, scale="testbed", seeds=(0,), overrides={key: value})
    build(experiment, scale="testbed", seeds=(0,), overrides={"train.log_every": 25})


def test_a_negative_measure_seed_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"measure.seed=-1: use an integer >= 0"):
        build("steps", scale="testbed", seeds=(0,), overrides={"measure.seed": -1})
