"""``flatlm ui`` (issue 42, item 8): a real ``mlflow ui`` started on a real store, the address
printed is the experiment's runs table in the model-training view with flatlm's saved view, and
Ctrl-C stops the server and its workers."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from flatlm.commands.ui import choose_experiment

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store(workdir: Path) -> str:
    """A sweep-like store: an experiment with one run, then a report's experiment."""
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    sweep = mlflow.create_experiment("scaling")
    with mlflow.start_run(experiment_id=sweep):
        mlflow.log_metric("pretrain/kl", 0.03, step=1)
    report = mlflow.create_experiment("scaling.report")
    with mlflow.start_run(experiment_id=report):
        mlflow.log_metric("x", 1.0)
    mlflow.set_tracking_uri("")
    return sweep


@pytest.mark.slow
def test_flatlm_ui_serves_the_store_and_prints_the_runs_table_address(tmp_path):
    sweep_id = _store(tmp_path)
    port = _free_port()
    ui = subprocess.Popen([sys.executable, "-m", "flatlm", "ui", "--workdir", str(tmp_path),
                           "--experiment", "scaling", "--port", str(port), "--no-browser"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        lines = []
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not any("/#/experiments/" in x for x in lines):
            line = ui.stdout.readline()
            if not line:
                break
            lines.append(line)
        address = next(x for x in lines if "/#/experiments/" in x).split(": ", 1)[1].strip()
        assert address == (f"http://127.0.0.1:{port}/#/experiments/{sweep_id}/runs?"
                           "workflowType=machine_learning&viewStateShareKey=flatlm")
        with urllib.request.urlopen(address.split("#")[0], timeout=30) as page:
            assert page.status == 200
    finally:
        ui.send_signal(signal.SIGINT)  # as Ctrl-C, though xdist's workers ignore SIGINT
        code = ui.wait(timeout=120)
    assert code == 0
    with socket.socket() as probe:  # the server and its workers are gone
        assert probe.connect_ex(("127.0.0.1", port)) != 0


def test_without_a_name_the_latest_sweep_is_chosen_and_a_missing_name_is_an_error():
    experiments = [{"experiment_id": "0", "name": "Default", "last_update_time": 99},
                   {"experiment_id": "1", "name": "scaling", "last_update_time": 5},
                   {"experiment_id": "2", "name": "steps", "last_update_time": 7},
                   {"experiment_id": "3", "name": "steps.report", "last_update_time": 9}]
    assert choose_experiment(experiments, None) == ("2", "steps")
    assert choose_experiment(experiments, "scaling") == ("1", "scaling")
    with pytest.raises(ValueError, match=re.escape("--experiment 'sizes': the store has")):
        choose_experiment(experiments, "sizes")
    with pytest.raises(ValueError, match="no sweep's experiment yet"):
        choose_experiment(experiments[:1], None)


def test_a_directory_without_a_store_is_refused_before_anything_starts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flatlm", "ui", "--workdir", str(tmp_path),
                           "--no-browser"], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ}, timeout=60)
    assert done.returncode == 2
    assert "--workdir" in done.stderr and "no mlflow.db there" in done.stderr
