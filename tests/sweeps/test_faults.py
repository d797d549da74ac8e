"""Fault tolerance of a sweep, with real Ray and real MLflow: a node dies, the tracking server goes
away (the driver killed: tests/sweeps/test_resume_trust.py). In every case each trial ends
FINISHED with one MLflow run holding every checkpoint's metrics exactly once.

* a node killed mid-trial (``ray.cluster_utils.Cluster``, chaos from a ``tune.Callback`` in the
  driver's main thread) and the trial's local directory wiped: the trial is retried on a fresh
  node from Tune's copy of its last checkpoint (model, MLflow run id and tracker outbox);
* the ``mlflow server`` stopped after the first checkpoint result and restarted on the same store
  once a trial has ended in the outage: the trials' outboxes re-send what the outage held back,
  and the ends that could not be delivered (``sweeps.trainable.finish_trial``).
"""

from __future__ import annotations

import os
import shutil
import time
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("mlflow")

REPO = Path(__file__).resolve().parents[2]
# Ray reads this at import (ray._private.ray_constants): without it a Cluster on 127.0.0.1 dials
# the host's outbound address and hangs. _rayenv sets it (and its other Ray variables) too.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from flatlm.core.config import apply_overrides  # noqa: E402
from sweeps import (  # noqa: E402
    driver,  # noqa: E402
    scaling,  # noqa: E402
    spec,  # noqa: E402
)
from tests.sweeps.sweeptools import (  # noqa: E402
    LOOSE_RULE,
    TINY,
    MlflowServer,
    Sweep,
    assert_exactly_once,
    kill_own,
    read_metrics,
    script_env,
    set_args,
    two_trial_script,
)

if os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0":  # in case Ray was imported earlier
    ray_constants.ENABLE_RAY_CLUSTER = False

pytestmark = pytest.mark.slow


# -- a worker node killed mid-trial -----------------------------------------------------------

# The chaos callback reaches these through the module: Tune pickles its callbacks into tuner.pkl,
# and a Cluster does not pickle.
_CLUSTER: Cluster | None = None
_EVENTS: list[tuple] = []  # ("result", trial_id, step, pid, training_iteration, time) | ...


def _ppid(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2:].split()[1])


def _node_running(pid: int):
    """The Cluster's worker node whose raylet is an ancestor of ``pid``."""
    raylets = {n.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid: n
               for n in _CLUSTER.worker_nodes}
    while pid not in (None, 0, 1):
        if pid in raylets:
            return raylets[pid]
        pid = _ppid(pid)
    return None


def _wait_gone(pid: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, 9)  # a worker of the removed node (ours) that outlived its raylet


class KillNodeAfterFirstCheckpoint(tune.Callback):
    """Once Tune holds a trial's first checkpoint: hard-kill the node running that trial, wipe
    the trial's local directory (a replacement node starts with an empty disk: only Tune's
    persisted checkpoint survives) and add a fresh node.

    ``on_checkpoint``, not ``on_trial_result``: Tune registers a reported checkpoint after the
    result callbacks, through a task on the trial's actor; a node killed in between takes that
    checkpoint with it and the trial restarts from the previous one.
    """

    def on_trial_result(self, iteration, trials, trial, result, **info):
        _EVENTS.append(("result", trial.trial_id, result["step"], result["pid"],
                        result["training_iteration"], time.time()))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        if any(e[0] == "kill" for e in _EVENTS):
            return
        pid, step = trial.last_result["pid"], trial.last_result["step"]
        node = _node_running(pid)
        assert node is not None, f"no worker node runs pid {pid}"
        _CLUSTER.remove_node(node, allow_graceful=False)
        _wait_gone(pid)
        trials_dir = Path(trial.config["sweep"]["trials_dir"])
        (trial_dir,) = [d for d in trials_dir.iterdir() if d.name.endswith(trial.trial_id)]
        shutil.rmtree(trial_dir)
        _EVENTS.append(("kill", trial.trial_id, step, time.time()))
        _CLUSTER.add_node(num_cpus=1, node_ip_address="127.0.0.1")

    def on_trial_recover(self, iteration, trials, trial, **info):
        _EVENTS.append(("recover", trial.trial_id))

    def on_trial_error(self, iteration, trials, trial, **info):
        _EVENTS.append(("error", trial.trial_id))


