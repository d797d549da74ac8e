"""The built-in algorithms own their settings as a plug-in does (issue 51): sam, adversarial, grow,
label_noise and muon declare them on their registry entry (``Algorithm.config``) and no
``TrainConfig`` field holds them. A config saved before (every section written, at its defaults)
reads back as the same config; a section at its defaults is stored as none, so two configs that
say the same compare equal; flags, logged params and a training's identity still spell them
``train.<section>.<key>``."""

import argparse
import dataclasses

import pytest

from flatlm.core.config import (
    add_arguments,
    apply_overrides,
    from_dict,
    overrides_from_args,
    to_dict,
)
from flatlm.runs.trial import TrialConfig, tracked_params, training_identity
from flatlm.train.algorithm_settings import (
    AdversarialConfig,
    GrowConfig,
    LabelNoiseConfig,
    SamConfig,
)
from flatlm.train.config import TrainConfig
from flatlm.train.muon_config import MuonConfig
from flatlm.train.registry import BUILT_IN

OWN = {"sam": SamConfig, "adversarial": AdversarialConfig, "grow": GrowConfig,
       "label_noise": LabelNoiseConfig, "muon": MuonConfig}


def test_every_built_in_section_is_declared_on_its_entry_and_is_no_field():
    declared = {a.section: a.config for a in BUILT_IN if a.section is not None}
    assert declared == OWN
    assert not {f.name for f in dataclasses.fields(TrainConfig)} & set(OWN)


def _saved_before(algorithm: str, **changed) -> dict:
    """A TrainConfig dict as flatlm wrote it while the settings were fields: every section."""
    old = to_dict(TrainConfig(algorithm=algorithm))
    old.update({name: to_dict(cls()) for name, cls in OWN.items() if name != "muon"})
    for key, value in changed.items():
        section, field = key.split(".")
        old[section][field] = value
    return old


def test_a_config_saved_before_reads_back_as_the_same_config():
    assert from_dict(TrainConfig, _saved_before("sam")) == TrainConfig(algorithm="sam")
    changed = from_dict(TrainConfig, _saved_before("sam", **{"sam.rho": 0.1}))
    assert changed.settings("sam") == SamConfig(rho=0.1)
    assert changed != TrainConfig(algorithm="sam")
    assert to_dict(changed)["sam"] == {"rho": 0.1}
    assert "adversarial" not in to_dict(changed)  # at its defaults: not stored


def test_a_section_at_its_defaults_is_stored_as_none():
    given = TrainConfig(algorithm="sam", sections={"sam": SamConfig(rho=0.05)})
    assert given == TrainConfig(algorithm="sam") and given.sections == ()
    assert "sam" not in to_dict(given)
    assert given.settings("sam") == SamConfig()
    with pytest.raises(ValueError, match=r"train\.sam="):
        TrainConfig(sections={"sam": LabelNoiseConfig()})  # another section's class


def _trial(algorithm: str) -> TrialConfig:
    return apply_overrides(TrialConfig(), {"source": "dyck:4", "model": "d16-h1-l1-i32",
                                           "train.algorithm": algorithm})


@pytest.mark.parametrize(("algorithm", "key", "value"), [
    ("sam", "sam.rho", 0.05), ("label_noise", "label_noise.p", 0.1),
    ("adversarial", "adversarial.lambda", 1.0), ("muon", "muon.lr", 0.02)])
def test_the_runs_own_settings_are_logged_and_identify_it_at_their_defaults(algorithm, key,
                                                                            value):
    cfg = _trial(algorithm)
    assert tracked_params(cfg)[f"train.{key}"] == value
    section, field = key.split(".")
    assert training_identity(cfg)["train"][section][field] == value
    plain = _trial("adamw")
    assert not any(k.startswith(f"train.{section}.") for k in tracked_params(plain))
    assert section not in training_identity(plain)["train"]


def test_each_section_has_its_flags_as_before():
    parser = argparse.ArgumentParser()
    add_arguments(parser, TrainConfig, "train.")
    args = parser.parse_args(["--sam-rho", "0.2", "--adversarial-lambda", "0.5",
                              "--grow-steps", "3", "--grow-to", "d16-h1-l2-i32",
                              "--label-noise-p", "0.3", "--muon-ns-steps", "4"])
    given = overrides_from_args(args)
    assert given == {"train.sam.rho": "0.2", "train.adversarial.lambda": "0.5",
                     "train.grow.steps": "3", "train.grow.to": "d16-h1-l2-i32",
                     "train.label_noise.p": "0.3", "train.muon.ns_steps": "4"}
    cfg = apply_overrides(TrialConfig(), given).train
    assert cfg.settings("sam").rho == 0.2 and cfg.settings("adversarial").lambda_ == 0.5
    assert cfg.settings("grow").to == ("d16-h1-l2-i32",) and cfg.settings("muon").ns_steps == 4
