"""flatlm.tracking.tracker: one MLflow run per trial, params, metrics by step, artifacts, and
outages.

Stores are sqlite files in tmp_path, copied from one migrated template (a fresh store's first use
runs MLflow's migrations: 5-20 s here). The outage test runs a real ``mlflow server``.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient  # noqa: E402

from flatlm.tracking.tracker import (  # noqa: E402
    MlflowTracker,
    default_artifact_location,
    default_tracking_uri,
    ensure_experiment,
    mlflow_params,
)


@pytest.fixture(scope="session")
def template_db(tmp_path_factory):
    """A migrated, empty MLflow sqlite store."""
    d = tmp_path_factory.mktemp("mlflow_template")
    MlflowClient(default_tracking_uri(d)).search_experiments()
    return d / "mlflow.db"


@pytest.fixture
def store(tmp_path, template_db):
    """(tracking_uri, experiment_id) of a fresh store with experiment ``exp``."""
    shutil.copy(template_db, tmp_path / "mlflow.db")
    uri = default_tracking_uri(tmp_path)
    return uri, ensure_experiment(uri, "exp", default_artifact_location(tmp_path))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@dataclass(frozen=True)
class _Train:
    lr: float = 3e-4
    betas: tuple = (0.9, 0.98)


@dataclass(frozen=True)
class _Cfg:
    train: _Train = field(default_factory=_Train)
    seed: int = 0


# -- helpers ----------------------------------------------------------------------------------

def test_default_uri_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert default_tracking_uri("w") == f"sqlite:///{tmp_path / 'w' / 'mlflow.db'}"
    assert default_tracking_uri("w").startswith("sqlite:////")
    assert default_artifact_location("w") == str(tmp_path / "w" / "mlruns")


def test_mlflow_params_flat_dict_and_dataclass():
    assert mlflow_params({"train.lr": 0.001, "train.algo": "sam", "model.d": 32}) == {
        "train.lr": "0.001", "train.algo": "sam", "model.d": "32"}
    assert mlflow_params(_Cfg()) == {"train.lr": "0.0003", "train.betas": "[0.9, 0.98]",
                                     "seed": "0"}
    with pytest.raises(ValueError, match=r"params: \['train'\] hold dicts; give dotted names"):
        mlflow_params({"train": {"lr": 0.001}})


def test_ensure_experiment_is_idempotent(store):
    uri, eid = store
    assert ensure_experiment(uri, "exp") == eid
    # the kind MLflow 3's own selector writes for model training (runs, metrics, charts)
    tags = MlflowClient(uri).get_experiment(eid).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"


def test_ensure_experiment_sets_its_tags_also_on_an_existing_experiment(store):
    """A new experiment gets the kind and the tags; an existing one (a resumed sweep) the tags
    anew (a refreshed saved view), its kind left as it is."""
    uri, eid = store
    client = MlflowClient(uri)
    new = ensure_experiment(uri, "other", tags={"mlflow.sharedViewState.flatlm": "v1"})
    assert {k: v for k, v in client.get_experiment(new).tags.items()} == {
        "mlflow.experimentKind": "custom_model_development",
        "mlflow.sharedViewState.flatlm": "v1"}
    client.set_experiment_tag(new, "mlflow.experimentKind", "finetuning")  # the user's choice
    assert ensure_experiment(uri, "other", tags={"mlflow.sharedViewState.flatlm": "v2"}) == new
    assert client.get_experiment(new).tags == {"mlflow.experimentKind": "finetuning",
                                               "mlflow.sharedViewState.flatlm": "v2"}


# -- one run per trial ------------------------------------------------------------------------

def test_params_tags_and_metrics_by_step(store, tmp_path):
    uri, eid = store
    tags = {"sweep": "scaling", "preset": "tiny", "n_params": 12345, "algorithm": "adamw"}
    tr = MlflowTracker(uri, tmp_path / "t0", experiment_id=eid, run_name="t0",
                       params={"train.lr": 1e-3, "model.d": 32}, tags=tags)
    for step in (10, 20, 30):
        assert tr.report(step, {"pretrain/loss": 1.0 / step, "flat/trace_fisher": float(step)})
    assert tr.finish("FINISHED")

    client = MlflowClient(uri)
    run = client.get_run(tr.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "t0"
    assert run.data.params == {"train.lr": "0.001", "model.d": "32"}
    assert {k: run.data.tags[k] for k in tags} == {k: str(v) for k, v in tags.items()}
    assert history(client, tr.run_id, "pretrain/loss") == [(10, 0.1), (20, 0.05), (30, 1 / 30)]
    assert history(client, tr.run_id, "flat/trace_fisher") == [(10, 10.0), (20, 20.0), (30, 30.0)]
    rows = read_jsonl(tmp_path / "t0" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [10, 20, 30]  # every row also on disk


def test_report_as_the_trials_sink_sends_its_metrics_jsonl_once(store, tmp_path):
    """run_trial writes the row, then calls report(step, metrics, ckpt_dir): the tracker sends
    that row and writes no second copy of it (NaN included); a re-report sends nothing."""
    from flatlm.storage.metrics_log import append_metrics

    uri, eid = store
    out = tmp_path / "trial"
    tr = MlflowTracker(uri, out, experiment_id=eid)
    for step in (10, 20):
        row = {"pretrain/loss": 1.0 / step, "flat/trace_hessian": float("nan"), "note": "x"}
        append_metrics(out, step, row)
        assert tr.report(step, {k: v for k, v in row.items() if k != "note"},
                         out / "checkpoints" / f"step-{step}")
    assert tr.report(20, {"pretrain/loss": 1.0 / 20}, out)  # a resumed trial's re-report
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [10, 20]
    client = MlflowClient(uri)
    assert history(client, tr.run_id, "pretrain/loss") == [(10, 0.1), (20, 0.05)]
    assert len(client.get_metric_history(tr.run_id, "flat/trace_hessian")) == 2
    assert "note" not in client.get_run(tr.run_id).data.metrics


def test_a_report_reads_the_trials_record_once(store, tmp_path, monkeypatch):
    """Issue 22: the tracker sends what the trial reports after reading metrics.jsonl and
    train_log.jsonl once each (it read metrics.jsonl three times); what it sends is unchanged."""
    import flatlm.tracking.tracker as tracker_module
    from flatlm.storage.metrics_log import append_metrics, write_train_log

    uri, eid = store
    out = tmp_path / "trial"
    tr = MlflowTracker(uri, out, experiment_id=eid)
    reads = {"metrics": 0, "train_log": 0}

    def counted(name, real):
        def read(trial_dir):
            reads[name] += 1
            return real(trial_dir)
        return read
    monkeypatch.setattr(tracker_module, "read_metrics",
                        counted("metrics", tracker_module.read_metrics))
    monkeypatch.setattr(tracker_module, "read_train_log",
                        counted("train_log", tracker_module.read_train_log))
    write_train_log(out, [{"step": 5, "train/loss": 3.0}])
    append_metrics(out, 10, {"pretrain/loss": 2.5})
    assert tr.report(10, {"pretrain/loss": 2.5, "probe/A/acc_mean": 0.7})  # one key new here
    assert reads == {"metrics": 1, "train_log": 1}
    client = MlflowClient(uri)
    assert history(client, tr.run_id, "pretrain/loss") == [(10, 2.5)]
    assert history(client, tr.run_id, "probe/A/acc_mean") == [(10, 0.7)]
    assert history(client, tr.run_id, "train/loss") == [(5, 3.0)]
    assert read_jsonl(out / "metrics.jsonl")[-1] == {"step": 10, "pretrain/loss": 2.5,
                                                     "probe/A/acc_mean": 0.7}


def test_the_training_curve_is_sent_at_its_own_steps(store, tmp_path):
    """train_log.jsonl (rewritten whole at every checkpoint) is mirrored like metrics.jsonl:
    each (step, key) once, the curve's steps between the checkpoints included."""
    from flatlm.storage.metrics_log import append_metrics, write_train_log

    uri, eid = store
    out = tmp_path / "trial"
    tr = MlflowTracker(uri, out, experiment_id=eid)
    curve = [{"step": s, "train/loss": 3.0 - s / 10, "train/lr": 1e-3} for s in (5, 10, 15, 20)]
    write_train_log(out, curve[:2])
    append_metrics(out, 10, {"pretrain/loss": 2.5})
    assert tr.report(10, {"pretrain/loss": 2.5})
    write_train_log(out, curve)  # the next checkpoint: the whole history again
    append_metrics(out, 20, {"pretrain/loss": 2.2})
    assert tr.report(20, {"pretrain/loss": 2.2}) and tr.finish()
    client = MlflowClient(uri)
    assert history(client, tr.run_id, "train/loss") == [(s, 3.0 - s / 10) for s in (5, 10, 15, 20)]
    assert history(client, tr.run_id, "pretrain/loss") == [(10, 2.5), (20, 2.2)]


