"""``sweeps/replicate.py`` through real Ray and MLflow: an experiment of a protocol as a sweep
named replicate.<protocol>.<experiment>, the same trial configs as ``flatlm replicate``, and the
replication report read back from MLflow and logged to it."""


import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.experiments.fastcfg import fast_set_flags  # noqa: E402
from tests.sweeps.sweeptools import REPO, Sweep, kill_own, sweep_env  # noqa: E402


@pytest.mark.slow
def test_replicate_runs_each_experiment_as_a_sweep_and_reports_from_mlflow(tmp_path,
                                                                          ray_tmpdir):
    from mlflow import MlflowClient

    args = ["--scale", "tiny", "--experiment", "steps", "--protocol", "paper-code", "--seeds", "2",
            *fast_set_flags()]
    sweep = Sweep(args, tmp_path, sweep_env(ray_tmpdir), script=REPO / "sweeps" / "replicate.py")
    try:
        rc = sweep.wait(timeout=500)
    finally:
        kill_own(sweep.proc.pid, f"{ray_tmpdir}/")
    assert rc == 0, sweep.tail()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("replicate.paper-code.steps")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.data.params["train.seed"] for r in runs) == ["0", "1"]
    assert {r.data.params["model"] for r in runs} == {"d64-h4-l2-i256-pre"}
    assert {r.data.params["measure.label_rule"] for r in runs} == {"inside"}
    report = tmp_path / "report" / "replication"
    md = (report / "replication.md").read_text()
    assert "## Protocol `paper-code`" in md
    assert "after the loss converges, accuracy keeps rising" in md
    logged = client.get_experiment_by_name("replication")
    assert logged is not None and client.search_runs([logged.experiment_id])
