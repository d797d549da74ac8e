"""MLflow down at the end of a sweep: the driver cannot end some runs, so it says so with exit
code 3 and the command that catches MLflow up (``--resume``), instead of a traceback from the
summary; the runs' rows wait in their trial directories and are sent once MLflow is back."""

import socket
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("ray")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sweeps"))

import _cli  # noqa: E402
import _driver  # noqa: E402
import _summary  # noqa: E402
from _spec import Sweep  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from flatlm.metrics_log import append_metrics  # noqa: E402
from flatlm.track import MlflowTracker, default_tracking_uri, ensure_experiment  # noqa: E402
from flatlm.trial import TrialConfig  # noqa: E402


def dead_uri() -> str:
    """An http URI where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_runs_not_ended_at_the_end_are_named_then_ended_once_mlflow_is_back(tmp_path):
    trials = tmp_path / "trials" / "scaling"
    trial = trials / "d16_seed0_x"
    uri = default_tracking_uri(tmp_path)
    eid = ensure_experiment(uri, "scaling")
    down = dead_uri()
    tracker = MlflowTracker(down, trial, experiment_id=eid, run_name=trial.name,
                            http_max_retries=0, http_timeout_s=1)
    append_metrics(trial, 10, {"pretrain/loss": 2.5})
    assert not tracker.report(10, {"pretrain/loss": 2.5})
    assert not tracker.finish("FINISHED")  # the trial ended in the outage

    assert _driver.finish_undelivered(trials, down, eid) == [trial.name]
    assert _driver.finish_undelivered(trials, uri, eid) == []  # MLflow is back
    (run,) = MlflowClient(uri).search_runs([eid])
    assert run.info.status == "FINISHED" and run.data.metrics == {"pretrain/loss": 2.5}
    assert _driver.finish_undelivered(trials, uri, eid) == []  # nothing sent twice


def test_the_summary_on_an_unreachable_store_is_a_message_and_exit_code_3(tmp_path, capsys,
                                                                          monkeypatch):
    sweep = Sweep(name="scaling", base=TrialConfig())
    with pytest.raises(_summary.TrackingUnreachable, match="could not be read"):
        _summary.summarise(sweep, tmp_path, dead_uri())
    monkeypatch.setattr(sys, "argv", ["sweeps/scaling.py", "--workdir", "w"])
    lag = _driver.TrackingIncomplete("http://h:5000", ["a", "b"])
    assert _cli.tracking_lags(f"{lag}.", lag.uri) == 3
    err = capsys.readouterr().err
    assert "2 run(s) not ended (a, b)" in err and "No summary" in err
    assert "python sweeps/scaling.py --workdir w --resume" in err