def test_standard_errors_are_sent_under_se_and_read_back_under_their_own_names(store, tmp_path):
    """``<key>_se`` goes to MLflow as ``se/<key>`` (its own chart sections, after the
    estimates'); a tracker re-attached without its ledger finds them there and sends nothing
    twice; the analysis reading histories gets ``metrics.jsonl``'s names back."""
    from analysis.runs import load_runs

    uri, eid = store
    rows = {10: {"pretrain/kl": 0.5, "pretrain/kl_se": 0.01, "probe/A/acc_mean": 0.7,
                 "probe/A/acc_se": 0.02},
            20: {"pretrain/kl": 0.2, "pretrain/kl_se": 0.005, "probe/A/acc_mean": 0.8,
                 "probe/A/acc_se": 0.01}}
    tr = MlflowTracker(uri, tmp_path / "t", experiment_id=eid, run_name="t")
    for step, row in rows.items():
        assert tr.report(step, row)
    client = MlflowClient(uri)
    assert set(client.get_run(tr.run_id).data.metrics) == {
        "pretrain/kl", "se/pretrain/kl", "probe/A/acc_mean", "se/probe/A/acc"}
    assert history(client, tr.run_id, "se/pretrain/kl") == [(10, 0.01), (20, 0.005)]
    assert history(client, tr.run_id, "se/probe/A/acc") == [(10, 0.02), (20, 0.01)]

    (tmp_path / "t" / "sent.jsonl").unlink()  # a ledger lost: the run's histories say what is in
    again = MlflowTracker(uri, tmp_path / "t", run_id=tr.run_id)
    assert again.finish("FINISHED")
    assert history(client, tr.run_id, "se/pretrain/kl") == [(10, 0.01), (20, 0.005)]

    table = load_runs(uri, "exp", source="history")
    assert table.attrs["experiment_id"] == eid
    got = {int(r["step"]): {k: r[k] for k in rows[10]} for _, r in table.iterrows()}
    assert got == rows


