"""The README's commands against the code (issue 26): every ``python <script>`` names a file and
every ``flatlm <subcommand>`` a registered one; every option of a command appears in that
command's ``--help`` (Ray's and MLflow's commands too, where installed); each entry point's
``--help`` runs, and every ``flatlm replicate`` command runs as a ``--dry-run``; the install and
test commands are the ones ``.ci/run`` runs; every link resolves. A README that drifts from the
code (an option removed or renamed, a script moved, a page deleted) fails here; so does a command
in a shell block of a page under ``docs/`` (checked, not run).

Commands come from the README's shell blocks (```bash) and from its inline code that starts with
``python`` or ``flatlm`` (the table of sweeps). ``--help`` runs in a subprocess with this
interpreter and this checkout first on the path: one for every ``flatlm`` command, one for every
Python script in turn, one each for Ray's and MLflow's."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CI = ROOT / ".ci" / "run"
BIN = Path(sys.executable).parent
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)\n(.*?)^```", re.S | re.M)
INLINE_COMMAND = re.compile(r"`((?:python3?|flatlm) [^`\n]+)`")
SEPARATORS = {"&&", "||", ";", "|"}
OPTION = re.compile(r"^--?[A-Za-z][\w-]*")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Command:
    """One simple command of the README: its words, and the line it came from."""

    words: tuple[str, ...]
    line: str

    @property
    def program(self) -> str:
        return self.words[0]

    def options(self, start: int = 1) -> list[str]:
        """``--opt`` and ``-o`` words from ``words[start]`` on, without ``=value`` and any
        bracket around them."""
        return [OPTION.match(w.strip("[]")).group(0) for w in self.words[start:]
                if OPTION.match(w.strip("[]"))]


# -- reading the README ------------------------------------------------------------------------

def shell_lines(text: str) -> list[str]:
    """The lines of every shell block, continuation backslashes joined."""
    lines = []
    for block in SHELL_BLOCK.findall(text):
        lines += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return lines


def split_commands(line: str) -> list[Command]:
    """A shell line as its simple commands (split at ``&&``, ``;``, ``|``), leading ``VAR=x``
    assignments dropped, comments dropped."""
    commands, words = [], []
    for word in [*shlex.split(line, comments=True), "&&"]:
        if word not in SEPARATORS:
            words.append(word)
            continue
        while words and ASSIGNMENT.match(words[0]):
            words.pop(0)
        if words:
            commands.append(Command(tuple(words), line))
        words = []
    return commands


def readme_commands(text: str) -> list[Command]:
    """Every command of the shell blocks, then every inline ``python ...`` / ``flatlm ...``."""
    lines = shell_lines(text) + INLINE_COMMAND.findall(text)
    return [command for line in lines for command in split_commands(line)]


# -- what the code accepts ---------------------------------------------------------------------

def checkout_env() -> dict[str, str]:
    """The environment with this checkout first on the Python path."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


FLATLM = (sys.executable, "-m", "flatlm.cli")
# Every `flatlm` (sub)command's --help text from one process: the parser is built once (most
# command modules import torch), which keeps this test within a minute on a shared CPU.
EVERY_FLATLM_HELP = """
import argparse, json
from flatlm.cli import build_parser

def walk(parser, path, out):
    out[" ".join(path)] = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                walk(sub, [*path, name], out)
    return out

print(json.dumps(walk(build_parser(), [], {})))
"""


# Every Python entry point's --help from one process, in turn (each imports torch: a process
# each cost 5 s): argv[1:] of each as JSON on stdin -> {joined argv: [exit code, stdout, stderr]}.
EVERY_SCRIPT_HELP = """
import contextlib, io, json, os, runpy, sys
out, path = {}, list(sys.path)
for args in json.load(sys.stdin):
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    sys.argv = [args[-1] if args[0] == "-m" else args[0], "--help"]
    # as `python <script>` runs it: its folder first on the path
    sys.path[:] = path if args[0] == "-m" else [os.path.dirname(os.path.abspath(args[0])), *path]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            if args[0] == "-m":
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(args[0], run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException as e:  # noqa: BLE001 (reported as the script's failure)
            code, stderr = 1, io.StringIO(f"{type(e).__name__}: {e}")
    out[" ".join(args)] = [code, stdout.getvalue(), stderr.getvalue()]
print(json.dumps(out))
"""


