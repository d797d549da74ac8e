"""Helpers of the sweep tests: the tiny scaling sweep as a subprocess, process clean-up by
session, a real ``mlflow server`` and the exactly-once checks on an MLflow store.

Every Ray instance these tests start gets its own short ``RAY_TMPDIR`` (the ``ray_tmpdir`` fixture
in conftest.py): Ray looks for a cluster to join in ``<tmp>/ray/ray_current_cluster`` (which
``ray.cluster_utils.Cluster`` writes), so a shared ``/tmp/ray`` would let these tests and other
Ray users on the machine find each other's clusters.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from flatlm.tracking.ui import mlflow_metric_name

REPO = Path(__file__).resolve().parents[2]
SCALING = REPO / "sweeps" / "scaling.py"

# The tiny sweep: 3 trials (sweeps/scaling.py's grid over TINY_MODELS), a few seconds each. A
# batch of 32, not the scale's 256: these tests check the sweep's machinery, not what training
# reaches, and 400 steps at 256 took a minute a trial on a 2-core machine.
TINY = {"train.steps": "20", "train.checkpoint_steps": "[10,20]", "train.log_every": "5",
        "train.batch_size": "32",
        "measure.tasks": '["B"]', "measure.n_eval": "64",
        "measure.n_downstream": "60", "measure.probe.epochs": "5"}
# What every trial's MLflow run must hold once per checkpoint step (metrics.jsonl names; MLflow
# has a standard error <key>_se as se/<key>: flatlm.tracking.ui.mlflow_metric_name).
KEYS = ("pretrain/loss", "pretrain/kl", "pretrain/entropy", "flat/trace_fisher",
        "flat/trace_fisher_se", "probe/B/acc_mean")
# Tiny trials stay far from saturation (KL ~1 nat): a loose rule keeps every checkpoint in the
# closing correlation table, which the tests read.
LOOSE_RULE = ["--kl-threshold", "100"]
RESULT_LINE = re.compile(r"^\[([^\]]+)\] step (\d+):")  # _driver.OneLinePerResult


def results_of(lines: list[str]) -> list[tuple[str, int]]:
    """(trial, step) of every result line among a sweep's stdout ``lines``."""
    return [(m[1], int(m[2])) for m in map(RESULT_LINE.match, lines) if m]


def set_args(overrides: dict[str, str]) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]


def sweep_env(ray_tmpdir: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "RAY_TMPDIR": str(ray_tmpdir), "PYTHONUNBUFFERED": "1", **extra}


def script_env(ray_tmpdir: Path, **extra: str) -> dict[str, str]:
    """``sweep_env`` for a sweep script a test writes outside sweeps/ (``one_trial_script``,
    ``models_script``): sweeps/ on its PYTHONPATH, as Python puts it for the scripts there."""
    path = os.pathsep.join([str(REPO / "sweeps"), *filter(None, [os.environ.get("PYTHONPATH")])])
    return sweep_env(ray_tmpdir, PYTHONPATH=path, **extra)


# -- processes ------------------------------------------------------------------------------

def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, session id) of a process, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[3])


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def own_processes(sid: int | None, marker: str | None = None) -> list[int]:
    """Live processes of session ``sid``, or whose command line holds ``marker`` (a private temp
    directory): what one test started, never other users' processes."""
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        stat = _proc_stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        if (sid is not None and stat[1] == sid) or (marker and marker in _cmdline(pid)):
            found.append(pid)
    return found


def kill_own(sid: int | None, marker: str | None = None, timeout: float = 30) -> None:
    """SIGKILLs ``own_processes(sid, marker)`` until none is left."""
    deadline = time.monotonic() + timeout
    while pids := own_processes(sid, marker):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} survived SIGKILL")
        time.sleep(0.2)


