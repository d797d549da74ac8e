"""Every example in a ``flatlm`` command's ``--help`` against the code (issue 42, item 3): each
names only options its command has; each ``flatlm trial`` example builds a valid trial (the
first-hour failure: ``--set train.steps=600`` refused because the default checkpoints lay
beyond it); each ``flatlm replicate`` example runs as a ``--dry-run``. The sweep scripts' own
examples are built in ``tests/test_readme.py``."""

from __future__ import annotations

import pytest

from tests.test_readme import (
    ROOT,
    command_problems,
    dry_run_words,
    flatlm_helps,
    split_commands,
)


def help_examples() -> list:
    """Every command line in a ``flatlm`` help text that starts with ``flatlm``."""
    out = []
    for name, text in flatlm_helps().items():
        for line in text.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("flatlm "):
                out += [(name, c) for c in split_commands(line) if c.words[0] == "flatlm"]
    return out


def test_the_help_texts_have_examples_and_each_names_only_real_options():
    examples = help_examples()
    named = {command.words[1] for _, command in examples}
    assert {"trial", "replicate", "ui"} <= named
    problems = [p for _, command in examples for p in command_problems(command)]
    assert problems == []


def test_each_trial_example_builds_a_valid_trial():
    from flatlm.cli import build_parser
    from flatlm.commands.trial import trial_config

    trials = [c for _, c in help_examples() if c.words[1] == "trial"]
    assert any("train.steps" in " ".join(c.words) for c in trials)
    for command in trials:
        args = build_parser().parse_args(list(command.words[1:]))
        if getattr(args, "device", "cpu") != "cpu":
            args.device = "cpu"  # a GPU example is built, not run
        trial_config(args)  # raises ValueError naming the field on a bad example


@pytest.mark.parametrize("i", range(6))
def test_each_replicate_example_runs_as_a_dry_run(tmp_path, i, monkeypatch, capsys):
    """In this process, through the command line's own ``main`` (a subprocess each cost 5 s
    of importing torch; ``tests/test_readme.py`` runs ``flatlm --help`` as a process)."""
    from flatlm.cli import main

    replicate = list(dict.fromkeys(c for _, c in help_examples() if c.words[1] == "replicate"
                                   and "--out" in c.words))
    if i >= len(replicate):
        pytest.skip(f"{len(replicate)} replicate examples")
    monkeypatch.chdir(ROOT)
    words = dry_run_words(replicate[i], tmp_path / "out")
    rc = main(words)
    out, err = capsys.readouterr()
    assert rc == 0, (replicate[i].line, err[-2000:])
    # a --print-config example prints the trials' configs and stops; the others their cost
    assert ("# trial " if "--print-config" in replicate[i].words else "in all:") in out
