"""A trial that ends while MLflow is unreachable: its end and last rows are delivered later.

``MlflowTracker.finish`` never raises; while the server is down it returns False and keeps the
status in the trial's tracker state, its unsent rows in its metrics.jsonl.
``sweeps.trainable.finish_trial`` retries it for a bounded time inside the trial, and the driver's
``sweeps.delivery.finish_undelivered`` sends what is still pending after
``fit`` (the end-to-end case is ``test_faults.py::test_mlflow_server_outage...``).
"""

import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")


from mlflow import MlflowClient  # noqa: E402

from flatlm.tracking.tracker import MlflowTracker, default_tracking_uri, ensure_experiment  # noqa: E402
from sweeps import (
    delivery,  # noqa: E402
    trainable,  # noqa: E402
)
from tests.sweeps.sweeptools import dead_uri  # noqa: E402


def test_undelivered_end_is_sent_by_the_driver(tmp_path, capsys):
    uri = default_tracking_uri(tmp_path)
    eid = ensure_experiment(uri, "scaling")
    trials = tmp_path / "trials" / "scaling"
    out = trials / "trainable_0_00000"
    tracker = MlflowTracker(dead_uri(), out, experiment_id=eid, run_name=out.name,
                            http_max_retries=0)
    assert not tracker.report(10, {"pretrain/loss": 1.5})
    t0 = time.monotonic()
    assert not trainable.finish_trial(tracker, "FINISHED", wait_s=0.5)  # bounded: gives up
    assert time.monotonic() - t0 < 30
    assert "not ended" in capsys.readouterr().err

    done = trials / "trainable_0_00001"  # a trial whose end was delivered: left alone
    finished = MlflowTracker(uri, done, experiment_id=eid, run_name=done.name)
    finished.report(10, {"pretrain/loss": 2.0})
    assert finished.finish("FINISHED")

    delivery.finish_undelivered(trials, uri, eid)
    client = MlflowClient(uri)
    runs = {r.info.run_name: r for r in client.search_runs([eid])}
    assert sorted(runs) == [out.name, done.name]
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    history = client.get_metric_history(runs[out.name].info.run_id, "pretrain/loss")
    assert [(m.step, m.value) for m in history] == [(10, 1.5)]
    delivery.finish_undelivered(trials, uri, eid)  # nothing left to do: no second run
    assert len(client.search_runs([eid])) == 2