def script_here(monkeypatch, script: Path, argv: list, cwd: Path) -> subprocess.CompletedProcess:
    """``python SCRIPT ARGV`` (a sweep script on sweeps.cli) from ``cwd``, run in this process
    (tests/inprocess.py): for a command refused before Ray starts, where a subprocess would spend
    about 5 CPU-s importing torch to print one line (the scripts' own start:
    tests/test_readme.py)."""
    import importlib.util

    from sweeps import cli
    from tests.inprocess import run_main

    spec = importlib.util.spec_from_file_location(f"sweep_script_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its build and docstring; __main__ is not run
    monkeypatch.setattr(sys, "argv", [str(script), *map(str, argv)])
    return run_main(lambda _: cli.main(module.build, module.__doc__), [], cwd=cwd)


def scaling_here(monkeypatch, argv: list, cwd: Path) -> subprocess.CompletedProcess:
    """``script_here`` of sweeps/scaling.py."""
    return script_here(monkeypatch, SCALING, argv, cwd)


def one_trial_script(doc: str, name: str, model: str) -> str:
    """The source of a sweep script (as a user writes one, on sweeps.cli) named ``name`` whose
    space is the one model ``model``, its base from the command line; ``doc``: its docstring."""
    return models_script(doc, name, [model])


def two_trial_script() -> str:
    """``models_script`` of sweeps/scaling.py's first two models, named ``scaling``: a test of a
    sweep's machinery with concurrent trials, one Ray worker fewer than the scaling sweep."""
    from flatlm.experiments.scales import TESTBED_MODELS

    return models_script("The scaling sweep's first two models.", "scaling",
                         list(TESTBED_MODELS[:2]))


def models_script(doc: str, name: str, models: list[str]) -> str:
    """``one_trial_script`` over several models, one trial each: a sweep of fewer trials than
    sweeps/scaling.py's three where a test needs concurrent trials, not the testbed's sizes
    (each trial is a Ray worker importing torch, about 7 CPU-s)."""
    return f'''"""{doc}"""
import sys

from sweeps.cli import main
from sweeps.experiment import base_of_args
from sweeps.rayenv import tune
from sweeps.spec import Sweep


def build(args):
    return Sweep(name="{name}", base=base_of_args(args),
                 space={{"model": tune.grid_search({models!r})}})


if __name__ == "__main__":
    sys.exit(main(build, __doc__))
'''


class Sweep:
    """``python sweeps/scaling.py ARGS`` (or another sweep ``script``) in its own session;
    stdout read line by line."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], script: Path = SCALING):
        self.stderr_path = cwd / f"stderr-{time.monotonic_ns()}.txt"
        self.lines: list[str] = []
        self.first_result = threading.Event()
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(script), *args], cwd=cwd, env=env,
                                         stdout=subprocess.PIPE, stderr=err, text=True,
                                         start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if RESULT_LINE.match(line):
                self.first_result.set()

    @property
    def stdout(self) -> str:
        return "".join(self.lines)

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def results(self) -> list[tuple[str, int]]:
        return results_of(self.lines)

    def wait_for_result(self, step: int, timeout: float) -> bool:
        """Waits until some trial has reported checkpoint ``step`` (False: timed out, or the
        sweep ended first)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if any(s == step for _, s in self.results()):
                return True
            time.sleep(0.2)
        return any(s == step for _, s in self.results())

    def wait(self, timeout: float) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"sweep still running after {timeout} s\n{self.tail()}") from None
        self._reader.join(timeout=10)
        return rc

    def wait_then_clean(self, timeout: float, ray_tmpdir) -> int:
        """``wait``, then SIGKILL whatever the driver's session and the Ray it started (its
        processes name ``ray_tmpdir``) left running, even where waiting failed; the exit code."""
        try:
            return self.wait(timeout=timeout)
        finally:
            kill_own(self.proc.pid, f"{ray_tmpdir}/")

    def kill(self) -> None:
        """SIGKILL to the driver's whole session (Ray's processes included)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        kill_own(self.proc.pid)
        self._reader.join(timeout=10)

    def tail(self, n: int = 4000) -> str:
        return f"--- stdout\n{self.stdout[-n:]}\n--- stderr\n{self.stderr[-n:]}"


# -- MLflow ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dead_uri() -> str:
    """An http URI where nothing listens (a port just freed)."""
    return f"http://127.0.0.1:{free_port()}"


class MlflowServer:
    """A real ``mlflow server`` on 127.0.0.1 (sqlite store, proxied artifacts), in its own
    session so that stopping it stops its helper processes too."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [str(Path(sys.executable).parent / "mlflow"), "server",
               "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
               "--artifacts-destination", str(self.root / "artifacts"),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"]
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.root / f"server-{time.monotonic_ns()}.log", "w") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"mlflow server not healthy after {timeout} s")

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        kill_own(self.proc.pid)  # the CLI's helpers outlive a SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        self.proc = None


def read_metrics(trial_dir: Path) -> list[dict]:
    path = trial_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_exactly_once(uri: str, experiment: str, trials_dir: Path, steps: list[int],
                        n_trials: int) -> list:
    """One FINISHED run per trial, each holding every checkpoint's metrics once, equal to what
    the trial measured (its ``metrics.jsonl``, itself one row per checkpoint)."""
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    assert exp is not None, f"no experiment {experiment!r} at {uri}"
    runs = client.search_runs([exp.experiment_id])
    names = sorted(r.info.run_name for r in runs)
    assert len(runs) == n_trials, f"{len(runs)} runs for {n_trials} trials: {names}"
    assert len(set(names)) == n_trials, f"two runs for one trial: {names}"
    assert sorted(p.name for p in trials_dir.iterdir() if p.is_dir()) == names
    for run in runs:
        name = run.info.run_name
        assert run.info.status == "FINISHED", f"{name}: {run.info.status}"
        rows = read_metrics(trials_dir / name)
        assert [r["step"] for r in rows] == steps, f"{name}: metrics.jsonl steps"
        measured = {r["step"]: r for r in rows}
        for key in KEYS:
            history = client.get_metric_history(run.info.run_id, mlflow_metric_name(key))
            got = sorted((m.step, m.value) for m in history)
            assert [s for s, _ in got] == steps, f"{name} {key}: steps {[s for s, _ in got]}"
            for step, value in got:
                assert value == pytest.approx(measured[step][key], rel=1e-6), (name, key, step)
    return runs
