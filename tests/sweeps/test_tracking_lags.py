"""MLflow down at the end of a sweep: the driver cannot end some runs, so it says so with exit
code 3 and the command that catches MLflow up (``--resume``), instead of a traceback from the
summary; the runs' rows wait in their trial directories and are sent once MLflow is back."""

import sys

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("ray")

from mlflow import MlflowClient  # noqa: E402

from flatlm.runs.trial import TrialConfig  # noqa: E402
from flatlm.storage.metrics_log import append_metrics  # noqa: E402
from flatlm.tracking.tracker import MlflowTracker, default_tracking_uri, ensure_experiment  # noqa: E402
from sweeps import (
    cli,  # noqa: E402
    delivery,  # noqa: E402
    summary,  # noqa: E402
)
from sweeps.spec import Sweep  # noqa: E402
from tests.sweeps.sweeptools import dead_uri  # noqa: E402


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

    assert delivery.finish_undelivered(trials, down, eid) == [trial.name]
    assert delivery.finish_undelivered(trials, uri, eid) == []  # MLflow is back
    (run,) = MlflowClient(uri).search_runs([eid])
    assert run.info.status == "FINISHED" and run.data.metrics == {"pretrain/loss": 2.5}
    assert delivery.finish_undelivered(trials, uri, eid) == []  # nothing sent twice


def test_the_summary_on_an_unreachable_store_is_a_message_and_exit_code_3(tmp_path, capsys,
                                                                          monkeypatch):
    sweep = Sweep(name="scaling", base=TrialConfig())
    with pytest.raises(summary.TrackingUnreachable, match="could not be read"):
        summary.summarise(sweep, tmp_path, dead_uri())
    monkeypatch.setattr(sys, "argv", ["sweeps/scaling.py", "--workdir", "w"])
    lag = delivery.TrackingIncomplete("http://h:5000", ["a", "b"])
    assert cli.tracking_lags(f"{lag}.", lag.uri) == 3
    err = capsys.readouterr().err
    assert "2 run(s) not ended (a, b)" in err and "No summary" in err
    assert "python sweeps/scaling.py --workdir w --resume" in err


def test_a_sweep_without_an_accuracy_prints_no_report_command_that_would_fail(tmp_path, capsys):
    """Issue 53: after a --quick sweep the printed Report command failed ("column
    'probe/task-6/acc_mean' not in the runs; pass --task" with --task passed)."""
    from flatlm.runs.trial import TrialConfig
    from sweeps import summary
    from sweeps.spec import Sweep

    sweep = Sweep(name="scaling", base=TrialConfig())
    summary._print_commands(sweep, tmp_path, f"sqlite:///{tmp_path}/mlflow.db", False, None,
                            accuracy=None)
    printed = capsys.readouterr().out
    assert "Report:     none: no run measured" in printed and "report.py" not in printed
    summary._print_commands(sweep, tmp_path, f"sqlite:///{tmp_path}/mlflow.db", False, None,
                            accuracy="probe/A/acc_mean")
    assert "analysis/report.py" in capsys.readouterr().out
