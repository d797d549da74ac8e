"""``flatlm trial --plugin MODULE``: the four toy assets (a source, an algorithm, a measurement and
an architecture, each a module that registers itself when imported) named on the command line,
and in ``FLATLM_PLUGINS``, run a trial of a fresh ``flatlm`` process; the same command without
them is refused before any work, naming the fix."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGINS = ("tests.assets.toy_source", "tests.assets.toy_algorithm",
           "tests.assets.toy_measurement", "tests.assets.toy_architecture")
TOY_TRIAL = ["--source", "uniform:5,length=3", "--set", "model=toy-d16-l1",
             "--set", "train.algorithm=sign_sgd", "--set", "train.steps=4",
             "--set", "train.batch_size=8", "--set", "train.checkpoint_steps=[2,4]",
             "--set", "train.warmup_steps=0", "--set", "measure.what=loss,param_norm",
             "--set", "measure.n_eval=16", "--set", "measure.tasks=first", "--no-progress"]


def _flatlm(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "FLATLM_PLUGINS"}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                          os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "flatlm", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**environ, **env})


def test_toy_plugins_run_a_trial_of_the_flatlm_command(tmp_path):
    # two named by the flag, two by the environment: both ways in one process
    flags = [a for p in PLUGINS[:2] for a in ("--plugin", p)]
    out = tmp_path / "t"
    done = _flatlm(["trial", "--out", str(out), *TOY_TRIAL, *flags], tmp_path,
                   FLATLM_PLUGINS=",".join(PLUGINS[2:]))
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["algorithm"] == "sign_sgd" and config["model"] == "toy-d16-l1"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    norms = {row["step"]: row["toy/param_norm"] for row in rows if "toy/param_norm" in row}
    assert sorted(norms) == [2, 4] and all(v > 0 for v in norms.values())


def test_without_the_plugins_the_command_names_the_fix(tmp_path):
    done = _flatlm(["trial", "--out", str(tmp_path / "t"), *TOY_TRIAL], tmp_path)
    assert done.returncode == 2
    assert "source kind 'uniform' is unknown" in done.stderr
    assert "--plugin MODULE" in done.stderr
    missing = _flatlm(["trial", "--out", "t", "--plugin", "tests.assets.no_such_toy"], tmp_path)
    assert missing.returncode == 2
    assert "plug-in 'tests.assets.no_such_toy' (--plugin, FLATLM_PLUGINS): cannot import" \
        in missing.stderr
