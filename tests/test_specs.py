"""SourceSpec / ModelSpec as config values, and TrialConfig built, overridden and round-tripped."""

import json
import pickle

import pytest

from flatlm.core.config import ConfigError, apply_overrides, from_dict, to_dict, to_flat_dict
from flatlm.models.presets import ModelSpec, parse_model
from flatlm.runs.trial import TrialConfig
from flatlm.sources import SourceSpec, load
from flatlm.sources.pcfg import paper_grammar_path

RANDOM_PCFG = {"kind": "pcfg", "seed": 0, "random": {"vocab": 12, "depth": 2,
                                                     "nonterminals_per_level": 3, "roots": 2}}


@pytest.mark.parametrize("text", [
    "pcfg:paper", "dyck:8", "hmm:seed=0", "hmm:seed=3,vocab=20,states=12,blocks=4",
    "pcfg:seed=3,random.vocab=20", json.dumps(RANDOM_PCFG),
])
def test_source_spec_round_trips(text):
    spec = SourceSpec(text)
    assert SourceSpec(str(spec)) == spec == SourceSpec(spec.to_dict()) == SourceSpec(spec)
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert hash(SourceSpec(str(spec))) == hash(spec)
    assert load(spec).spec == spec.to_dict() == load(text).spec


def test_source_spec_equality_is_by_content():
    assert SourceSpec("dyck:8") == SourceSpec("dyck:length=8") == SourceSpec(
        {"kind": "dyck", "length": 8})
    assert str(SourceSpec("dyck:length=8")) == "dyck:8"
    # hmm fills in its defaults, so naming a default changes nothing
    assert SourceSpec("hmm:seed=0") == SourceSpec("hmm:seed=0,vocab=200")
    assert SourceSpec("hmm:seed=0") != SourceSpec("hmm:seed=1")
    assert SourceSpec("pcfg:paper").to_dict() == {"kind": "pcfg", "grammar": "paper"}
    assert str(SourceSpec(RANDOM_PCFG)) == ("pcfg:seed=0,random.vocab=12,random.depth=2,"
                                            "random.nonterminals_per_level=3,random.roots=2")


def test_a_spec_without_an_exact_short_form_is_written_as_json(tmp_path):
    spec = SourceSpec({"kind": "pcfg", "grammar": "paper", "spans": {"B": 4, "C": 2},
                       "label_rule": "posterior"})
    assert str(spec) == "pcfg:paper,spans.B=4,spans.C=2,label_rule=posterior"
    folder = tmp_path / "a,b=c"  # a comma and '=' in a path cannot be written as key=value
    folder.mkdir()
    grammar = folder / "rules.txt"
    grammar.write_text(paper_grammar_path().read_text())
    spec = SourceSpec({"kind": "pcfg", "grammar": str(grammar)})
    assert json.loads(str(spec)) == {"kind": "pcfg", "grammar": str(grammar)}
    assert SourceSpec(str(spec)) == spec


@pytest.mark.parametrize(("spec", "named"), [
    ("markov:seed=0", "source kind 'markov' is unknown"),
    ({"seed": 0}, "source kind None is unknown"),
    ("hmm:seed=0,vocabb=20", "unknown key 'vocabb'"),
    ("pcfg:paper,depth=3", "unknown field(s) ['depth']"),
    ("hmm:seed=0,leakage=2", "'leakage' must be float"),
    ("dyck:7", "'length' must be an even integer"),
    ("dyck:8,10", "cannot read '10'"),
    ('{"kind": "dyck",', "not valid JSON"),
    ("pcfg:no/such/grammar.txt", "does not exist"),
])
def test_bad_source_specs_name_the_field(spec, named):
    with pytest.raises(ValueError) as e:
        SourceSpec(spec)
    assert named in str(e.value)