def test_the_trackers_own_tags_are_hidden_in_the_ui(store, tmp_path):
    """MLflow 3.17's UI shows no run tag whose name starts with ``mlflow.`` or ``_mlflow_``
    (its ``isUserFacingTag``): every tag of a run that the caller did not give is one."""
    uri, eid = store
    given = {"sweep": "scaling", "model": "d16"}
    tr = MlflowTracker(uri, tmp_path / "t", experiment_id=eid, run_name="t", tags=given)
    assert tr.report(1, {"a": 1.0}) and tr.finish()
    tags = MlflowClient(uri).get_run(tr.run_id).data.tags
    own = {k for k in tags if k not in given}
    assert "mlflow.flatlm.outbox" in own
    assert all(k.startswith(("mlflow.", "_mlflow_")) for k in own), own


def test_the_runs_table_gets_each_headline_metric_rounded_as_a_tag(store, tmp_path):
    """The display tags hold the latest value of their metric to 4 significant digits, follow
    it from checkpoint to checkpoint, survive a reopened tracker that was not told them, and
    leave the exact metric as it was."""
    from flatlm.runs.headline import display_columns

    uri, eid = store
    columns = display_columns(("A",))
    rows = {0: {"pretrain/loss": 4.15918838978, "pretrain/kl": 0.693147180559,
                "probe/A/acc_mean": 0.5, "flat/trace_fisher": 1234.56789},
            200: {"pretrain/loss": 1.88584677435, "pretrain/kl": 0.0313406901,
                  "probe/A/acc_mean": 0.9172499999, "flat/trace_fisher": 27.0306777},
            400: {"pretrain/kl": 0.0298765432}}  # a checkpoint that measured only the KL
    tr = MlflowTracker(uri, tmp_path / "t", experiment_id=eid, run_name="t", display=columns)
    client = MlflowClient(uri)
    assert tr.report(0, rows[0])
    assert client.get_run(tr.run_id).data.tags["loss"] == "4.159"
    assert tr.report(200, rows[200]) and tr.report(400, rows[400])
    run = client.get_run(tr.run_id)
    shown = {name: run.data.tags.get(name) for name in columns.values()}
    # the latest value of each: the loss, accuracy and Tr(F) of step 200, the KL of step 400
    assert shown == {"loss": "1.886", "KL": "0.02988", "acc A": "0.9172", "Tr F": "27.03",
                     "Tr H": None}  # never measured: no column value, not "nan"
    exact = run.data.metrics
    for key, name in columns.items():
        if shown[name] is not None:
            assert float(shown[name]) == float(f"{exact[key]:.4g}")  # the metric, rounded
    assert exact["pretrain/loss"] == 1.88584677435  # the metric itself stays exact

    again = MlflowTracker(uri, tmp_path / "t", run_id=tr.run_id)  # as the driver's re-send
    assert again.report(600, {"pretrain/kl": 0.012345678}) and again.finish()
    assert client.get_run(tr.run_id).data.tags["KL"] == "0.01235"


