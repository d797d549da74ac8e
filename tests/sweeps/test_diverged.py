"""A diverged trial ends FAILED in MLflow with the ``flatlm.diverged`` tag and a marker file the
driver lists; the trial itself returns normally (no Tune retry, the sweep goes on). Without Ray:
``sweeps.trainable.end_diverged`` and ``sweeps.delivery.report_diverged`` on a file MLflow store."""

import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")


from mlflow import MlflowClient  # noqa: E402

from flatlm.tracking.tracker import MlflowTracker, default_tracking_uri, ensure_experiment  # noqa: E402
from flatlm.train.loop import Diverged  # noqa: E402
from sweeps import (
    delivery,  # noqa: E402
    trainable,  # noqa: E402
)


def test_diverged_trial_is_tagged_failed_and_listed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FLATLM_FINISH_WAIT_S", "5")
    uri = default_tracking_uri(tmp_path)
    eid = ensure_experiment(uri, "scaling")
    trials = tmp_path / "trials" / "scaling"
    bad, good = trials / "trainable_0_00000", trials / "trainable_0_00001"
    tracker = MlflowTracker(uri, bad, experiment_id=eid, run_name=bad.name)
    tracker.report(0, {"pretrain/loss": 2.5})
    trainable.end_diverged(tracker, bad, Diverged(7, float("nan"), "is not finite"))
    finished = MlflowTracker(uri, good, experiment_id=eid, run_name=good.name)
    finished.report(10, {"pretrain/loss": 2.0})
    assert finished.finish("FINISHED")

    runs = {r.info.run_name: r for r in MlflowClient(uri).search_runs([eid])}
    assert runs[bad.name].info.status == "FAILED"
    assert runs[bad.name].data.tags[trainable.TAG_DIVERGED] == "7"
    assert runs[good.name].info.status == "FINISHED"
    assert trainable.TAG_DIVERGED not in runs[good.name].data.tags
    assert json.loads((bad / trainable.DIVERGED_FILE).read_text())["step"] == 7

    capsys.readouterr()
    assert delivery.report_diverged(trials) == [bad.name]
    out = capsys.readouterr().out
    assert f"trial {bad.name} diverged" in out and "step 7" in out and "1 trial(s) diverged" in out
