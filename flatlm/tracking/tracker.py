"""MLflow tracking for one trial: the package's only MLflow import (lazily, inside functions).

One MLflow run per trial, kept across retries and resumes; every config field a param (dotted
names, ``train.lr``); the metrics of each checkpoint with the training step as MLflow step (a
standard error ``<key>_se`` as ``se/<key>``, charted apart: ``flatlm.tracking.ui``); tags for
the sweep, scale, protocol, model and algorithm (the tracker's own under ``mlflow.flatlm.``,
which the UI hides); the headline metrics' latest values rounded, as tags the runs table shows
(``display``: MLflow prints a metric with all its digits, ``flatlm.tracking.ui.display_tags``);
figures and measurement files as artifacts.

The tracker mirrors the trial directory's ``metrics.jsonl`` and its training curve
``train_log.jsonl`` (``flatlm.storage.metrics_log``) into the run; it keeps no copy of the metrics.
Outage tolerance ("a tracking outage neither kills a trial nor loses a metric"):

* what is left to send is ``metrics.jsonl`` minus the sent ledger ``sent.jsonl``
  (``flatlm.tracking.ledger``), so rows an outage held back are sent on the next call, at
  :meth:`MlflowTracker.finish`, and by a fresh tracker opened on the same trial directory (or
  attached to the same ``run_id``) after a crash;
* sends are synchronous with few, short HTTP retries, so a dead server costs about a second per
  call rather than minutes; a failure is a logged warning, never an exception;
* re-sending never duplicates: MLflow metric histories are append-only, so whenever the ledger
  may be incomplete (after a failed send, or when attaching to an existing run) the run's history
  of the key is read once and merged in. A ``(step, key)`` is sent once: its value in
  ``metrics.jsonl`` (the last row of a step) at that time.

One tracker per trial directory at a time. Usage (``report`` is a ``flatlm.runs.trial.Report``)::

    tracker = MlflowTracker(uri, out_dir, experiment_id=eid, run_id=ckpt.get("run_id"),
                            run_name=trial_name, params=cfg, tags={"sweep": "scaling", ...})
    run_trial(cfg, out_dir, tracker.report)    # store tracker.run_id in each checkpoint
    tracker.sync_artifacts(out_dir)            # figures, metrics.jsonl, measurement JSON
    tracker.finish("FINISHED")

Local/CI stores: ``default_tracking_uri(workdir)`` (absolute sqlite path; Ray may chdir) and
:func:`ensure_experiment` called once in the driver before any trial starts (concurrent first use
of a fresh sqlite store races on its migrations).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import fnmatch
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from flatlm.core.config import to_flat_dict
from flatlm.storage.metrics_log import METRICS_FILE, append_metrics, read_metrics, read_train_log
from flatlm.tracking.ledger import (
    STATE_FILE,
    TRACKER_FILES,
    Ledger,
    read_state,
    set_aside,
    write_state,
)
from flatlm.tracking.ui import HIDDEN_TAG_PREFIX, display_tags, mlflow_metric_name

log = logging.getLogger(__name__)

# Tag keys the analysis groups by (``analysis/runs.py`` reads the same names).
TAG_SWEEP = "sweep"
TAG_PRESET = "preset"  # older sweeps' tag (tiny, paper, paper-code): read, no longer written
TAG_SCALE, TAG_PROTOCOL = "scale", "protocol"  # where and how a sweep's trial ran
TAG_MODEL = "model"  # the trial's model (a preset such as bert-41m, or a shape)
TAG_ALGORITHM = "algorithm"
TAG_REPORT = "flatlm.report"  # "1" on the analysis report's run; load_runs skips those
TAG_OUTBOX = HIDDEN_TAG_PREFIX + "outbox"  # this tracker's key: finds a run whose creation
#   reply was lost (internal: the UI hides it)

# The experiment is model training (runs, metrics, charts), not GenAI (traces): the kind MLflow
# 3's own selector writes. MLflow 3.17's UI picks the view from the address instead
# (``flatlm.tracking.ui.experiment_url``); the tag says it for the versions and tools that read it.
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"

TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
ARTIFACT_PATTERNS = ("*.png", "*.pdf", "*.svg", "*.json", "*.jsonl", "*.csv", "*.md", "*.txt")
_MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_MAX_PARAMS_PER_BATCH = 100
_MAX_PARAM_CHARS = 6000  # MLflow's length limits for param and tag values
_MAX_TAG_CHARS = 8000


# user:password@ after any scheme, in any case (HTTP://, Https://, ...): the user part stops at
# the host's first "/", the password may hold anything up to the last "@".
_CREDENTIALS = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@?#]*:[^@]*@", re.IGNORECASE)


def check_tracking_uri(uri: str | None, flag: str = "--tracking-uri") -> None:
    """A password in the tracking URI would be printed and written into files (Ray's state,
    resume commands, logs): refused, without echoing the URI. MLflow reads credentials from
    ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` instead."""
    # leading / trailing blanks: MLflow strips them, so " http://u:p@host" is a password too
    if uri and _CREDENTIALS.match(uri.strip()):
        raise ValueError(f"{flag} holds a password: put the credentials in "
                         "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (MLflow reads "
                         "them) and give the URI without them")


def default_tracking_uri(workdir: str | os.PathLike) -> str:
    """``sqlite:////ABS/workdir/mlflow.db``: `mlflow ui` started in ``workdir`` shows these runs."""
    return f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"


def default_artifact_location(workdir: str | os.PathLike) -> str:
    """``ABS/workdir/mlruns``: where a local store's artifacts go (absolute: Ray may chdir)."""
    return str(Path(workdir).resolve() / "mlruns")


@contextlib.contextmanager
def store_lock(tracking_uri: str):
    """Serialises the first use of a sqlite store between processes: MLflow creates and migrates
    its tables on first contact, and two sweeps starting in one directory race on that (a
    traceback in one of them). Blocks until the other process is done; a server needs none."""
    if not tracking_uri.startswith("sqlite:///"):
        yield
        return
    db = Path(tracking_uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None, *,
                      tags: Mapping[str, str] | None = None) -> str:
    """The id of experiment ``name``, created (or restored) if needed, a model-training
    experiment (``EXPERIMENT_KIND``) with ``tags`` set (also on an existing one: a resumed
    sweep refreshes its saved view, ``flatlm.tracking.ui.runs_view_tag``). Call it in the driver.

    For a sqlite store with no ``artifact_location`` the artifacts go beside the database
    (``<db dir>/mlruns``); for a server, ``None`` lets the server choose (``mlflow-artifacts:/``).
    """
    check_tracking_uri(tracking_uri, "tracking URI")
    if tracking_uri.startswith("sqlite:///") and artifact_location is None:
        artifact_location = default_artifact_location(Path(tracking_uri[len("sqlite:///"):]).parent)
    with store_lock(tracking_uri):
        return _ensure_experiment(tracking_uri, name, artifact_location, dict(tags or {}))


def _ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None,
                       tags: dict[str, str]) -> str:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    # a fresh sqlite store logs its table creation at INFO ("Creating initial MLflow database
    # tables..."): MLflow's bookkeeping, not the sweep's; warnings still show
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location,
                                            tags={EXPERIMENT_KIND: MODEL_TRAINING, **tags})
        except MlflowException:  # created concurrently by someone else
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    for key, value in tags.items():
        client.set_experiment_tag(exp.experiment_id, key, value)
    return exp.experiment_id


def find_run(tracking_uri: str, experiment_id: str, run_name: str) -> str | None:
    """The id of the newest run named ``run_name`` in the experiment, or None (also when the
    store cannot be reached: the caller then starts a new run, as it would have anyway).

    A trial restarted on a new node before Tune stored its first checkpoint has no run id; its
    name (unique per trial in a sweep) finds the run it had opened, so it keeps one run.
    """
    from mlflow import MlflowClient

    check_tracking_uri(tracking_uri, "tracking URI")
    set_http_retries()  # a trial starting in an outage: seconds, not MLflow's four minutes
    try:
        runs = MlflowClient(tracking_uri).search_runs(
            [experiment_id], filter_string=f"attributes.run_name = '{run_name}'",
            order_by=["attributes.start_time DESC"], max_results=1)
    except Exception as e:  # noqa: BLE001 - an outage must not stop the trial
        log.warning("could not look up run %r: %s", run_name, _first_line(e))
        return None
    return runs[0].info.run_id if runs else None



def delete_tagged_runs(tracking_uri: str, experiment_id: str, tag: str, run_name: str) -> None:
    """Deletes the experiment's runs named ``run_name`` and tagged ``tag`` = "1" (a report run
    the next one replaces)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    for old in client.search_runs([experiment_id], f"tags.`{tag}` = '1'"):
        if old.info.run_name == run_name:
            client.delete_run(old.info.run_id)

# The tracker's HTTP retry policy: a dead server costs about a second per call. MLflow's own
# defaults (7 retries, back-off factor 2) block a call for about four minutes.
HTTP_MAX_RETRIES, HTTP_BACKOFF_FACTOR, HTTP_TIMEOUT_S = 2, 1, 10.0


def set_http_retries(max_retries: int = HTTP_MAX_RETRIES,
                     backoff_factor: int = HTTP_BACKOFF_FACTOR,
                     timeout_s: float = HTTP_TIMEOUT_S) -> None:
    """Sets MLflow's HTTP retry policy for this process (``MLFLOW_HTTP_REQUEST_*``, read per
    request): called before the first MLflow call of a trial, so that no call waits out
    MLflow's default back-off."""
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(max_retries))
    os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(int(backoff_factor))
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(timeout_s))


def mlflow_params(config: Any) -> dict[str, str]:
    """MLflow params: a config dataclass flattened by ``flatlm.core.config.to_flat_dict``
    (``{"train.lr": "0.0003"}``), or a flat mapping of param name -> value."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = to_flat_dict(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"params: a config dataclass or a flat dict, not {type(config).__name__}")
    nested = sorted(str(k) for k, v in config.items() if isinstance(v, Mapping))
    if nested:
        raise ValueError(f"params: {nested} hold dicts; give dotted names ({nested[0]}.x) or the "
                         "config dataclass")
    return {str(k): _param_str(v) for k, v in config.items()}


class MlflowTracker:
    """One MLflow run for one trial directory (see the module docstring).

    Args:
        tracking_uri: ``sqlite:////abs/mlflow.db`` or ``http://127.0.0.1:5000``.
        trial_dir: the trial's ``out_dir``: its ``metrics.jsonl`` is what gets sent; the tracker
            keeps its ledger ``sent.jsonl`` and state ``tracker.json`` (the run id) beside it.
            Opening the same directory again reattaches.
        experiment_id: from :func:`ensure_experiment` in the driver (preferred).
        experiment_name: alternative to ``experiment_id``; created if missing (single process).
        run_id: reattach to this run (from the trial's checkpoint); else the directory's run, else
            a new run.
        run_name: the run's name (the trial name).
        params: the trial config (dataclass) or a flat dict; see :func:`mlflow_params`.
        tags: e.g. ``{"sweep": ..., "preset": ..., "model": ..., "algorithm": ...}``.
        display: metric key -> run tag holding its latest value rounded
            (``flatlm.runs.headline.display_columns``), set whenever that value changes; kept in
            ``tracker.json``, so a tracker reopened on the directory without it keeps them.
        http_max_retries, http_backoff_factor, http_timeout_s: MLflow's HTTP retry policy, set
            process-wide through ``MLFLOW_HTTP_REQUEST_*`` (the defaults, 7 retries with factor
            2, block a call for about four minutes when the server is down).
    """

    def __init__(self, tracking_uri: str, trial_dir: str | os.PathLike, *,
                 experiment_id: str | None = None, experiment_name: str | None = None,
                 run_id: str | None = None, run_name: str | None = None,
                 params: Any = None, tags: Mapping[str, Any] | None = None,
                 display: Mapping[str, str] | None = None,
                 http_max_retries: int = HTTP_MAX_RETRIES,
                 http_backoff_factor: int = HTTP_BACKOFF_FACTOR,
                 http_timeout_s: float = HTTP_TIMEOUT_S):
        check_tracking_uri(tracking_uri, "tracking URI")
        set_http_retries(http_max_retries, http_backoff_factor, http_timeout_s)
        # MLflow prints two "View run ... at" lines per run end; a sweep prints its UI once.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.trial_dir = Path(trial_dir).resolve()
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self._client = MlflowClient(tracking_uri)
        self._experiment_id = experiment_id
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._params = mlflow_params(params)
        self._tags = {str(k): str(v) for k, v in (tags or {}).items()}

        self._state = read_state(self.trial_dir) or {"key": uuid.uuid4().hex}
        if run_id is not None and self._state.get("run_id") not in (None, run_id):
            set_aside(self.trial_dir, self._state["run_id"])
            self._state = {"key": uuid.uuid4().hex}
        self._ledger = Ledger(self.trial_dir)
        run_id = run_id or self._state.get("run_id")
        self._state["run_id"] = run_id
        if run_id is None and experiment_id is None and experiment_name is None:
            raise ValueError("MlflowTracker needs experiment_id, experiment_name or run_id")
        # A run this tracker creates has no history to check; an attached one may (a crash
        # between a send and its ledger line, or a resume from an older checkpoint).
        self._trust_ledger = False
        self._checked_keys: set[str] = set()
        self._meta_sent = False
        self._attached = run_id is not None
        # A status an earlier finish() could not deliver: only finish(None) uses it; a resumed
        # trial is running again.
        self._undelivered_status = self._state.pop("pending_status", None)
        if display is not None:
            self._state["display"] = dict(display)
        if self._attached:  # the run's tags may be newer than this state (an older checkpoint's)
            self._state.pop("display_sent", None)
        self._save_state()
        self._flush()

    # -- public API -------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None only while a tracking outage delays the run's creation)."""
        return self._state.get("run_id")

    def report(self, step: int, metrics: Mapping[str, Any], ckpt_dir: Path | None = None) -> bool:
        """A ``flatlm.runs.trial.Report``: sends what ``metrics.jsonl`` holds and the run lacks.

        ``run_trial`` has written the row before it reports; another caller's values are
        appended to ``metrics.jsonl`` here first (merged into the step's row, when that file
        does not hold them yet). Non-numbers are left out with a warning; ``ckpt_dir`` is not
        needed. Returns True when nothing is left unsent; never raises for tracking failures.
        """
        values = {}
        for key, value in metrics.items():
            try:
                values[str(key)] = float(value)
            except (TypeError, ValueError):
                log.warning("metric %s=%r is not a number; not logged", key, value)
        metric_rows = read_metrics(self.trial_dir)  # the one read of metrics.jsonl per report
        logged = metric_rows.get(int(step), {})
        if any(not _same(logged.get(k), v) for k, v in values.items()):  # the last row of a
            kept = {k: v for k, v in logged.items() if k != "step"}  # step wins: keep its keys
            append_metrics(self.trial_dir, int(step), {**kept, **values})
            metric_rows[int(step)] = {"step": int(step), **kept, **values}
        return self._flush(self._rows(metric_rows))

    def set_tag(self, key: str, value: str) -> bool:
        """Sets a tag on the trial's run now; False (a logged warning) if MLflow is unreachable."""
        try:
            self._ensure_run()
            self._client.set_tag(self.run_id, key, str(value)[:_MAX_TAG_CHARS])
            return True
        except Exception as e:  # noqa: BLE001 - a tracking outage must not fail the trial
            log.warning("MLflow: could not tag run %s with %s: %s", self.run_id, key,
                        _first_line(e))
            return False

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        """Upload a file or a directory (queued in ``tracker.json``; re-sent after an outage)."""
        self._queue_artifact(Path(path).resolve(), artifact_path)
        self._save_state()
        return self._flush()

    def sync_artifacts(self, directory: str | os.PathLike, artifact_path: str | None = None,
                       patterns: Iterable[str] = ARTIFACT_PATTERNS,
                       folders: Mapping[str, str] | None = None) -> bool:
        """Upload the files under ``directory`` matching ``patterns`` that are new or changed
        since the last sync. The tracker's own files are skipped, and so is the trial's
        ``metrics.jsonl`` (already sent as metric histories) unless ``patterns`` names it.
        ``folders`` renames top-level folders in the run's artifacts (``{"checkpoints":
        "measurements"}``: a folder named for what it holds there)."""
        directory = Path(directory).resolve()
        folders = dict(folders or {})
        synced = self._state.setdefault("synced", {})
        patterns = tuple(patterns)
        skipped = TRACKER_FILES if METRICS_FILE in patterns else (*TRACKER_FILES, METRICS_FILE)
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            if path.parent == self.trial_dir and path.name.startswith(skipped):
                continue
            if not any(fnmatch.fnmatch(path.name, pat) for pat in patterns):
                continue
            stat = path.stat()
            stamp = [stat.st_mtime_ns, stat.st_size]
            if synced.get(str(path)) == stamp:
                continue
            synced[str(path)] = stamp
            rel = path.relative_to(directory).parent.as_posix()
            top, _, rest = rel.partition("/")
            rel = "/".join(p for p in (folders.get(top, top), rest) if p)
            parts = [p for p in (artifact_path, rel) if p and p != "."]
            self._queue_artifact(path, "/".join(parts) or None)
        self._save_state()
        return self._flush()

    def finish(self, status: str | None = None) -> bool:
        """Send everything unsent and end the run as ``FINISHED`` / ``FAILED`` / ``KILLED``.

        With ``status=None`` the status a previous ``finish`` could not deliver is used (else
        FINISHED): ``MlflowTracker(uri, trial_dir).finish()`` re-sends a finished trial's rows.
        Returns True when everything, the status included, reached MLflow.
        """
        status = (status or self._undelivered_status or "FINISHED").upper()
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"status {status!r} not in {TERMINAL_STATUSES}")
        self._state["pending_status"] = status
        self._save_state()
        return self._flush()

    def __enter__(self) -> MlflowTracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("FAILED" if exc_type is not None else "FINISHED")

    # -- sending ----------------------------------------------------------------------------

    def _flush(self, rows: dict[int, dict] | None = None) -> bool:
        """Send what is unsent, in order: run and its params/tags, metrics, artifacts, status.
        ``rows``: ``_rows()`` when the caller has just read them."""
        rows = self._rows() if rows is None else rows
        try:
            self._ensure_run()
            self._send_metrics(rows)
            self._send_display(rows)
            self._send_artifacts()
            status = self._state.get("pending_status")
            if status is not None:
                self._client.set_terminated(self.run_id, status=status)
                self._state.pop("pending_status")
                self._save_state()
        except Exception as e:  # noqa: BLE001 - any tracking failure becomes a warning
            n = sum(len(v) for v in self._ledger.unsent(rows).values())
            log.warning("MLflow unreachable (%s: %s); %d metric values of %s not sent yet, "
                        "kept for re-sending", type(e).__name__, _first_line(e), n,
                        self.trial_dir / METRICS_FILE)
            return False
        return True

    def _ensure_run(self) -> None:
        if self.run_id is None:
            self._create_run()
            self._trust_ledger = True
            self._meta_sent = False
        if not self._meta_sent:
            self._send_meta()

    def _create_run(self) -> None:
        if self._experiment_id is None:
            self._experiment_id = ensure_experiment(self.tracking_uri, self._experiment_name)
        run = None
        if self._state.get("create_attempted"):  # the reply to an earlier create may be lost
            query = f"tags.`{TAG_OUTBOX}` = '{self._state['key']}'"
            found = self._client.search_runs([self._experiment_id], filter_string=query)
            run = found[0] if found else None
        if run is None:
            self._state["create_attempted"] = True
            self._save_state()
            tags = {**self._tags, TAG_OUTBOX: self._state["key"]}
            run = self._client.create_run(self._experiment_id, tags=tags, run_name=self._run_name)
        self._state["run_id"] = run.info.run_id
        self._attached = False
        self._save_state()
        log.info("MLflow run %s (%s)", run.info.run_id, self._run_name)

    def _send_meta(self) -> None:
        """Params and tags. On an attached run only params it lacks are sent: MLflow rejects a
        whole batch that would change a logged param, and a resumed trial keeps the first."""
        from mlflow.entities import Param, RunTag

        params = dict(self._params)
        if self._attached:
            existing = self._client.get_run(self.run_id).data.params
            changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
            if changed:
                log.warning("params changed since run %s began; keeping the logged values: %s",
                            self.run_id, ", ".join(changed))
            params = {k: v for k, v in params.items() if k not in existing}
        tags = dict(self._tags)
        if self._run_name is not None:
            tags["mlflow.runName"] = self._run_name
        params_ = [Param(k, v[:_MAX_PARAM_CHARS]) for k, v in params.items()]
        tags_ = [RunTag(k, v[:_MAX_TAG_CHARS]) for k, v in tags.items()]
        try:
            for i in range(0, max(len(params_), 1), _MAX_PARAMS_PER_BATCH):
                self._client.log_batch(self.run_id, params=params_[i:i + _MAX_PARAMS_PER_BATCH],
                                       tags=tags_ if i == 0 else (), synchronous=True)
        except Exception as e:
            if not _permanent(e):
                raise
            log.warning("MLflow rejected the params/tags of run %s (%s); not retried",
                        self.run_id, _first_line(e))
        if self._attached:
            self._client.update_run(self.run_id, status="RUNNING")
        self._meta_sent = True

    def _rows(self, metric_rows: dict[int, dict] | None = None) -> dict[int, dict]:
        """step -> row of ``metrics.jsonl`` (``metric_rows`` when already read) merged over the
        training curve (``train_log.jsonl``, keys ``train/*``): the outage-proof record that the
        ledger says how much of was sent."""
        rows = read_train_log(self.trial_dir)
        metric_rows = read_metrics(self.trial_dir) if metric_rows is None else metric_rows
        for step, row in metric_rows.items():
            rows[step] = {**rows.get(step, {}), **row}
        return rows

    def _send_metrics(self, rows: dict[int, dict]) -> None:
        unsent = self._ledger.unsent(rows)
        if not unsent:
            return
        if not self._trust_ledger:  # merge the run's history of each not-yet-checked key
            keys = sorted({k for d in unsent.values() for k in d} - self._checked_keys)
            for key in keys:
                for step in sorted(self._logged_steps(key) & set(unsent)):
                    if key in unsent[step]:
                        self._ledger.mark(step, [key])
                self._checked_keys.add(key)
            unsent = self._ledger.unsent(rows)
        now = int(time.time() * 1000)
        for step in sorted(unsent):
            items = sorted(unsent[step].items())
            try:
                self._log_step(step, items, now)
            except Exception as e:
                # The server may have stored part of it before failing: check before re-sending.
                self._trust_ledger = False
                self._checked_keys -= {k for k, _ in items}
                if not _permanent(e):
                    raise
                self._log_keys_one_by_one(step, items, now)
            self._ledger.mark(step, [k for k, _ in items])

    def _send_display(self, rows: dict[int, dict]) -> None:
        """The rounded columns' tags whose value changed since they were last sent (a name
        MLflow refuses is dropped with a warning: it would block the sends after it)."""
        from mlflow.entities import RunTag

        sent = self._state.setdefault("display_sent", {})
        changed = {name: value for name, value in
                   display_tags(rows, self._state.get("display", {})).items()
                   if sent.get(name) != value}
        if not changed:
            return
        try:
            self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in changed.items()],
                                   synchronous=True)
        except Exception as e:
            if not _permanent(e):
                raise
            log.warning("MLflow rejected the display tags %s of run %s (%s); not retried",
                        sorted(changed), self.run_id, _first_line(e))
        sent.update(changed)
        self._save_state()

    def _log_step(self, step: int, items: list[tuple[str, float]], now: int) -> None:
        from mlflow.entities import Metric

        for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
            batch = [Metric(mlflow_metric_name(k), v, now, step)
                     for k, v in items[i:i + _MAX_METRICS_PER_BATCH]]
            self._client.log_batch(self.run_id, metrics=batch, synchronous=True)

    def _log_keys_one_by_one(self, step: int, items, now: int) -> None:
        """After MLflow rejected a batch as invalid: send each key alone; drop the bad ones."""
        for item in items:
            try:
                self._log_step(step, [item], now)
            except Exception as e:
                if not _permanent(e):
                    raise
                log.warning("MLflow rejected metric %s at step %d (%s); dropped", item[0], step,
                            _first_line(e))

    def _logged_steps(self, key: str) -> set[int]:
        try:
            history = self._client.get_metric_history(self.run_id, mlflow_metric_name(key))
            return {m.step for m in history}
        except Exception as e:
            if not _permanent(e):
                raise
            return set()

    def _queue_artifact(self, path: Path, artifact_path: str | None) -> None:
        queue = self._state.setdefault("artifacts", [])
        if [str(path), artifact_path] not in queue:
            queue.append([str(path), artifact_path])

    def _send_artifacts(self) -> None:
        """Uploads the queued artifacts; each leaves the queue once uploaded (a crash in between
        uploads it again, which replaces the same file)."""
        queue = self._state.get("artifacts", [])
        while queue:
            path, artifact_path = Path(queue[0][0]), queue[0][1]
            if not path.exists():
                log.warning("artifact %s no longer exists; dropped", path)
            elif path.is_dir():
                self._client.log_artifacts(self.run_id, str(path), artifact_path)
            else:
                self._client.log_artifact(self.run_id, str(path), artifact_path)
            queue.pop(0)
            self._save_state()

    def _save_state(self) -> None:
        write_state(self.trial_dir, self._state)


# -- helpers --------------------------------------------------------------------------------

def _permanent(e: Exception) -> bool:
    """MLflow refused the request itself (bad key or value): retrying cannot help."""
    return getattr(e, "error_code", None) == "INVALID_PARAMETER_VALUE"


def _same(logged: Any, value: float) -> bool:
    """Whether ``metrics.jsonl`` already holds ``value`` (NaN equals NaN here)."""
    if not isinstance(logged, int | float):
        return False
    return logged == value or (logged != logged and value != value)


def _param_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list | tuple):
        return json.dumps(list(v), default=str)
    return str(v)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


__all__ = ["ARTIFACT_PATTERNS", "STATE_FILE", "TAG_ALGORITHM", "TAG_MODEL", "TAG_PRESET",
           "TAG_PROTOCOL", "TAG_SCALE",
           "TAG_REPORT", "TAG_SWEEP", "TERMINAL_STATUSES", "MlflowTracker", "check_tracking_uri",
           "default_artifact_location", "default_tracking_uri", "ensure_experiment", "find_run",
           "mlflow_params", "set_http_retries"]
