"""A plug-in algorithm owns its config section: tests/assets/toy_settings_algorithm.py gives its
settings as ``Algorithm.config`` and edits no dataclass; ``train.scaled_sign.scale`` is then a key
like any other (set, checked against the toy's own defaults, logged, saved and read back), and the
field that holds the sections is never a key (the built-ins' own: test_builtin_settings.py)."""


import pytest
import torch

from flatlm.core.config import ConfigError, apply_overrides, from_dict, to_dict, to_flat_dict
from flatlm.models.checkpoint import load_checkpoint
from flatlm.runs.trial import TrialConfig, run_trial, tracked_params, training_identity
from flatlm.train import TrainConfig
from tests.train.conftest import plugin_algorithm

TOY = "tests.assets.toy_settings_algorithm"
LR = 1e-2


@pytest.fixture
def scaled_sign():
    with plugin_algorithm(TOY) as toy:
        yield toy


def _trial(**overrides) -> TrialConfig:
    return apply_overrides(TrialConfig(), {
        "source": "dyck:4", "model": "d16-h1-l1-i32", "train.algorithm": "scaled_sign",
        "train.steps": 1, "train.batch_size": 8, "train.lr": LR, "train.warmup_steps": None,
        "train.checkpoint_steps": [0, 1], "measure.n_eval": 16, "measure.what": ["loss"],
        **overrides})


def test_its_setting_is_a_key_checked_against_its_own_defaults(scaled_sign):
    cfg = _trial(**{"train.scaled_sign.scale": "0.5"})
    assert cfg.train.settings("scaled_sign") == scaled_sign.ScaledSignConfig(scale=0.5)
    assert _trial().train.settings("scaled_sign").scale == 1.0  # not given: its default
    with pytest.raises(ConfigError, match=r"unknown config key 'train.scaled_sign.colour': "
                                          "ScaledSignConfig has scale"):
        _trial(**{"train.scaled_sign.colour": 1})
    with pytest.raises(ValueError, match=r"train.scaled_sign.scale=-1.0: use a multiple > 0"):
        _trial(**{"train.scaled_sign.scale": -1})
    with pytest.raises(ConfigError, match=r"unknown config key 'train.scaled_signs'.*sections "
                                          "of registered components: .*muon, scaled_sign"):
        _trial(**{"train.scaled_signs.scale": 1})


def test_it_is_logged_saved_and_read_back_like_a_field(scaled_sign):
    cfg = _trial(**{"train.scaled_sign.scale": 0.5})
    assert to_flat_dict(cfg.train)["scaled_sign.scale"] == 0.5
    assert to_dict(cfg.train)["scaled_sign"] == {"scale": 0.5}
    assert from_dict(TrialConfig, to_dict(cfg)) == cfg
    assert tracked_params(cfg)["train.scaled_sign.scale"] == 0.5
    assert training_identity(cfg)["train"]["scaled_sign"] == {"scale": 0.5}
    other = apply_overrides(cfg, {"train.algorithm": "adamw", "train.warmup_steps": 1})
    assert not any("scaled_sign" in k for k in tracked_params(other))  # not its algorithm's
    assert "scaled_sign" not in training_identity(other)["train"]


def test_the_field_holding_the_sections_is_never_a_key():
    assert "sections" not in to_dict(TrainConfig())
    assert not any(k.startswith("sections") for k in to_flat_dict(TrainConfig()))
    with pytest.raises(ConfigError, match="unknown config key 'sections'"):
        apply_overrides(TrainConfig(), {"sections": []})


def test_the_update_reads_its_setting(scaled_sign, tmp_path):
    run_trial(_trial(**{"train.scaled_sign.scale": 0.5}), tmp_path)
    before, after = (load_checkpoint(tmp_path / "checkpoints" / f"step-{s}")[0] for s in (0, 1))
    deltas = torch.cat([(b - a).detach().abs().flatten()
                        for a, b in zip(before.parameters(), after.parameters(), strict=True)])
    moved = deltas[deltas > 0]
    assert moved.numel() > deltas.numel() / 2
    assert torch.allclose(moved, torch.full_like(moved, 0.5 * LR), rtol=1e-4)