def test_folders_renamed_in_the_runs_artifacts(store, tmp_path):
    """``folders`` names a folder in the run's artifacts for what it holds there: the
    checkpoints' measurement files under ``measurements/``, the weights on disk only."""
    uri, eid = store
    out = tmp_path / "trial"
    ckpt = out / "checkpoints" / "step-0"
    ckpt.mkdir(parents=True)
    (ckpt / "metrics.json").write_text('{"step": 0}')
    (ckpt / "model.safetensors").write_bytes(b"weights")
    (out / "trial_config.json").write_text("{}")
    tr = MlflowTracker(uri, out, experiment_id=eid)
    assert tr.sync_artifacts(out, patterns=("metrics.json", "trial_config.json"),
                             folders={"checkpoints": "measurements"})
    client = MlflowClient(uri)
    assert {f.path for f in client.list_artifacts(tr.run_id)} == {"measurements",
                                                                   "trial_config.json"}
    assert [f.path for f in client.list_artifacts(tr.run_id, "measurements/step-0")] == [
        "measurements/step-0/metrics.json"]
    tr.finish()


def test_failed_status_and_context_manager(store, tmp_path):
    uri, eid = store
    with pytest.raises(RuntimeError), MlflowTracker(uri, tmp_path / "t", experiment_id=eid) as tr:
        tr.report(1, {"pretrain/loss": 1.0})
        raise RuntimeError("trial crashed")
    assert MlflowClient(uri).get_run(tr.run_id).info.status == "FAILED"


