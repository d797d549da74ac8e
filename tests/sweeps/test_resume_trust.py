"""A sweep's drivers dying and its state tampered with, with a real local Ray and a real MLflow
store (slow): one tiny sweep of two trials (``scaling``'s first two models), its driver killed,
resumed, interrupted, resumed by pasting the printed command, then its state tampered with.

* the driver killed (SIGKILL to its session, Ray's processes with it): ``--resume`` goes on from
  the checkpoints written before the kill, a second ``--resume`` of the same sweep meanwhile is
  refused naming the running driver, and in the end each trial has one FINISHED MLflow run
  holding every checkpoint's metrics exactly once (the kill and the interrupt included);
* 9: Ctrl-C (SIGINT) stops the sweep with the shell's exit code 130, marks the unfinished runs
  KILLED (none left RUNNING), prints no summary; the interrupt message counts the unfinished
  trials, and the printed ``--resume`` command works when pasted into a shell (a ``--set`` value
  with quotes survives);
* 3: a password planted in ``MLFLOW_TRACKING_PASSWORD`` lands in none of the sweep's files nor
  Ray's session directory;
* 1: a pickle planted as the search algorithm's state (``basic-variant-state-*.json``, which Ray
  unpickles on restore; not ``tuner.pkl``) is refused before it can run (world-writable: the same
  check, tests/sweeps/test_spec.py);
  a copied sweep is refused with the command that accepts it, and that command works.
"""

from __future__ import annotations

import os
import pickle
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

from tests.sweeps.sweeptools import (  # noqa: E402
    TINY,
    Sweep,
    assert_exactly_once,
    kill_own,
    results_of,
    script_env,
    script_here,
    set_args,
    two_trial_script,
)

pytestmark = pytest.mark.slow

PASSWORD = "pw-issue27-planted-secret"
MEASURED = '["loss","fisher","probe"]'  # quotes a pasted command must keep
# Two trials (two_trial_script), not sweeps/scaling.py's three: each trial is a Ray worker
# importing torch (about 7 CPU-s) in each of the three runs that train; two are enough for
# "every trial unfinished".


class Payload:
    """A pickle whose loading runs a shell command (what a planted state file can do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def pasted(command: str, cwd: Path, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` run as a user pasting it into bash, ``python`` being this interpreter."""
    bin_dir = cwd / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = bin_dir / "python"
    if not python.exists():  # a script, not a link: a linked venv python loses its venv
        python.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        python.chmod(0o755)
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True,
                          env={**env, "PATH": f"{bin_dir}:{env['PATH']}"})


