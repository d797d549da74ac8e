"""Issue 39, item 4: ``--print-config`` of ``flatlm replicate`` and the sweeps prints every trial's
resolved config, each key with the layer that set it (``flatlm.experiments.layers``, as ``flatlm
config``), and stops before any trial runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from flatlm.cli import main
from flatlm.experiments.paper import build

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(\S+)\s+= (.*?)\s+# (.+)$")
SET = ["--set", "train.steps=40", "--set", "train.checkpoint_steps=[20,40]"]


def blocks(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """trial -> key -> (value as printed, layer)."""
    out, trial = {}, None
    for line in text.splitlines():
        if line.startswith("# trial "):
            trial = line.split()[2].rstrip(";")
            out[trial] = {}
        elif (m := ROW.match(line)) and trial:
            out[trial][m.group(1)] = (m.group(2), m.group(3))
    return out


def test_replicate_prints_each_trials_config_with_its_layers_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "repl"
    assert main(["replicate", "--print-config", "--out", str(out), "--scale", "tiny",
                 "--experiment", "sizes", "--seeds", "2", *SET]) == 0
    printed = blocks(capsys.readouterr().out)
    exp = build("sizes", scale="tiny", seeds=(0, 1))
    assert list(printed) == [f"paper/sizes/{name}" for name, _ in exp.trials()]  # 3 x 2
    assert not out.exists()  # nothing ran, nothing was written
    first, last = printed["paper/sizes/d16-h1-l1-i64_seed0"], printed[
        "paper/sizes/d64-h4-l2-i256_seed1"]
    assert first["train.steps"] == ("40", "--set")
    assert first["train.checkpoint_steps"] == ("[20, 40]", "--set")
    assert first["model"] == ("d16-h1-l1-i64", "trial d16-h1-l1-i64_seed0")
    assert last["model"] == ("d64-h4-l2-i256", "scale tiny")  # the scale's model: the same
    assert last["train.seed"] == ("1", "trial d64-h4-l2-i256_seed1")
    assert first["train.seed"] == ("0", "default")  # seed 0 is the default: no layer set it
    assert first["train.lr"] == ("0.003", "scale tiny")
    assert first["measure.label_rule"] == ("span", "protocol paper")
    assert set(first) == set(last)  # every key, not only the changed ones


def test_replicate_print_config_refuses_a_bad_value_as_a_run_would(capsys):
    assert main(["replicate", "--print-config", "--out", "unused", "--experiment", "steps",
                 "--set", "train.steps=-1"]) == 2
    assert "train.steps" in capsys.readouterr().err


def test_a_sweep_prints_each_grid_points_config_without_starting_ray(tmp_path):
    done = subprocess.run([sys.executable, "sweeps/scaling.py", "--print-config", "--workdir",
                           str(tmp_path), "--scale", "tiny", *SET], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = blocks(done.stdout)
    assert list(printed) == [name for name, _ in build("sizes", scale="tiny").trials()]  # 3 x 3
    assert printed["d32-h2-l1-i128_seed2"]["model"] == ("d32-h2-l1-i128",
                                                        "trial d32-h2-l1-i128_seed2")
    assert printed["d32-h2-l1-i128_seed2"]["train.seed"] == ("2", "trial d32-h2-l1-i128_seed2")
    assert printed["d16-h1-l1-i64_seed0"]["train.steps"] == ("40", "--set")
    assert "layers: default -> scale tiny -> protocol paper -> source (the scale's) -> sweep " \
           "scaling -> --set -> trial d16-h1-l1-i64_seed0" in done.stdout
    assert list(tmp_path.iterdir()) == []  # no Ray results, no MLflow store


def test_a_searchs_drawn_keys_are_named():
    pytest.importorskip("ray")
    from argparse import Namespace

    from sweeps import search
    from sweeps.cli import config_text

    built = search.build(Namespace(objective=[], samples=None))
    text = config_text(built, built.base, None)
    assert text.startswith("# drawn per trial (shown at the base's value): train.lr, "
                           "train.beta2, train.weight_decay, train.dropout; 4 trial(s)")
    assert text.count("# trial ") == 1
