"""The override path: dotted keys, type checks, unknown keys rejected, flat views."""

from dataclasses import dataclass, field

import pytest

from flatlm.core.config import ConfigError, apply_overrides, from_dict, to_dict, to_flat_dict


@dataclass(frozen=True, kw_only=True)
class Inner:
    lr: float = 1e-3
    steps: int = 10
    tag: str | None = None
    checkpoints: tuple[int, ...] = ()

    def __post_init__(self):
        if self.lr <= 0:
            raise ValueError("lr must be > 0")


@dataclass(frozen=True, kw_only=True)
class Outer:
    source: str = "pcfg:paper"
    inner: Inner = field(default_factory=Inner)


def test_dotted_overrides_with_strings_from_a_command_line():
    cfg = apply_overrides(Outer(), {"inner.lr": "3e-4", "inner.steps": "20",
                                    "inner.checkpoints": "[0, 10]", "source": "hmm:seed=0"})
    assert cfg.inner == Inner(lr=3e-4, steps=20, checkpoints=(0, 10))
    assert cfg.source == "hmm:seed=0"
    assert apply_overrides(cfg, {"inner.tag": None}).inner.tag is None
    assert apply_overrides(cfg, {"inner": {"steps": 5}}).inner.steps == 5


@pytest.mark.parametrize("key, value, match", [
    ("inner.lrr", 1.0, "unknown config key 'inner.lrr'"),
    ("outer", 1, "unknown config key 'outer'"),
    ("source.x", 1, "no sub-fields"),
    ("inner.steps", "ten", "inner.steps='ten'"),
    ("inner.steps", 1.5, "inner.steps=1.5"),
    ("inner.lr", -1.0, "lr must be > 0"),
])
def test_bad_overrides_name_the_key(key, value, match):
    with pytest.raises(ConfigError, match=match):
        apply_overrides(Outer(), {key: value})


def test_flat_and_round_trip():
    cfg = apply_overrides(Outer(), {"inner.checkpoints": [1, 2]})
    assert to_flat_dict(cfg) == {"source": "pcfg:paper", "inner.lr": 1e-3, "inner.steps": 10,
                                 "inner.tag": None, "inner.checkpoints": (1, 2)}
    assert from_dict(Outer, to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match="unknown"):
        from_dict(Outer, {"nope": 1})


def test_a_shorter_run_carries_its_checkpoints_along():
    """Issue 42, item 3: ``--set train.steps=200`` alone was refused because the scale's
    checkpoints (0, 1000, 2000) lay outside the run; they now keep their places in it."""
    from flatlm.experiments.scales import scale

    base = scale("sweep").base()
    assert base.train.checkpoint_steps == (0, 1000, 2000)
    assert apply_overrides(base, {"train.steps": 200}).train.checkpoint_steps == (0, 100, 200)
    assert apply_overrides(base, {"train.steps": 3}).train.checkpoint_steps == (0, 2, 3)
    # checkpoints that fit the new run, or given with it, are kept as they are
    assert apply_overrides(base, {"train.steps": 4000}).train.checkpoint_steps == (0, 1000, 2000)
    given = apply_overrides(base, {"train.steps": 600, "train.checkpoint_steps": [600]})
    assert given.train.checkpoint_steps == (600,)
    with pytest.raises(ConfigError, match="outside the run"):
        apply_overrides(base, {"train.steps": 600, "train.checkpoint_steps": [900]})
