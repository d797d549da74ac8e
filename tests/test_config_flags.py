"""CLI options generated from dataclass field types (``flatlm.core.config.add_arguments``)."""

import argparse
from dataclasses import dataclass, field

import pytest

from flatlm.core.config import (
    ConfigError,
    add_arguments,
    apply_overrides,
    field_docs,
    overrides_from_args,
)


@dataclass(frozen=True, kw_only=True)
class Inner:
    rho: float = 0.05  # a radius; > 0
    lambda_: float = 1.0  # a weight


@dataclass(frozen=True, kw_only=True)
class Cfg:
    steps: int = 10  # updates; >= 1
    compile: bool = False  # torch.compile the loss
    checkpoint_steps: tuple[int, ...] = ()  # when to save, in
    #   updates
    tasks: tuple[str, ...] = ("B",)
    micro: int | None = None
    mask: str | float = "one"
    inner: Inner = field(default_factory=Inner)


def _parse(*argv, exclude=()):
    p = argparse.ArgumentParser()
    p.add_argument("--out")  # an option of the command itself, not a config key
    add_arguments(p, Cfg, exclude=exclude)
    args = p.parse_args(list(argv))
    return apply_overrides(Cfg(), overrides_from_args(args)), overrides_from_args(args)


def test_only_given_options_become_overrides():
    cfg, overrides = _parse("--out", "x")
    assert overrides == {} and cfg == Cfg()


@pytest.mark.parametrize(("argv", "expected"), [
    (["--compile"], {"compile": True}),
    (["--no-compile"], {"compile": False}),
    (["--checkpoint-steps", "0,100,200"], {"checkpoint_steps": (0, 100, 200)}),
    (["--checkpoint-steps", "5"], {"checkpoint_steps": (5,)}),
    (["--checkpoint-steps", "[1, 2]"], {"checkpoint_steps": (1, 2)}),
    (["--checkpoint-steps", ""], {"checkpoint_steps": ()}),
    (["--tasks", "B,C"], {"tasks": ("B", "C")}),
    (["--micro", "8"], {"micro": 8}),
    (["--micro", "none"], {"micro": None}),
    (["--mask", "0.15"], {"mask": "0.15"}),  # str | float keeps the text; the class decides
    (["--mask", "one"], {"mask": "one"}),
    (["--inner-rho", "0.1", "--inner-lambda", "2"], {"inner": Inner(rho=0.1, lambda_=2.0)}),
])
def test_flags_by_field_type(argv, expected):
    cfg, _ = _parse(*argv)
    for name, value in expected.items():
        assert getattr(cfg, name) == value and type(getattr(cfg, name)) is type(value), name


@pytest.mark.parametrize(("argv", "match"), [
    (["--steps", "ten"], "steps='ten'"),
    (["--checkpoint-steps", "0,x"], r"checkpoint_steps\[1\]='x'"),
    (["--micro", "1.5"], "micro=1.5"),
    (["--inner-rho", "big"], "inner.rho='big'"),
])
def test_bad_flag_values_name_the_key(argv, match):
    with pytest.raises(ConfigError, match=match):
        _parse(*argv)


def test_help_from_field_comments_and_defaults():
    p = argparse.ArgumentParser()
    add_arguments(p, Cfg, prefix="train.", exclude={"tasks"})
    text = p.format_help()
    assert "--compile, --no-compile" in text
    assert "when to save, in updates [train.checkpoint_steps; default: empty]" in " ".join(
        text.split())
    assert "--tasks" not in text and "--inner-lambda" in text
    assert field_docs(Cfg)["steps"] == "updates; >= 1"
    args = p.parse_args(["--inner-rho", "0.2"])
    assert overrides_from_args(args) == {"train.inner.rho": "0.2"}