@functools.cache
def run_help(argv: tuple[str, ...]) -> subprocess.CompletedProcess:
    """``argv --help`` with this checkout first on the path, from the repository root."""
    if argv[:3] == FLATLM:
        text = flatlm_helps().get(" ".join(argv[3:]))
        return subprocess.CompletedProcess(argv, 0 if text else 2, text or "", "" if text else
                                           f"no flatlm command {' '.join(argv[3:])!r}")
    if argv[0] == sys.executable and argv[1:] in python_entry_points():
        code, stdout, stderr = script_helps()[" ".join(argv[1:])]
        return subprocess.CompletedProcess(argv, code, stdout, stderr)
    return subprocess.run([*argv, "--help"], cwd=ROOT, env=checkout_env(), capture_output=True,
                          text=True, timeout=180)


@functools.cache
def python_entry_points() -> tuple[tuple[str, ...], ...]:
    """argv[1:] of every ``python <script>`` / ``python -m <module>`` the README and the docs
    pages name (their --help texts come from one process: ``script_helps``)."""
    commands = readme_commands(TEXT) + [
        c for page in sorted((ROOT / "docs").glob("*.md"))
        for line in shell_lines(page.read_text()) for c in split_commands(line)]
    found = [entry_point(c)[0] for c in commands if c.program in ("python", "python3")]
    return tuple(dict.fromkeys(a[1:] for a in found if a is not None))


