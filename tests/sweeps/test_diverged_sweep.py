"""A sweep with one diverging trial (lr 1000) beside a normal one, through real Ray and MLflow:
the normal trial finishes with every checkpoint measured, the diverged one ends FAILED and tagged
with its step, nothing is measured after the divergence, and the sweep exits 0 naming it."""


import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.sweeps.sweeptools import TINY, Sweep, script_env, set_args  # noqa: E402

LR_SWEEP = '''"""Two tiny trials: a sane learning rate and one that diverges."""
import sys

from sweeps.cli import main
from sweeps.rayenv import tune
from sweeps.spec import Sweep
from sweeps.experiment import base_of_args


def build(args):
    return Sweep(name="lrs", base=base_of_args(args),
                 space={"train.lr": tune.grid_search([1e-3, 1000.0])}, max_failures=1)


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
'''


@pytest.mark.slow
def test_a_diverging_trial_is_marked_and_the_others_finish(tmp_path, ray_tmpdir):
    from mlflow import MlflowClient

    script = tmp_path / "lrs.py"
    script.write_text(LR_SWEEP)
    env = script_env(ray_tmpdir)
    args = set_args({**TINY, "model": "d16-h1-l1-i32", "train.log_every": "1",
                     "train.warmup_steps": "0"})
    sweep = Sweep(args, tmp_path, env, script=script)
    rc = sweep.wait_then_clean(400, ray_tmpdir)
    assert rc == 0, sweep.tail()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("lrs").experiment_id])
    by_lr = {float(r.data.params["train.lr"]): r for r in runs}
    assert set(by_lr) == {1e-3, 1000.0}
    good, bad = by_lr[1e-3], by_lr[1000.0]
    assert good.info.status == "FINISHED" and "flatlm.diverged" not in good.data.tags
    steps = sorted(m.step for m in client.get_metric_history(good.info.run_id, "pretrain/kl"))
    assert steps == [10, 20]
    assert bad.info.status == "FAILED"
    diverged_at = int(bad.data.tags["flatlm.diverged"])
    assert diverged_at <= 10  # lr 1000 blows up within a few steps
    measured = client.get_metric_history(bad.info.run_id, "pretrain/kl")
    assert all(m.step < diverged_at for m in measured)  # nothing measured after it
    assert "diverged" in sweep.stdout + sweep.tail()
