"""Ctrl-C (SIGINT) and SIGTERM stop a real sweep with the shell's exit code, mark the unfinished
runs KILLED (none left RUNNING), print the exact --resume command and no summary."""

import signal

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.sweeps.sweeptools import TINY, Sweep, kill_own, set_args, sweep_env  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130)])  # SIGTERM: test below
def test_a_signal_stops_the_sweep_with_its_exit_code_and_the_resume_command(
        tmp_path, ray_tmpdir, signum, code):
    from mlflow import MlflowClient

    slow = {**TINY, "train.steps": "400", "train.checkpoint_steps": "[10,400]"}
    sweep = Sweep(set_args(slow), tmp_path, sweep_env(ray_tmpdir))
    try:
        assert sweep.first_result.wait(timeout=300), sweep.tail()
        sweep.proc.send_signal(signum)
        rc = sweep.wait(timeout=200)
    finally:
        kill_own(sweep.proc.pid, f"{ray_tmpdir}/")
    assert rc == code, sweep.tail()
    assert "--resume" in sweep.stderr and "scaling.py" in sweep.stderr
    assert "Per run, final checkpoint" not in sweep.stdout  # no partial summary
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scaling").experiment_id])
    statuses = {r.info.status for r in runs}
    assert "RUNNING" not in statuses and "KILLED" in statuses, statuses


def test_sigterm_takes_tunes_sigint_path_and_is_remembered():
    from sweeps.signals import Interrupted, sigterm_as_sigint

    seen = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with sigterm_as_sigint() as received:
            signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, old)
    assert received == [signal.SIGTERM] and seen == [signal.SIGINT]
    assert signal.getsignal(signal.SIGTERM) is not None  # restored
    assert Interrupted(signal.SIGTERM, 2, []).exit_code == 143
