"""Issue 52, item 3: every numeric command-line flag goes through one checked parser
(``flatlm.core.flags.number_flag``), so that a value that is not finite or out of range is refused
before any work, naming the flag and what to give (``flatlm replicate --minutes nan`` ran every
trial, exit 0)."""

import ast
import sys
from pathlib import Path

import pytest

from flatlm.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _bare_numeric_flags(path: Path) -> list[str]:
    """``path:line --flag`` of every ``add_argument(..., type=int|float)`` in ``path``.

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "m.py"
    >>> _ = f.write_text("p.add_argument('--n', type=int)\\np.add_argument('--x', type=X)\\n")
    >>> [s.split(" ")[1] for s in _bare_numeric_flags(f)]
    ['--n']
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        kind = next((k.value for k in node.keywords if k.arg == "type"), None)
        if isinstance(kind, ast.Name) and kind.id in ("int", "float"):
            flag = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) \
                else "?"
            found.append(f"{path}:{node.lineno} {flag}")
    return found


def test_no_numeric_flag_is_parsed_unchecked():
    """The commands, the sweep scripts, the analysis scripts and the programs beside the library
    (``apps``): no bare ``type=int`` or ``type=float`` (those take nan, inf and any sign)."""
    files = [f for d in ("flatlm", "sweeps", "analysis", "apps")
             for f in sorted((ROOT / d).rglob("*.py"))]
    bare = [hit for f in files for hit in _bare_numeric_flags(f)]
    assert not bare, "use flatlm.core.flags.number_flag: " + ", ".join(bare)


@pytest.mark.parametrize("flag, value, says", [
    ("--minutes", "nan", "argument --minutes: 'nan' is not finite: give a number > 0"),
    ("--minutes", "-5", "argument --minutes: -5.0 is out of range: give a number > 0"),
    ("--minutes", "1e1000", "argument --minutes: '1e1000' is not finite"),
    ("--jobs", "0", "argument --jobs: 0 is out of range: give a whole number >= 1"),
    ("--pack", "inf", "argument --pack: 'inf' is not a whole number: give a whole number >= 1"),
    ("--seeds", "-1", "argument --seeds: -1 is out of range"),
])
def test_replicate_refuses_a_bad_number_before_any_trial(tmp_path, capsys, flag, value, says):
    out = tmp_path / "r"
    with pytest.raises(SystemExit) as e:
        main(["replicate", "--out", str(out), "--scale", "tiny", "--experiment", "steps",
              flag, value])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("argv, says", [
    (["measure", "ckpt", "--n-eval", "0"], "argument --n-eval: 0 is out of range"),
    (["data", "entropy", "dyck:6", "--n", "nan"], "argument --n: 'nan' is not a whole number"),
    (["grow", "ckpt", "--to", "d32-h1-l1-i64", "--out", "o", "--check", "-1"],
     "argument --check: -1 is out of range: give a whole number >= 0 (0: no check)"),
    (["ui", "--port", "70000"], "argument --port: 70000 is out of range: give a whole number "
                                "from 1 to 65535"),
])
def test_the_other_commands_refuse_a_bad_number(capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("script, argv, says", [
    ("analysis.report", ["--trials", "t", "--out", "o", "--kl-threshold", "nan"],
     "argument --kl-threshold: 'nan' is not finite: give a number > 0"),
    ("analysis.replication", ["--trials", "t", "--out", "o", "--n-boot", "0"],
     "argument --n-boot: 0 is out of range"),
    ("sweeps.scaling", ["--max-failures", "-1"],
     "argument --max-failures: -1 is out of range: give a whole number >= 0 (Ray reads a "
     "negative one as unlimited retries)"),
])
def test_the_scripts_refuse_a_bad_number(monkeypatch, capsys, script, argv, says):
    import importlib

    module = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script.replace('.', '/')}.py", *argv])
    with pytest.raises(SystemExit) as e:
        if hasattr(module, "parse_args"):  # the analysis scripts
            module.parse_args(argv)
        else:  # a sweep script: its main reads sys.argv
            from sweeps.cli import main as sweep_main

            sweep_main(module.build, module.__doc__)
    assert e.value.code == 2 and says in capsys.readouterr().err