def run_statuses(work: Path) -> set[str]:
    """The statuses of the scaling sweep's MLflow runs in ``work``'s store."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("scaling").experiment_id])
    return {r.info.status for r in runs}


def printed_command(stderr: str) -> str:
    """The indented command line the driver printed last."""
    return [line.strip() for line in stderr.splitlines() if line.startswith("    python ")][-1]


def files_holding(root: Path, secret: bytes) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                if secret in path.read_bytes():
                    found.append(path)
            except OSError:
                continue
    return found


def _killed_at_first_result(args: list[str], work: Path, env: dict, ray_tmpdir: Path,
                            steps: list[int], script: Path) -> float:
    """The sweep's driver SIGKILLed (its session, Ray's processes with it) at its first result;
    the time of the kill."""
    first = Sweep(args, work, env, script=script)
    try:
        assert first.first_result.wait(timeout=400), first.tail()
        first.kill()
        killed_at = time.time()
    finally:
        first.kill()
        kill_own(None, f"{ray_tmpdir}/")
    assert first.proc.returncode == -9
    assert len(first.results()) < 2 * len(steps), "the sweep ended before the kill"
    return killed_at


def test_killed_interrupted_resumed_by_paste_and_tampered_state(tmp_path, ray_tmpdir,
                                                                monkeypatch):
    env = script_env(ray_tmpdir, MLFLOW_TRACKING_USERNAME="alice",
                     MLFLOW_TRACKING_PASSWORD=PASSWORD)
    script = tmp_path / "two_trials.py"
    script.write_text(two_trial_script())
    steps = [10, 200, 400]
    settings = {**TINY, "train.steps": "400", "train.checkpoint_steps": "[10,200,400]",
                "measure.what": MEASURED}
    args = [*set_args(settings), "--cpus-per-trial", "0.5", "--kl-threshold", "100"]
    work = tmp_path / "work"
    work.mkdir()
    killed_at = _killed_at_first_result(args, work, env, ray_tmpdir, steps, script)

    # resumed; a second driver of the same sweep meanwhile refuses, naming the first, and runs
    # nothing; then 9: interrupted at its first result, every trial unfinished, counted. The
    # refusals come before Ray starts: they run in this process (script_here)
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmpdir))
    second = Sweep([*args, "--resume"], work, env, script=script)
    try:
        assert second.first_result.wait(timeout=400), second.tail()
        third = script_here(monkeypatch, script, [*args, "--resume"], work)
        assert third.returncode == 2, third.stderr[-4000:]
        assert f"is being run by another driver (pid {second.proc.pid})" in third.stderr
        assert results_of(third.stdout.splitlines()) == []
        second.proc.send_signal(signal.SIGINT)
        rc = second.wait(timeout=300)
    finally:
        kill_own(second.proc.pid, f"{ray_tmpdir}/")
    assert rc == 130, second.tail()  # the shell's code for SIGINT
    assert "2 trial(s) unfinished" in second.stderr, second.tail()
    command = printed_command(second.stderr)
    assert shlex.split(command) == ["python", str(script), *args, "--resume"]
    assert "Per run, final checkpoint" not in second.stdout  # no partial summary
    assert run_statuses(work) >= {"KILLED"} and "RUNNING" not in run_statuses(work)

    # the printed command, pasted, finishes the sweep: every checkpoint's metrics once
    done = pasted(command, work, env)
    kill_own(None, f"{ray_tmpdir}/")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "Per run, final checkpoint" in done.stdout  # the summary printed
    trials_dir = work / "trials" / "scaling"
    assert_exactly_once(f"sqlite:///{work / 'mlflow.db'}", "scaling", trials_dir, steps,
                        n_trials=2)
    # a checkpoint written before the kill was not trained again after it
    assert [p for p in trials_dir.glob(f"*/checkpoints/step-{steps[0]}/model.safetensors")
            if p.stat().st_mtime < killed_at], "no trial had a checkpoint before the kill"

    # 3: the password in the environment reached no file of the sweep nor Ray's session
    assert files_holding(work, PASSWORD.encode()) == []
    assert files_holding(ray_tmpdir, PASSWORD.encode()) == []

    # 1: a pickle planted as the search algorithm's newest state is refused before it runs
    state = work / "ray_results" / "scaling"
    assert list(state.glob("basic-variant-state-*.json"))  # Ray keeps one: it loads the newest
    marker = tmp_path / "pwned"
    planted = state / "basic-variant-state-9999-99-99_99-99-99.json"
    planted.write_bytes(pickle.dumps(Payload(marker)))
    planted.chmod(0o600)  # world-writable: refused the same way (tests/sweeps/test_spec.py)
    again = script_here(monkeypatch, script, shlex.split(command)[2:], work)
    assert again.returncode == 2, again.stderr[-4000:]
    assert "was not written by flatlm" in again.stderr and planted.name in again.stderr
    assert not marker.exists(), "the planted pickle ran"
    planted.unlink()

    # 1: a copied sweep cannot be verified: refused, with the command that accepts it
    copy = tmp_path / "copy"
    shutil.copytree(work, copy, symlinks=True)
    refused = script_here(monkeypatch, script, [*shlex.split(command)[2:], "--workdir", copy],
                          copy)
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert "no digest of its state" in refused.stderr
    accept = printed_command(refused.stderr)
    assert accept.endswith("--resume --trust-state")
    accepted = pasted(accept, copy, env)
    kill_own(None, f"{ray_tmpdir}/")
    assert accepted.returncode == 0, accepted.stderr[-4000:]
    assert "--trust-state: resuming" in accepted.stderr
    assert not marker.exists()
