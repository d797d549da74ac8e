"""Every source sweeps: a one-trial sweep on an HMM and one on Dyck, end to end through the real
command line (``_cli.main``), real Ray and a real MLflow sqlite store.

The task the sweep shows, searches on and summarises comes from the source (its first task, as
``measure.tasks=[]`` measures all of them), never a hard-coded PCFG task.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sweeptools (any --import-mode)
pytest.importorskip("ray")
pytest.importorskip("mlflow")

from sweeptools import LOOSE_RULE, REPO, TINY, Sweep, kill_own, set_args, sweep_env  # noqa: E402

from flatlm.sources import SourceSpec  # noqa: E402

STEPS = [10, 20]
ONE_TRIAL = '''"""One tiny trial of the tiny preset, on whatever source --set gives."""
import sys

from _cli import main
from _rayenv import tune
from _spec import Sweep
from presets import base_for


def build(args):
    return Sweep(name="sources", base=base_for(args.preset),
                 space={"model": tune.grid_search(["d16-h1-l1-i32"])})


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
'''


@pytest.mark.slow
@pytest.mark.parametrize(("source", "task"), [
    pytest.param("hmm:seed=0,vocab=20,states=6,length=6,blocks=2", "task-1", id="hmm"),
    pytest.param("dyck:6", "g_star", id="dyck"),
])
def test_a_tiny_sweep_of_any_source_finishes_with_its_task_measured(tmp_path, ray_tmpdir,
                                                                      source, task):
    from mlflow import MlflowClient

    script = tmp_path / "one_trial.py"
    script.write_text(ONE_TRIAL)
    env = sweep_env(ray_tmpdir, PYTHONPATH=os.pathsep.join(
        [str(REPO / "sweeps"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    args = [*set_args({**TINY, "source": source, "measure.tasks": "[]"}), *LOOSE_RULE]
    sweep = Sweep(args, tmp_path, env, script=script)
    try:
        rc = sweep.wait(timeout=300)
    finally:
        kill_own(sweep.proc.pid, f"{ray_tmpdir}/")
    assert rc == 0, sweep.tail()

    accuracy = f"probe/{task}/acc_mean"
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("sources").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["source"] == str(SourceSpec(source))  # its canonical form
    for key in ("pretrain/loss", "pretrain/kl", "flat/trace_fisher", accuracy):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted(m.step for m in history) == STEPS, key
    assert 0.0 <= run.data.metrics[accuracy] <= 1.0
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "metrics.jsonl", "trial_config.json"} <= names, names
    out = sweep.stdout
    assert f" {task}/acc_mean=" in out  # the result lines show the source's task
    assert f"Correlations with downstream accuracy ({accuracy})" in out, sweep.tail()
    assert f"--task {task} " in out