@functools.cache
def script_helps() -> dict[str, list]:
    """``python_entry_points`` -> [exit code, stdout, stderr] of its --help."""
    done = subprocess.run([sys.executable, "-c", EVERY_SCRIPT_HELP], cwd=ROOT, env=checkout_env(),
                          input=json.dumps(python_entry_points()), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@functools.cache
def flatlm_helps() -> dict[str, str]:
    """``flatlm [subcommand ...]`` -> its --help text, for every (sub)command."""
    done = subprocess.run([sys.executable, "-c", EVERY_FLATLM_HELP], cwd=ROOT,
                          env=checkout_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def subcommands(help_text: str) -> set[str]:
    """The choices of a parser's subcommand positional: the ``{data,train,...}`` that opens its
    positional arguments (an option's choices, ``--scale {gpu,...}``, are not)."""
    found = re.search(r"^positional arguments:\n\s+\{([\w,.-]+)\}", help_text, re.M)
    return set(found.group(1).split(",")) if found else set()


def shown(argv: tuple[str, ...]) -> str:
    """A command as the README writes it: ``flatlm replicate``, ``python sweeps/scaling.py``."""
    if argv[:3] == FLATLM:
        return " ".join(("flatlm", *argv[3:]))
    if argv[0] == sys.executable:
        return " ".join(("python", *argv[1:]))
    return " ".join((Path(argv[0]).name, *argv[1:]))


def flatlm_argv(command: Command) -> tuple[tuple[str, ...], str | None]:
    """The ``flatlm`` (sub)command a README command names, as argv; or a problem."""
    argv = FLATLM
    for word in command.words[1:]:
        choices = subcommands(run_help(argv).stdout)
        if not choices:
            return argv, None
        if word not in choices:
            return argv, f"`flatlm ... {word}` is not a subcommand (one of {sorted(choices)})"
        argv = (*argv, word)
    return argv, None if not subcommands(run_help(argv).stdout) else "no subcommand given"


def entry_point(command: Command) -> tuple[tuple[str, ...] | None, str | None]:
    """The argv whose ``--help`` documents ``command`` (None: not checked here), or a problem."""
    words, program = command.words, command.program
    if program in ("python", "python3"):
        if len(words) < 2 or words[1] == "-c":
            return None, None
        if words[1] == "-m":
            return (sys.executable, "-m", words[2]), None
        if not (ROOT / words[1]).is_file():
            return None, f"`python {words[1]}`: no such file in the repository"
        return (sys.executable, words[1]), None
    if program == "flatlm":
        return flatlm_argv(command)
    if program in ("ray", "mlflow") and len(words) > 1:
        tool = BIN / program
        return ((str(tool), words[1]), None) if tool.exists() else (None, None)
    return None, None


def in_help(option: str, help_text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text) is not None


def command_problems(command: Command) -> list[str]:
    """What in ``command`` the code does not have: its file, its subcommand, its options."""
    argv, problem = entry_point(command)
    if problem or argv is None:
        return [f"{command.line!r}: {problem}"] if problem else []
    done = run_help(argv)
    if done.returncode != 0:
        return [f"{command.line!r}: `{shown(argv)} --help` exited {done.returncode}: "
                f"{done.stderr[-500:]}"]
    start = 3 if command.words[1] == "-m" else 2 if command.program.startswith("python") else 1
    return [f"{command.line!r}: {option} is not an option of `{shown(argv)}`"
            for option in command.options(start) if not in_help(option, done.stdout)]


def link_problems(text: str, base: Path) -> list[str]:
    """Relative links of a Markdown text (relative to ``base``) that name no file."""
    return [f"{base.name}: link {target!r} names no file"
            for target in LINK.findall(text)
            if not re.match(r"^[a-z]+:|^#", target)
            and not (base.parent / target.split("#")[0]).exists()]


def readme_problems(text: str) -> list[str]:
    out = []
    for command in dict.fromkeys(readme_commands(text)):
        out += command_problems(command)
    return out + link_problems(text, README)


# -- the README as it is -----------------------------------------------------------------------

TEXT = README.read_text()


def test_the_readme_has_the_main_commands():
    programs = {c.words[:2] for c in readme_commands(TEXT)}
    for words in [("python", "sweeps/scaling.py"), ("flatlm", "replicate"),
                  ("python", "analysis/report.py"), ("python", "analysis/replication.py"),
                  ("mlflow", "ui"), ("ray", "up")]:
        assert words in programs, words


def test_the_flatlm_command_s_help_runs_and_lists_what_the_parser_has():
    done = subprocess.run([*FLATLM, "replicate", "--help"], cwd=ROOT, env=checkout_env(),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert subcommands(flatlm_helps()[""]) == {"data", "train", "trial", "measure", "grow",
                                               "replicate", "ui", "config"}
    assert all(in_help(o, flatlm_helps()["replicate"]) for o in ("--scale", "--dry-run"))
    assert in_help("--dry-run", done.stdout)


def test_every_command_names_a_file_or_subcommand_and_only_options_it_has():
    assert readme_problems(TEXT) == []


def test_every_docs_page_is_linked_from_the_readme_and_every_link_in_them_resolves():
    linked = {t for t in LINK.findall(TEXT) if t.startswith("docs/") and t.endswith(".md")}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
    problems = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        problems += link_problems(page.read_text(), page)
    assert problems == []


def test_the_docs_pages_shell_commands_name_real_files_subcommands_and_options():
    """The pages' shell blocks too (their ``[--option]`` brackets allowed); not run."""
    problems = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for line in shell_lines(page.read_text()):
            problems += [f"{page.name}: {p}" for command in split_commands(line)
                         for p in command_problems(command)]
    assert problems == []


def ci_command(marker: str) -> str:
    """The command on the line after ``# README: <marker>`` in ``.ci/run``."""
    lines = CI.read_text().splitlines()
    return lines[lines.index(f"# README: {marker}") + 1].strip()


def shell_line_commands(text: str) -> list[str]:
    """Each shell line of the README without its trailing comment."""
    return [" ".join(shlex.split(line, comments=True)) for line in shell_lines(text)]


@pytest.mark.parametrize("marker", ["install", "test"])
def test_the_install_and_test_commands_are_the_ones_ci_runs(marker):
    command = ci_command(marker)
    assert command in {'pip install -e ".[dev]"', "ruff check . && python -m pytest"}
    shown = [line.split("#", 1)[0].strip() for line in shell_lines(TEXT)]
    assert command in shown, f"the README does not show .ci/run's {marker} command {command!r}"


def test_every_extra_the_readme_installs_exists():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    named = re.findall(r'pip install -e "\.\[([\w,-]+)\]"', TEXT)
    assert "sweep" in named and "dev" in named
    for extra in ",".join(named).split(","):
        assert extra in extras, f"pip install -e \".[{extra}]\": pyproject.toml has no such extra"


def test_the_readme_s_replicate_commands_run_as_a_dry_run(tmp_path, monkeypatch, capsys):
    """Through the command line's ``main`` in this process (a subprocess each cost 5 s of
    importing torch; ``flatlm --help`` runs as a process above)."""
    from flatlm.cli import main

    monkeypatch.chdir(ROOT)
    replicate = [c for c in readme_commands(TEXT)
                 if c.words[:2] == ("flatlm", "replicate") and "--out" in c.words]
    assert any("testbed" in c.words for c in replicate)
    for i, command in enumerate(dict.fromkeys(replicate)):
        rc = main(dry_run_words(command, tmp_path / str(i)))
        out, err = capsys.readouterr()
        assert rc == 0, (command.line, err[-2000:])
        assert re.search(r"^  \w+: \d+ trials(, about \d+ CPU-min|, CPU time unknown)",
                         out, re.M), out[-2000:]
        assert not (tmp_path / str(i)).exists()  # a dry run writes nothing


def built_sweeps(words: tuple[str, ...]) -> list:
    """The sweeps ``python sweeps/<script>.py ARGS`` would start, built and checked as its
    ``main`` builds them (every grid point's config validated), without Ray or MLflow running."""
    from flatlm.commands.replicate import add_selection_arguments
    from sweeps import cli
    from sweeps.spec import check_sweep

    module = importlib.import_module(f"sweeps.{Path(words[1]).stem}")
    if hasattr(module, "build_sweeps"):  # replicate.py: one sweep per protocol and experiment
        p = cli.parser(module.__doc__, trial_options=False)
        add_selection_arguments(p)
        sweeps = module.build_sweeps(p.parse_args(words[2:]))
    else:
        p = cli.parser(module.__doc__)
        if hasattr(module, "add_arguments"):
            module.add_arguments(p)
        args = p.parse_args(words[2:])
        cli.check_scale_and_protocol(args)
        cli.resolve_source(args)
        sweeps = [cli.apply_arguments(module.build(args), args)]
    for sweep in sweeps:
        check_sweep(sweep)
    return sweeps


def sweep_commands(text: str) -> list[tuple[str, ...]]:
    return list(dict.fromkeys(c.words for c in readme_commands(text)
                              if c.program == "python" and c.words[1].startswith("sweeps/")))


def test_the_readme_s_sweep_commands_build_valid_sweeps():
    """What each sweep command would start (its settings, ``--set`` keys, source and name),
    built and validated: a value the sweep refuses fails here, not after Ray starts."""
    pytest.importorskip("ray")
    commands = sweep_commands(TEXT)
    assert ("python", "sweeps/scaling.py") in commands
    for words in commands:
        assert built_sweeps(words), words


def test_the_sweep_scripts_own_examples_build_valid_sweeps():
    """The examples each sweep script's ``--help`` shows, built the same way."""
    pytest.importorskip("ray")
    for script in sorted((ROOT / "sweeps").glob("*.py")):
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        examples = re.findall(r"^\s*(python sweeps/\w+\.py.*)$", doc.replace("\\\n", " "),
                              re.M)
        for line in examples:
            assert built_sweeps(tuple(shlex.split(line, comments=True))), line


def dry_run_words(command: Command, out: Path) -> list[str]:
    """The command's words with ``--dry-run``, its ``--out`` in ``out`` and the CPU as device
    (a GPU command is listed, not run)."""
    words = list(command.words[1:])
    for option, value in (("--out", str(out)), ("--device", "cpu")):
        if option in words:
            words[words.index(option) + 1] = value
    return [*words, "--dry-run"]


# -- the checker catches drift -----------------------------------------------------------------

def test_a_removed_option_a_moved_script_a_wrong_subcommand_and_a_dead_link_fail():
    drifted = """
```bash
python sweeps/scaling.py --preset paper --no-such-flag 3
python sweeps/no_such_sweep.py
flatlm replay --out repl/
flatlm replicate --scale testbed --sedes 3 --out repl/
```
See [the page](docs/no_such_page.md).
"""
    problems = "\n".join(readme_problems(drifted))
    assert "--no-such-flag is not an option of `python sweeps/scaling.py`" in problems
    # the retired --preset (issue 39) is an error naming --scale, hidden from --help: a page
    # that still writes it fails here
    assert "--preset is not an option of `python sweeps/scaling.py`" in problems
    assert "`python sweeps/no_such_sweep.py`: no such file" in problems
    assert "`flatlm ... replay` is not a subcommand" in problems
    assert "--sedes is not an option of `flatlm replicate`" in problems
    assert "link 'docs/no_such_page.md' names no file" in problems


def test_commands_are_split_at_shell_operators_and_lose_assignments_and_comments():
    line = "RAY_AUTH_MODE=token ray get-auth-token --generate   # once"
    assert split_commands(line) == [Command(("ray", "get-auth-token", "--generate"), line)]
    line = "cd ~/flatlm && python sweeps/scaling.py --address auto"
    assert [c.words[:2] for c in split_commands(line)] == [("cd", "~/flatlm"),
                                                           ("python", "sweeps/scaling.py")]
    assert Command(("flatlm", "trial", "[--scale", "tiny]", "--set=x"), "").options() == [
        "--scale", "--set"]
