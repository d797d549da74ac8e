"""The built-in measurements declare their settings on their registry entries (``config=``), as a
plug-in does (issue 51): no ``MeasureConfig`` field holds them, a saved config of the former form
still loads, a section at its defaults is not stored, and a config with sections survives the
pickling Ray ships it by."""

import copy
import dataclasses
import json
import pickle

import pytest

from flatlm.core.config import apply_overrides, from_dict, to_dict, to_flat_dict
from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.probes.finetune import FinetuneConfig
from flatlm.measure.probes.probe import ProbeConfig
from flatlm.measure.registry import MEASUREMENTS, settings_class, settings_sections
from flatlm.measure.run import MeasureConfig
from flatlm.runs.trial import TrialConfig, tracked_params
from flatlm.train.algorithm_settings import SamConfig
from flatlm.train.config import TrainConfig

BUILT_IN_SECTIONS = {"loss", "flatness", "probe", "finetune", "spectrum", "sharpness", "precond",
                     "critical", "noise", "cka", "llc"}


def test_every_built_in_section_is_a_registry_entrys_and_no_field():
    assert set(settings_sections()) >= BUILT_IN_SECTIONS
    assert BUILT_IN_SECTIONS.isdisjoint(f.name for f in dataclasses.fields(MeasureConfig))
    assert settings_class("flatness") is FlatnessConfig and settings_class("probe") is ProbeConfig
    readers = [m.name for m in MEASUREMENTS.values() if "flatness" in m.sections]
    assert readers == ["fisher", "hessian", "eigen", "density", "blocks", "sharpness",
                       "precond", "critical", "llc"]  # one section, nine measurements


def test_the_defaults_are_the_former_fields():
    cfg = MeasureConfig()
    assert cfg.flatness == FlatnessConfig() and cfg.flatness.n_inputs is None  # all n_eval
    assert cfg.finetune == FinetuneConfig() and cfg.finetune.seeds == 2
    assert cfg.sections == () and cfg.probe == cfg.settings("probe") == ProbeConfig()


def test_a_saved_config_of_the_former_form_loads_and_stores_only_what_differs():
    former = to_dict(MeasureConfig())
    former |= {"probe": {**to_dict(ProbeConfig()), "seeds": 3},
               "flatness": to_dict(FlatnessConfig()), "loss": {}}
    cfg = from_dict(MeasureConfig, json.loads(json.dumps(former)))
    assert cfg.probe.seeds == 3 and cfg.flatness == FlatnessConfig()
    assert [name for name, _ in cfg.sections] == ["probe"]
    assert to_dict(cfg)["probe"]["seeds"] == 3 and "flatness" not in to_dict(cfg)
    assert from_dict(MeasureConfig, to_dict(cfg)) == cfg
    # the flat keys and flags spell a built-in's settings as before
    assert apply_overrides(MeasureConfig(), {"probe.seeds": 3}) == cfg
    assert to_flat_dict(cfg)["probe.seeds"] == 3


def test_the_logged_params_give_every_section_that_ran_defaults_included():
    cfg = apply_overrides(TrialConfig(), {"measure.what": ["loss", "probe"]})
    params = tracked_params(cfg)
    assert params["measure.probe.seeds"] == 5 and params["measure.probe.epochs"] == 100
    assert "measure.loss.batch_size" in params
    assert not any(k.startswith(("measure.flatness.", "measure.finetune.")) for k in params)


@pytest.mark.parametrize("cfg", [
    MeasureConfig(sections={"probe": ProbeConfig(seeds=2)}),
    TrainConfig(algorithm="sam", sections={"sam": SamConfig(rho=0.1)})])
def test_a_config_with_sections_pickles_and_copies_as_itself(cfg):
    for again in (pickle.loads(pickle.dumps(cfg)), copy.deepcopy(cfg), copy.copy(cfg)):
        assert again == cfg and again.sections == cfg.sections


def test_an_unknown_attribute_is_an_attribute_error_and_with_settings_merges():
    cfg = MeasureConfig()
    assert not hasattr(cfg, "no_such_section") and not hasattr(cfg, "_private")
    with pytest.raises(AttributeError, match="'MeasureConfig' object has no attribute 'x'"):
        cfg.x  # noqa: B018
    both = cfg.with_settings(probe=ProbeConfig(seeds=2)).with_settings(
        finetune=FinetuneConfig(seeds=1))
    assert both.probe.seeds == 2 and both.finetune.seeds == 1
    with pytest.raises(ValueError, match=r"measure.probe=.*set a registered measurement's own "
                                         "section"):
        cfg.with_settings(probe=FlatnessConfig())