def test_reattach_by_run_id_gives_one_run_and_no_duplicates(store, tmp_path):
    """A retry on another node: new outbox dir, run id from the checkpoint; it re-reports the
    step after its checkpoint (already sent by the dead attempt), which must not duplicate."""
    uri, eid = store
    first = MlflowTracker(uri, tmp_path / "a", experiment_id=eid, run_name="t1", params={"x": 1})
    first.report(1, {"pretrain/loss": 1.0})
    first.report(2, {"pretrain/loss": 0.5})  # crash here, no finish
    run_id = first.run_id

    retry = MlflowTracker(uri, tmp_path / "b", experiment_id=eid, run_id=run_id,
                          run_name="t1", params={"x": 1})
    assert retry.run_id == run_id
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    retry.report(2, {"pretrain/loss": 0.49})  # resumed from the step-1 checkpoint
    retry.report(3, {"pretrain/loss": 0.25})
    assert retry.finish()

    assert len(client.search_runs([eid])) == 1
    assert history(client, run_id, "pretrain/loss") == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_same_trial_dir_reattaches_and_resends_after_crash(store, tmp_path):
    """Crash after a send but before its ledger line: the fresh tracker re-sends the row of
    metrics.jsonl only where the run's history lacks it."""
    uri, eid = store
    out = tmp_path / "t"
    tr = MlflowTracker(uri, out, experiment_id=eid)
    tr.report(1, {"a": 1.0, "b": 2.0})
    tr.report(2, {"a": 3.0, "b": 4.0})
    lines = (out / "sent.jsonl").read_text().splitlines()
    (out / "sent.jsonl").write_text(lines[0] + "\n")  # lose step 2's marker
    with open(out / "metrics.jsonl", "a") as f:  # and a row that never left (plus a torn line)
        f.write(json.dumps({"step": 3, "a": 5.0}) + "\n" + '{"step": 4, "a')

    again = MlflowTracker(uri, out, experiment_id=eid)  # no run id: read from tracker.json
    assert again.run_id == tr.run_id
    again.finish()
    client = MlflowClient(uri)
    assert history(client, tr.run_id, "a") == [(1, 1.0), (2, 3.0), (3, 5.0)]
    assert history(client, tr.run_id, "b") == [(1, 2.0), (2, 4.0)]


def test_bad_input_never_blocks_the_metrics(store, tmp_path, caplog):
    """A changed param on resume, an invalid metric name and a non-number are warnings."""
    uri, eid = store
    first = MlflowTracker(uri, tmp_path / "a", experiment_id=eid, params={"lr": 0.1})
    first.report(1, {"a": 1.0})
    retry = MlflowTracker(uri, tmp_path / "b", run_id=first.run_id,
                          params={"lr": 0.2, "new": 1})  # lr changed: kept; new: added
    assert retry.report(2, {"a": 2.0, "bad key!?": 1.0, "text": "n/a"})
    assert retry.report(3, {"a": 3.0})
    client = MlflowClient(uri)
    assert client.get_run(first.run_id).data.params == {"lr": "0.1", "new": "1"}
    assert history(client, first.run_id, "a") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert "bad key!?" not in client.get_run(first.run_id).data.metrics
    warned = caplog.text
    assert "params changed" in warned and "rejected metric bad key!?" in warned
    assert "text='n/a' is not a number" in warned


def test_ledger_of_another_run_is_set_aside(store, tmp_path):
    """A trial directory tracked into another run: that run gets the directory's metrics.jsonl,
    not suppressed by the first run's ledger."""
    uri, eid = store
    one = MlflowTracker(uri, tmp_path / "t", experiment_id=eid)
    one.report(1, {"a": 1.0})
    two = MlflowTracker(uri, tmp_path / "other", experiment_id=eid)
    reused = MlflowTracker(uri, tmp_path / "t", run_id=two.run_id)  # same dir, other run
    assert reused.report(2, {"a": 2.0})
    assert history(MlflowClient(uri), two.run_id, "a") == [(1, 1.0), (2, 2.0)]
    assert history(MlflowClient(uri), one.run_id, "a") == [(1, 1.0)]
    assert (tmp_path / "t" / f"sent.jsonl.run-{one.run_id}").exists()
    assert (tmp_path / "t" / f"tracker.json.run-{one.run_id}").exists()


