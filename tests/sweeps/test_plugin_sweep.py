"""A plug-in named once reaches every process: the four toy assets (a source, an algorithm, a
measurement and an architecture, each a module that registers itself when imported) named by
``--plugin`` on a sweep's command line only, then trained and measured in a real local Ray
worker, which imports them because the sweep carries the list in its trials' config
(``sweeps.driver``: ``sweep_info["plugins"]``; ``sweeps.trainable`` loads it first).

The toy measurement's own setting travels too: ``--set measure.param_norm.p=1`` (its section,
declared by the plug-in, no ``MeasureConfig`` field) reaches the worker, is saved in the trial's
config.json, and the worker records the L1 norm of each checkpoint instead of the default L2.

Without the ``--plugin`` flags the same command fails before Ray starts, naming the unknown
source kind and how to add one: the workers know the toys only through the flags.
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.commands.test_plugin_cli import checkpoint_norms  # noqa: E402
from tests.sweeps.sweeptools import LOOSE_RULE, REPO, Sweep, one_trial_script, set_args, sweep_env  # noqa: E402

PLUGINS = ("tests.assets.toy_source", "tests.assets.toy_algorithm",
           "tests.assets.toy_measurement", "tests.assets.toy_architecture")
ONE_TRIAL = one_trial_script("One trial of the toy model on the toy source.",
                             "plugins", "toy-d16-l1")
# every key a plug-in's: its source, its algorithm, its measurement (and the model, in the space)
TOY_TRIAL = {"train.algorithm": "sign_sgd", "train.steps": "4", "train.batch_size": "8",
             "train.checkpoint_steps": "[2,4]", "train.log_every": "2", "train.lr": "0.01",
             "train.warmup_steps": "0", "measure.what": "loss,param_norm",
             "measure.n_eval": "16", "measure.tasks": '["first"]', "measure.param_norm.p": "1"}


def _args(*plugins: str) -> list[str]:
    flags = [a for p in plugins for a in ("--plugin", p)]
    return [*flags, "--source", "uniform:5,length=3", "--name", "plugins",
            *set_args(TOY_TRIAL), *LOOSE_RULE]


def _env(ray_tmpdir) -> dict[str, str]:
    # the toys are importable from the repository, as a user's plug-in from its package; no
    # FLATLM_PLUGINS: the flags are the only place they are named
    env = sweep_env(ray_tmpdir, PYTHONPATH=str(REPO))
    env.pop("FLATLM_PLUGINS", None)
    return env


def test_without_the_plugins_the_sweep_stops_before_ray_naming_the_fix(tmp_path, ray_tmpdir):
    script = tmp_path / "one_trial.py"
    script.write_text(ONE_TRIAL)
    done = subprocess.run([sys.executable, str(script), *_args()], cwd=tmp_path,
                          env=_env(ray_tmpdir), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "source kind 'uniform' is unknown" in done.stderr
    assert "register_source in a plug-in module: --plugin MODULE" in done.stderr


@pytest.mark.slow
def test_toy_plugins_named_once_train_and_measure_in_a_ray_worker(tmp_path, ray_tmpdir):
    script = tmp_path / "one_trial.py"
    script.write_text(ONE_TRIAL)
    sweep = Sweep(_args(*PLUGINS), tmp_path, _env(ray_tmpdir), script=script)
    rc = sweep.wait_then_clean(300, ray_tmpdir)
    assert rc == 0, sweep.tail()

    [trial] = [p.parent for p in tmp_path.glob("**/metrics.jsonl")
               if (p.parent / "config.json").exists()]
    config = json.loads((trial / "config.json").read_text())
    assert config["train"]["algorithm"] == "sign_sgd" and config["model"] == "toy-d16-l1"
    assert config["source"]["kind"] == "uniform"
    assert config["measure"]["param_norm"] == {"p": 1.0}
    rows = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    measured = {row["step"]: row for row in rows if "toy/param_norm" in row}
    assert sorted(measured) == [2, 4], rows
    for row in measured.values():
        assert row["toy/param_norm"] > 0
        assert row["pretrain/entropy"] == pytest.approx(1.6094379, abs=1e-6)  # log 5: the toy's
    norms = {step: row["toy/param_norm"] for step, row in measured.items()}
    assert norms == pytest.approx(checkpoint_norms(trial, 1), rel=1e-9)  # L1, as --set asked
