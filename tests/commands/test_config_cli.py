"""``flatlm config`` (issue 39, item 4): a trial's resolved config with the layer that set each
key, checked against the layers themselves; its JSON is the config ``flatlm trial`` builds."""

import json

import pytest

from flatlm.cli import build_parser, main
from flatlm.commands.trial import trial_config
from flatlm.core.config import to_dict
from flatlm.experiments.layers import DEFAULT, config_layers, provenance
from flatlm.experiments.paper import build
from flatlm.experiments.scales import SCALES
from flatlm.runs.trial import flat_settings


@pytest.mark.parametrize(("scale", "protocol", "experiment", "overrides"), [
    ("tiny", "paper", None, None),
    ("testbed", "paper-code", "sgd", {"train.lr": 0.1}),
    ("sweep", "paper+inside-labels", "algorithms", None),
])
def test_each_key_names_the_last_layer_that_changed_it(scale, protocol, experiment, overrides):
    layers = config_layers(scale, protocol, experiment=experiment, overrides=overrides)
    flats = [flat_settings(cfg) for _, cfg in layers]
    names = [name for name, _ in layers]
    for key, (value, layer) in provenance(layers).items():
        i = names.index(layer)
        assert value == flats[-1][key]
        assert all(flat.get(key) == value for flat in flats[i:])  # unchanged after it
        assert i == 0 or flats[i - 1].get(key) != value  # and changed by it
    assert layers[0][0] == DEFAULT


def test_the_last_layer_is_the_trial_replicate_runs():
    layers = config_layers("testbed", "paper", experiment="sizes",
                           trial="d64-h4-l4-i256_seed2")
    trials = dict(build("sizes", scale="testbed", protocol="paper",
                        seeds=SCALES["testbed"].seeds_of("sizes")).trials())
    assert layers[-1][1] == trials["d64-h4-l4-i256_seed2"]
    rows = provenance(layers)
    assert rows["train.seed"] == (2, "trial d64-h4-l4-i256_seed2")
    assert rows["model"] == ("d64-h4-l4-i256", "trial d64-h4-l4-i256_seed2")


def test_the_json_is_the_config_flatlm_trial_builds(capsys):
    options = ["--scale", "tiny", "--protocol", "paper-code", "--set", "train.steps=600"]
    assert main(["config", *options, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    built = trial_config(build_parser().parse_args(["trial", "--out", "x", *options]))
    assert printed == to_dict(built)


def test_the_listing_shows_the_set_layer_and_bad_input_is_named(capsys):
    assert main(["config", "--scale", "tiny", "--changed", "--set", "train.lr=0.01"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# layers: default -> scale tiny -> protocol paper -> source")
    line = next(x for x in out.splitlines() if x.startswith("train.lr "))
    assert line.split("=", 1)[1].split("#") == [" 0.01  ", " --set"] or \
        line.rstrip().endswith("# --set")
    assert "# default" not in out  # --changed: only what a layer set
    assert main(["config", "--trial", "seed0"]) == 2
    assert "give --experiment too" in capsys.readouterr().err
    assert main(["config", "--set", "train.lr=-1"]) == 2
    assert "train.lr" in capsys.readouterr().err
