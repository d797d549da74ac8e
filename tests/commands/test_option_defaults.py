"""Issue 39, item 5: one default per option across commands. Every ``--scale``, ``--protocol``
and ``--device`` of the flatlm commands and the sweep scripts defaults to the one value in
``flatlm.commands`` (they once defaulted to sweep / tiny, paper / paper,paper-code and cpu /
auto / cuda-if-available, by command)."""

import argparse

import pytest

from flatlm.cli import build_parser
from flatlm.commands import DEFAULT_DEVICE, DEFAULT_PROTOCOL, DEFAULT_SCALE
from flatlm.commands.replicate import add_selection_arguments

SHARED = {"scale": DEFAULT_SCALE, "protocol": DEFAULT_PROTOCOL, "device": DEFAULT_DEVICE}


def parsers(parser: argparse.ArgumentParser, name: str = "flatlm"):
    """``parser`` and every subcommand's parser under it, by name."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, child in action.choices.items():
                yield from parsers(child, f"{name} {sub}")


def shared_options(named):
    return [(name, a.dest, a.default) for name, p in named for a in p._actions
            if a.dest in SHARED]


def sweep_parsers():
    from sweeps import cli, replicate, scaling

    rep = cli.parser(replicate.__doc__, trial_options=False)
    add_selection_arguments(rep)
    return [("sweeps/scaling.py", cli.parser(scaling.__doc__)), ("sweeps/replicate.py", rep)]


def test_every_command_defaults_scale_protocol_and_device_alike():
    found = shared_options(parsers(build_parser())) + shared_options(sweep_parsers())
    named = {(name, dest) for name, dest, _ in found}
    # the commands that take them (a command that drops one fails here, so does a new default)
    assert {("flatlm trial", "scale"), ("flatlm config", "scale"), ("flatlm replicate", "scale"),
            ("sweeps/scaling.py", "scale"), ("sweeps/replicate.py", "scale"),
            ("flatlm replicate", "protocol"), ("sweeps/scaling.py", "protocol"),
            ("flatlm train", "device"), ("flatlm measure", "device"),
            ("flatlm data make", "device"), ("flatlm replicate", "device")} <= named
    assert [f for f in found if f[2] != SHARED[f[1]]] == []


@pytest.mark.parametrize("option, value", sorted(SHARED.items()))
def test_the_defaults_are_the_documented_ones(option, value):
    assert {"scale": "sweep", "protocol": "paper", "device": "cpu"}[option] == value