def test_artifacts_land(store, tmp_path, monkeypatch):
    uri, eid = store
    out = tmp_path / "trial"
    (out / "figures").mkdir(parents=True)
    (out / "measure.json").write_text('{"pretrain/loss": 1.0}')
    (out / "figures" / "curve.png").write_bytes(b"\x89PNG fake")
    (out / "model.safetensors").write_bytes(b"weights")  # not an artifact pattern
    tr = MlflowTracker(uri, out, experiment_id=eid)
    tr.log_artifact(out / "measure.json", artifact_path="explicit")
    assert tr.sync_artifacts(out)
    client = MlflowClient(uri)
    top = {f.path for f in client.list_artifacts(tr.run_id)}
    assert top == {"explicit", "figures", "measure.json"}  # no tracker files, no weights
    assert [f.path for f in client.list_artifacts(tr.run_id, "figures")] == ["figures/curve.png"]

    uploads = []
    upload = tr._client.log_artifact
    monkeypatch.setattr(tr._client, "log_artifact",
                        lambda run_id, path, dest=None: (uploads.append(path),
                                                         upload(run_id, path, dest)))
    assert tr.sync_artifacts(out)  # nothing changed: nothing uploaded
    assert uploads == []
    (out / "measure.json").write_text('{"pretrain/loss": 0.5}')
    assert tr.sync_artifacts(out)
    assert uploads == [str(out / "measure.json")]
    local = client.download_artifacts(tr.run_id, "measure.json", str(tmp_path / "dl"))
    assert json.loads(Path(local).read_text()) == {"pretrain/loss": 0.5}
    tr.finish()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_never_raises_and_keeps_rows(tmp_path):
    uri = f"http://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    tr = MlflowTracker(uri, tmp_path / "t", experiment_id="0", http_max_retries=0)
    assert tr.run_id is None  # creation deferred until the server answers
    assert tr.report(1, {"pretrain/loss": 1.0}) is False
    assert tr.finish("FINISHED") is False
    assert time.monotonic() - t0 < 30
    rows = read_jsonl(tmp_path / "t" / "metrics.jsonl")
    assert rows == [{"step": 1, "pretrain/loss": 1.0}]
    assert not (tmp_path / "t" / "sent.jsonl").exists()


# -- a real tracking server going down and coming back ----------------------------------------