def test_source_spec_is_immutable():
    spec = SourceSpec("dyck:8")
    with pytest.raises(AttributeError):
        spec.kind = "hmm"
    spec.to_dict()["length"] = 10
    assert spec == SourceSpec("dyck:8")


def test_model_spec():
    assert ModelSpec("bert-2m") == ModelSpec("d64-h1-l1-i256") != ModelSpec("bert-4.8m")
    assert str(ModelSpec(" LSTM-h512-l8 ")) == "lstm-h512-l8"
    assert parse_model(ModelSpec("bert-4.8m")) == parse_model("bert-4.8m")
    assert pickle.loads(pickle.dumps(ModelSpec("bert-41m"))) == ModelSpec("bert-41m")
    with pytest.raises(ValueError, match="'bert-3m' is neither a preset nor a shape"):
        ModelSpec("bert-3m")
    with pytest.raises(ValueError, match="not divisible"):
        ModelSpec("d65-h2-l1-i256")


def test_trial_defaults_and_string_coercion():
    cfg = TrialConfig()
    assert cfg.source == SourceSpec("pcfg:paper") and cfg.model == ModelSpec("bert-2m")
    assert TrialConfig(source="dyck:8", model="bert-4.8m").source == SourceSpec("dyck:8")
    new = apply_overrides(cfg, {"source": "hmm:seed=0", "model": "bert-4.8m"})
    assert isinstance(new.source, SourceSpec) and new.source.kind == "hmm"
    assert new.model == ModelSpec("bert-4.8m") and str(new.model) == "bert-4.8m"
    assert apply_overrides(cfg, {"source": RANDOM_PCFG}).source == SourceSpec(RANDOM_PCFG)


@pytest.mark.parametrize(("overrides", "named"), [
    ({"source": "hmm:seed=0,vocabb=3"}, "source='hmm:seed=0,vocabb=3': hmm spec: unknown key"),
    ({"model": "bert-3m"}, "model='bert-3m'"),
    ({"source.seed": 3}, "source has no sub-fields"),
    ({"train.sam_rho": 0.1}, "'train.sam_rho' was renamed: use 'train.sam.rho'"),
    ({"train.adversarial_d1": 8}, "use 'train.adversarial.d1'"),
])
def test_bad_trial_overrides_name_the_key(overrides, named):
    with pytest.raises(ConfigError) as e:
        apply_overrides(TrialConfig(), overrides)
    assert named in str(e.value)


def test_trial_config_round_trips_exactly_through_json():
    cfg = apply_overrides(TrialConfig(), {
        "source": json.dumps(RANDOM_PCFG), "model": "d16-h2-l1-i32", "train.algorithm": "sam",
        "train.sam.rho": 0.2, "train.adversarial.lambda": 0.5, "train.checkpoint_steps": "0,200",
        "train.compile": "true", "measure.tasks": "B,C", "measure.probe.seeds": 2})
    data = json.loads(json.dumps(to_dict(cfg)))
    assert data["source"] == RANDOM_PCFG and data["model"] == "d16-h2-l1-i32"
    assert data["train"]["sam"] == {"rho": 0.2} and data["train"]["adversarial"]["lambda"] == 0.5
    back = from_dict(TrialConfig, data)
    assert back == cfg and to_dict(back) == data


def test_flat_params_are_readable_and_feed_back():
    cfg = apply_overrides(TrialConfig(), {"source": "dyck:8", "model": "bert-4.8m",
                                          "train.sam.rho": 0.1})
    flat = to_flat_dict(cfg)
    assert flat["source"] == "dyck:8" and flat["model"] == "bert-4.8m"
    assert flat["train.sam.rho"] == 0.1
    # a section at its defaults is not stored: one canonical form per config
    assert not any(k.startswith("train.adversarial.") for k in flat)
    assert all(isinstance(v, str | int | float | bool | tuple | type(None))
               for v in flat.values())
    # a sweep's search space passes plain values under the same keys
    assert apply_overrides(TrialConfig(), flat) == cfg