def test_node_killed_mid_sweep_trials_resume_from_checkpoint(tmp_path, ray_tmpdir, monkeypatch):
    global _CLUSTER
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmpdir))  # Cluster writes ray_current_cluster there
    # The trials unpickle _trainable.trainable: the nodes' workers inherit this from the raylets
    # (Ray passes a driver's script directory to its workers, and this driver is pytest).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO / "sweeps"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    _EVENTS.clear()
    steps = [10, 200, 400]  # the kill lands in the long stretch after step 10
    base = apply_overrides(scaling.build(Namespace()).base, {
        **TINY, "train.steps": 400, "train.checkpoint_steps": steps})
    sweep = replace(scaling.build(Namespace()), base=base,
                    space={"model": tune.grid_search(["d16-h1-l1-i64", "d32-h2-l1-i128"])})

    cluster = Cluster(initialize_head=True, connect=False, head_node_args={
        "num_cpus": 0, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    _CLUSTER = cluster
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        driver.run_sweep(sweep, workdir=tmp_path, tracking_uri=None, address=cluster.address,
                          resume=False, show=spec.shown_metrics(sweep),
                          callbacks=[KillNodeAfterFirstCheckpoint()])
        assert not ray.is_initialized()
        assert cluster.head_node.remaining_processes_alive(), "ray.shutdown() hit the cluster"
    finally:
        ray.shutdown()
        _CLUSTER = None
        cluster.shutdown()
        kill_own(None, f"{ray_tmpdir}/")

    (kill,) = [e for e in _EVENTS if e[0] == "kill"]
    _, victim, killed_step, killed_at = kill
    assert killed_step == steps[0]
    assert ("recover", victim) in _EVENTS or ("error", victim) in _EVENTS, _EVENTS
    before = [e for e in _EVENTS if e[0] == "result" and e[1] == victim and e[5] <= killed_at]
    after = [e for e in _EVENTS if e[0] == "result" and e[1] == victim and e[5] > killed_at]
    assert after, f"trial {victim} reported nothing after its node was killed: {_EVENTS}"
    assert {e[3] for e in after}.isdisjoint({e[3] for e in before})  # a new process
    # The retry started from Tune's checkpoint (its local copy was wiped): it re-reports that
    # checkpoint first, and Tune's iteration count goes on (a fresh start would restart at 1).
    assert [e[2] for e in after] == steps[steps.index(killed_step):]
    assert after[0][4] > before[-1][4]

    trials_dir = tmp_path / "trials" / sweep.name
    victim_dir = next(p for p in trials_dir.iterdir() if p.name.endswith(victim))
    first = victim_dir / "checkpoints" / f"step-{killed_step}" / "model.safetensors"
    assert first.stat().st_mtime < killed_at, "the checkpoint was trained again, not restored"
    assert [r["step"] for r in read_metrics(victim_dir)] == steps
    assert_exactly_once(f"sqlite:///{tmp_path / 'mlflow.db'}", sweep.name, trials_dir, steps,
                        n_trials=2)


# -- the tracking server stopped and restarted --------------------------------------------------

def test_mlflow_server_outage_loses_and_duplicates_nothing(tmp_path, ray_tmpdir):
    """The server goes down at the first checkpoint result and stays down until a trial has
    reported its last checkpoint, so that reports, run creation and a trial's end all fall in
    the outage; then it comes back on the same store while the other trial goes on. Two trials
    (sweeps/scaling.py's first two models): each is a Ray worker importing torch."""
    steps = [10, 20, 40, 80]
    script = tmp_path / "two_trials.py"
    script.write_text(two_trial_script())
    server = MlflowServer(tmp_path / "server")
    server.start()
    sweep = None
    try:
        server.wait_healthy()
        args = [*set_args({**TINY, "train.steps": "80",
                           "train.checkpoint_steps": "[10,20,40,80]"}),
                "--cpus-per-trial", "0.5", "--tracking-uri", server.uri,
                "--workdir", str(tmp_path / "sweep"), *LOOSE_RULE]
        sweep = Sweep(args, tmp_path, script_env(ray_tmpdir),
            script=script)
        assert sweep.first_result.wait(timeout=400), sweep.tail()
        server.stop()
        in_outage = len(sweep.results())
        assert sweep.wait_for_result(steps[-1], timeout=300), sweep.tail()
        ended_in_outage = {t for t, s in sweep.results() if s == steps[-1]}
        server.start()  # same store
        server.wait_healthy()
        rc = sweep.wait(timeout=600)
        assert rc == 0, sweep.tail()
        assert in_outage < 2 * len(steps), "the sweep ended before the outage"
        assert "MLflow unreachable" in sweep.stderr  # the outage overlapped reports
        runs = assert_exactly_once(server.uri, "scaling",
                                   tmp_path / "sweep" / "trials" / "scaling", steps, n_trials=2)
        # the trials that ended while the server was down still delivered their end
        assert ended_in_outage <= {r.info.run_name.removeprefix("trainable_") for r in runs}
        assert "Per run, final checkpoint" in sweep.stdout  # the summary printed
    finally:
        if sweep is not None:
            sweep.kill()
        kill_own(None, f"{ray_tmpdir}/")
        server.stop()