def _start_server(root: Path, port: int) -> subprocess.Popen:
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    cmd = [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{root / 'server.db'}",
           "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
           "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = root / f"server-{time.monotonic_ns()}.log"
    with open(log, "w") as f:  # the child keeps its own descriptor
        proc = subprocess.Popen(["setsid", *cmd], env=env, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    _stop_server(proc)
    raise RuntimeError("mlflow server did not become healthy in 120 s")


def _stop_server(proc: subprocess.Popen) -> None:
    """Kill the whole process group (the server's helpers outlive a SIGTERM to the CLI)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=15)


@pytest.mark.slow
def test_outage_with_real_server_loses_and_duplicates_nothing(tmp_path, template_db):
    root = tmp_path / "server"
    root.mkdir()
    shutil.copy(template_db, root / "server.db")
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    proc = _start_server(root, port)
    try:
        eid = ensure_experiment(uri, "outage")
        tr = MlflowTracker(uri, tmp_path / "trial", experiment_id=eid, run_name="t",
                           params={"train.lr": 0.1})
        assert tr.report(1, {"pretrain/loss": 1.0, "pretrain/kl": 0.5})
        (tmp_path / "trial" / "fig.png").write_bytes(b"png")

        _stop_server(proc)
        for step in (2, 3):
            t0 = time.monotonic()
            row = {"pretrain/loss": 1.0 / step, "pretrain/kl": 0.5 / step}
            assert tr.report(step, row) is False
            assert time.monotonic() - t0 < 8, "a dead server must not block the trial"
        assert tr.sync_artifacts(tmp_path / "trial") is False
        late = MlflowTracker(uri, tmp_path / "late", experiment_id=eid, run_name="late")
        assert late.run_id is None

        proc = _start_server(root, port)  # same store
        assert tr.report(4, {"pretrain/loss": 0.25, "pretrain/kl": 0.125})
        assert tr.finish("FINISHED")
        assert late.finish()
        assert late.run_id is not None

        client = MlflowClient(uri)
        assert history(client, tr.run_id, "pretrain/loss") == [
            (1, 1.0), (2, 0.5), (3, 1 / 3), (4, 0.25)]
        assert history(client, tr.run_id, "pretrain/kl") == [
            (1, 0.5), (2, 0.25), (3, 0.5 / 3), (4, 0.125)]
        run = client.get_run(tr.run_id)
        assert run.info.status == "FINISHED" and run.data.params == {"train.lr": "0.1"}
        assert [f.path for f in client.list_artifacts(tr.run_id)] == ["fig.png"]
        assert len(client.search_runs([eid])) == 2
    finally:
        _stop_server(proc)


def test_first_use_of_a_fresh_store_is_serialised_between_processes(tmp_path):
    """Four drivers start on one fresh sqlite store at once: MLflow's table creation and
    migrations run once, under flatlm's lock, and every experiment is created."""
    uri = default_tracking_uri(tmp_path)
    code = ("import sys; from flatlm.tracking.tracker import ensure_experiment; "
            "print(ensure_experiment(sys.argv[1], sys.argv[2]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, f"sweep{i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-2000:] for _, err in outs]
    names = {e.name for e in MlflowClient(uri).search_experiments()}
    assert {f"sweep{i}" for i in range(4)} <= names


def test_a_fresh_store_prints_no_mlflow_info_lines(tmp_path):
    """Issue 26: a sweep's console starts with its own banner, not MLflow's table creation."""
    code = ("from flatlm.tracking.tracker import ensure_experiment, default_tracking_uri\n"
            f"ensure_experiment(default_tracking_uri({str(tmp_path)!r}), 'x')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "INFO" not in done.stderr and "Creating initial MLflow database" not in done.stderr


# ---------------------------------------------------------- the reader (flatlm.tracking.reader)


def test_the_reader_reads_what_the_tracker_wrote(store, tmp_path):
    from flatlm.tracking.reader import StoreReader

    uri, eid = store
    note = tmp_path / "note.txt"
    note.write_text("hello\n")
    with MlflowTracker(uri, tmp_path / "t", experiment_id=eid, run_name="t") as tr:
        tr.report(1, {"a": 1.0})
        tr.report(2, {"a": 2.0})
        tr.log_artifact(note)
    reader = StoreReader(uri)
    assert reader.experiment("exp").experiment_id == eid and reader.experiment("nope") is None
    assert "exp" in reader.experiment_names()
    (run,) = reader.runs(eid)
    assert (run.info.run_id, run.info.run_name) == (tr.run_id, "t")
    assert reader.runs(eid, "attributes.run_name = 'other'") == []
    assert reader.run_status(tr.run_id) == "FINISHED"
    assert sorted((m.step, m.value) for m in reader.metric_history(tr.run_id, "a")) == [
        (1, 1.0), (2, 2.0)]
    assert reader.artifact_text(tr.run_id, "note.txt") == "hello\n"
    assert reader.artifact_text(tr.run_id, "missing.txt") is None


def test_delete_tagged_runs_deletes_only_the_tagged_runs_of_that_name(store, tmp_path):
    from flatlm.tracking.reader import StoreReader
    from flatlm.tracking.tracker import delete_tagged_runs

    uri, eid = store
    for name, tags in (("report", {"flatlm.report": "1"}), ("other", {"flatlm.report": "1"}),
                       ("plain", {}), ("report", {})):
        tracker = MlflowTracker(uri, tmp_path / f"{name}{len(tags)}", experiment_id=eid,
                                run_name=name, tags=tags)
        assert tracker.finish("FINISHED")
    delete_tagged_runs(uri, eid, "flatlm.report", "report")
    left = [r.info.run_name for r in StoreReader(uri).runs(eid)]
    assert sorted(left) == ["other", "plain", "report"]  # the untagged report stays
