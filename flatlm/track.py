"""MLflow tracking for one trial: the package's only MLflow import (lazily, inside functions).

One MLflow run per trial, kept across retries and resumes; every config field a param (dotted
names, ``train.lr``); the metrics of each checkpoint with the training step as MLflow step; tags
for the sweep, preset, parameter count and algorithm; figures and measurement files as artifacts.

Outage tolerance ("a tracking outage neither kills a trial nor loses a metric"):

* every metrics row is appended to ``<outbox_dir>/pending.jsonl`` *before* it is sent;
* sends are synchronous with few, short HTTP retries, so a dead server costs about a second per
  call rather than minutes; a failure is a logged warning, never an exception;
* unsent rows are re-sent on the next call, at :meth:`MlflowTracker.finish`, and by a fresh tracker
  opened on the same ``outbox_dir`` (or attached to the same ``run_id``) after a crash;
* re-sending never duplicates: MLflow metric histories are append-only, so every sent
  ``(step, key)`` is recorded in ``<outbox_dir>/sent.jsonl``, and whenever that record may be
  incomplete (after a failed send, or when attaching to an existing run) the run's history of the
  key is read once and merged in. The first value reported for a ``(step, key)`` wins.

One tracker per ``outbox_dir`` at a time. Usage from a trial (the sink matches ``run_trial``)::

    tracker = MlflowTracker(uri, out_dir, experiment_id=eid, run_id=ckpt.get("run_id"),
                            run_name=trial_name, params=cfg, tags={"sweep": "scaling", ...})
    run_trial(cfg, report=tracker.report)      # store tracker.run_id in each checkpoint
    tracker.sync_artifacts(out_dir)            # figures, metrics.jsonl, measurement JSON
    tracker.finish("FINISHED")

Local/CI stores: ``default_tracking_uri(workdir)`` (absolute sqlite path; Ray may chdir) and
:func:`ensure_experiment` called once in the driver before any trial starts (concurrent first use
of a fresh sqlite store races on its migrations).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Tag keys the analysis groups by (``analysis/runs.py`` reads the same names).
TAG_SWEEP = "sweep"
TAG_PRESET = "preset"
TAG_N_PARAMS = "n_params"
TAG_ALGORITHM = "algorithm"
TAG_REPORT = "flatlm.report"  # "1" on the analysis report's run; load_runs skips those
TAG_OUTBOX = "flatlm.outbox"  # this tracker's key: finds a run whose creation reply was lost

PENDING_FILE = "pending.jsonl"
SENT_FILE = "sent.jsonl"
STATE_FILE = "tracker.json"
OUTBOX_FILES = (PENDING_FILE, SENT_FILE, STATE_FILE)
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
ARTIFACT_PATTERNS = ("*.png", "*.pdf", "*.svg", "*.json", "*.jsonl", "*.csv", "*.md", "*.txt")
_MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limits
_MAX_PARAMS_PER_BATCH = 100
_MAX_PARAM_CHARS = 6000  # MLflow's length limits for param and tag values
_MAX_TAG_CHARS = 8000


def default_tracking_uri(workdir: str | os.PathLike) -> str:
    """``sqlite:////ABS/workdir/mlflow.db``: `mlflow ui` started in ``workdir`` shows these runs."""
    return f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"


def default_artifact_location(workdir: str | os.PathLike) -> str:
    """``ABS/workdir/mlruns``: where a local store's artifacts go (absolute: Ray may chdir)."""
    return str(Path(workdir).resolve() / "mlruns")


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created (or restored) if needed. Call it in the driver.

    For a sqlite store with no ``artifact_location`` the artifacts go beside the database
    (``<db dir>/mlruns``); for a server, ``None`` lets the server choose (``mlflow-artifacts:/``).
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    db = _sqlite_path(tracking_uri)
    if db is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
        if artifact_location is None:
            artifact_location = default_artifact_location(db.parent)
    client = MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException:  # created concurrently by someone else
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if exp.lifecycle_stage == "deleted":
        client.restore_experiment(exp.experiment_id)
    return exp.experiment_id


def find_run(tracking_uri: str, experiment_id: str, run_name: str) -> str | None:
    """The id of the newest run named ``run_name`` in the experiment, or None (also when the
    store cannot be reached: the caller then starts a new run, as it would have anyway).

    A trial restarted on a new node before Tune stored its first checkpoint has no run id; its
    name (unique per trial in a sweep) finds the run it had opened, so it keeps one run.
    """
    from mlflow import MlflowClient

    try:
        runs = MlflowClient(tracking_uri).search_runs(
            [experiment_id], filter_string=f"attributes.run_name = '{run_name}'",
            order_by=["attributes.start_time DESC"], max_results=1)
    except Exception as e:  # noqa: BLE001 - an outage must not stop the trial
        log.warning("could not look up run %r: %s", run_name, _first_line(e))
        return None
    return runs[0].info.run_id if runs else None


def flatten_params(config: Any) -> dict[str, str]:
    """A config (dataclass or nested mapping) as MLflow params: ``{"train.lr": "0.0003"}``."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        from flatlm.config import to_flat_dict

        flat = to_flat_dict(config)
    else:
        flat = _flatten_mapping(config or {})
    return {k: _param_str(v) for k, v in flat.items()}


class MlflowTracker:
    """One MLflow run for one trial, fed from a local outbox (see the module docstring).

    Args:
        tracking_uri: ``sqlite:////abs/mlflow.db`` or ``http://127.0.0.1:5000``.
        outbox_dir: a directory of this trial (its ``out_dir``): holds ``pending.jsonl`` (every
            row, written before sending), ``sent.jsonl`` (what reached MLflow) and
            ``tracker.json`` (the run id). Opening the same directory again reattaches.
        experiment_id: from :func:`ensure_experiment` in the driver (preferred).
        experiment_name: alternative to ``experiment_id``; created if missing (single process).
        run_id: reattach to this run (from the trial's checkpoint); else the outbox's run, else a
            new run.
        run_name: the run's name (the trial name).
        params: the trial config (dataclass or nested dict); each field becomes a dotted param.
        tags: e.g. ``{"sweep": ..., "preset": ..., "n_params": ..., "algorithm": ...}``.
        http_max_retries, http_backoff_factor, http_timeout_s: MLflow's HTTP retry policy, set
            process-wide through ``MLFLOW_HTTP_REQUEST_*`` (the defaults, 7 retries with factor
            2, block a call for about four minutes when the server is down).
    """

    def __init__(self, tracking_uri: str, outbox_dir: str | os.PathLike, *,
                 experiment_id: str | None = None, experiment_name: str | None = None,
                 run_id: str | None = None, run_name: str | None = None,
                 params: Any = None, tags: Mapping[str, Any] | None = None,
                 http_max_retries: int = 2, http_backoff_factor: int = 1,
                 http_timeout_s: float = 10.0):
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = str(int(http_max_retries))
        os.environ["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"] = str(int(http_backoff_factor))
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(int(http_timeout_s))
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.outbox_dir = Path(outbox_dir).resolve()
        self.outbox_dir.mkdir(parents=True, exist_ok=True)
        self._client = MlflowClient(tracking_uri)
        self._experiment_id = experiment_id
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._params = flatten_params(params)
        self._tags = {str(k): str(v) for k, v in (tags or {}).items()}

        self._state = _read_json(self.outbox_dir / STATE_FILE) or {"key": uuid.uuid4().hex}
        self._rows = _read_jsonl(self.outbox_dir / PENDING_FILE)
        self._sent: set[tuple[int, str]] = set()
        self._sent_artifacts: set[str] = set()
        for marker in _read_jsonl(self.outbox_dir / SENT_FILE):
            if "artifact" in marker:
                self._sent_artifacts.add(marker["artifact"])
            else:
                self._sent.update((int(marker["step"]), k) for k in marker["keys"])

        if run_id is not None and self._state.get("run_id") not in (None, run_id):
            self._set_aside(self._state["run_id"])
        run_id = run_id or self._state.get("run_id")
        self._state["run_id"] = run_id
        if (run_id is None and experiment_id is None and experiment_name is None):
            raise ValueError("MlflowTracker needs experiment_id, experiment_name or run_id")
        # A run this tracker creates has no history to check; an attached one may (a crash
        # between a send and its sent marker, or a resume from an older checkpoint).
        self._trust_sent = False
        self._checked_keys: set[str] = set()
        self._meta_sent = False
        self._attached = run_id is not None
        # A status an earlier finish() could not deliver: only finish(None) uses it; a resumed
        # trial is running again.
        self._undelivered_status = self._state.pop("pending_status", None)
        self._save_state()
        self._flush()

    # -- public API -------------------------------------------------------------------------

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (None only while a tracking outage delays the run's creation)."""
        return self._state.get("run_id")

    def report(self, step: int, metrics: Mapping[str, float]) -> bool:
        """The trial's sink: ``log_metrics(metrics, step)``."""
        return self.log_metrics(metrics, step)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> bool:
        """Record one checkpoint's metrics (on disk first), then send everything pending.

        Idempotent per ``(step, key)`` for this run: a value already sent is not sent again.
        Returns True when nothing is left pending; never raises for tracking failures.
        """
        values = {}
        for k, v in metrics.items():
            try:
                values[str(k)] = float(v)
            except (TypeError, ValueError):
                log.warning("metric %s=%r is not a number; not logged", k, v)
        row = {"kind": "metrics", "step": int(step), "time": _now_ms(), "metrics": values}
        self._append(PENDING_FILE, row)
        self._rows.append(row)
        return self._flush()

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> bool:
        """Upload a file or a directory (queued in the outbox; re-sent after an outage)."""
        row = {"kind": "artifact", "id": uuid.uuid4().hex, "path": str(Path(path).resolve()),
               "artifact_path": artifact_path}
        self._append(PENDING_FILE, row)
        self._rows.append(row)
        return self._flush()

    def sync_artifacts(self, directory: str | os.PathLike, artifact_path: str | None = None,
                       patterns: Iterable[str] = ARTIFACT_PATTERNS) -> bool:
        """Upload the files under ``directory`` matching ``patterns`` that are new or changed
        since the last sync (the outbox's own files are skipped)."""
        directory = Path(directory).resolve()
        synced = self._state.setdefault("synced", {})
        patterns = tuple(patterns)
        queued = False
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            rel = path.relative_to(directory)
            if path.parent == self.outbox_dir and path.name in OUTBOX_FILES:
                continue
            if not any(fnmatch.fnmatch(path.name, pat) for pat in patterns):
                continue
            stat = path.stat()
            stamp = [stat.st_mtime_ns, stat.st_size]
            if synced.get(str(path)) == stamp:
                continue
            synced[str(path)] = stamp
            parts = [p for p in (artifact_path, rel.parent.as_posix()) if p and p != "."]
            sub = "/".join(parts) or None
            row = {"kind": "artifact", "id": uuid.uuid4().hex, "path": str(path),
                   "artifact_path": sub}
            self._append(PENDING_FILE, row)
            self._rows.append(row)
            queued = True
        if queued:
            self._save_state()
        return self._flush()

    def finish(self, status: str | None = None) -> bool:
        """Send everything pending and end the run as ``FINISHED`` / ``FAILED`` / ``KILLED``.

        With ``status=None`` the status a previous ``finish`` could not deliver is used (else
        FINISHED): ``MlflowTracker(uri, outbox_dir).finish()`` re-sends a finished trial's rows.
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

    def _flush(self) -> bool:
        """Send what is pending, in order: run and its params/tags, metrics, artifacts, status."""
        try:
            self._ensure_run()
            self._send_metrics()
            self._send_artifacts()
            status = self._state.get("pending_status")
            if status is not None:
                self._client.set_terminated(self.run_id, status=status)
                self._state.pop("pending_status")
                self._save_state()
        except Exception as e:  # noqa: BLE001 - any tracking failure becomes a warning
            n = sum(len(v) for v in self._pending_metrics().values())
            log.warning("MLflow unreachable (%s: %s); %d metric values kept in %s for re-sending",
                        type(e).__name__, _first_line(e), n, self.outbox_dir / PENDING_FILE)
            return False
        return True

    def _ensure_run(self) -> None:
        if self.run_id is None:
            self._create_run()
            self._trust_sent = True
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

    def _pending_metrics(self) -> dict[int, dict[str, tuple[float, int]]]:
        """step -> key -> (value, time) for every unsent (step, key); the first report wins."""
        out: dict[int, dict[str, tuple[float, int]]] = {}
        for row in self._rows:
            if row.get("kind") != "metrics":
                continue
            step = int(row["step"])
            for key, value in row["metrics"].items():
                if (step, key) not in self._sent:
                    out.setdefault(step, {}).setdefault(key, (value, row["time"]))
        return out

    def _send_metrics(self) -> None:
        pending = self._pending_metrics()
        if not pending:
            return
        if not self._trust_sent:  # merge the run's history of each not-yet-checked key
            keys = sorted({k for d in pending.values() for k in d} - self._checked_keys)
            for key in keys:
                for s in self._logged_steps(key) & set(pending):
                    if key in pending[s]:
                        self._mark_sent(s, [key])
                self._checked_keys.add(key)
            pending = self._pending_metrics()
        for step in sorted(pending):
            items = sorted(pending[step].items())
            try:
                self._log_step(step, items)
            except Exception as e:
                # The server may have stored part of it before failing: check before re-sending.
                self._trust_sent = False
                self._checked_keys -= {k for k, _ in items}
                if not _permanent(e):
                    raise
                self._log_keys_one_by_one(step, items)
            self._mark_sent(step, [k for k, _ in items])

    def _log_step(self, step: int, items: list[tuple[str, tuple[float, int]]]) -> None:
        from mlflow.entities import Metric

        for i in range(0, len(items), _MAX_METRICS_PER_BATCH):
            batch = [Metric(k, v, t, step) for k, (v, t) in items[i:i + _MAX_METRICS_PER_BATCH]]
            self._client.log_batch(self.run_id, metrics=batch, synchronous=True)

    def _log_keys_one_by_one(self, step: int, items) -> None:
        """After MLflow rejected a batch as invalid: send each key alone; drop the bad ones."""
        for item in items:
            try:
                self._log_step(step, [item])
            except Exception as e:
                if not _permanent(e):
                    raise
                log.warning("MLflow rejected metric %s at step %d (%s); dropped", item[0], step,
                            _first_line(e))

    def _logged_steps(self, key: str) -> set[int]:
        try:
            return {m.step for m in self._client.get_metric_history(self.run_id, key)}
        except Exception as e:
            if not _permanent(e):
                raise
            return set()

    def _send_artifacts(self) -> None:
        for row in self._rows:
            if row.get("kind") != "artifact" or row["id"] in self._sent_artifacts:
                continue
            path = Path(row["path"])
            if not path.exists():
                log.warning("artifact %s no longer exists; dropped", path)
            elif path.is_dir():
                self._client.log_artifacts(self.run_id, str(path), row["artifact_path"])
            else:
                self._client.log_artifact(self.run_id, str(path), row["artifact_path"])
            self._sent_artifacts.add(row["id"])
            self._append(SENT_FILE, {"artifact": row["id"]})

    # -- files ------------------------------------------------------------------------------

    def _mark_sent(self, step: int, keys: list[str]) -> None:
        self._sent.update((step, k) for k in keys)
        self._append(SENT_FILE, {"step": step, "keys": keys})

    def _append(self, name: str, obj: dict) -> None:
        with open(self.outbox_dir / name, "a") as f:
            f.write(json.dumps(obj) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _set_aside(self, old_run_id: str) -> None:
        """This outbox belongs to another run: move its files aside and start afresh."""
        log.warning("outbox %s belongs to run %s; moved aside (*.run-%s)", self.outbox_dir,
                    old_run_id, old_run_id)
        for name in OUTBOX_FILES:
            path = self.outbox_dir / name
            if path.exists():
                os.replace(path, path.with_name(f"{name}.run-{old_run_id}"))
        self._state = {"key": uuid.uuid4().hex}
        self._rows, self._sent, self._sent_artifacts = [], set(), set()

    def _save_state(self) -> None:
        path = self.outbox_dir / STATE_FILE
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self._state, indent=1))
        os.replace(tmp, path)


# -- helpers --------------------------------------------------------------------------------

def _permanent(e: Exception) -> bool:
    """MLflow refused the request itself (bad key or value): retrying cannot help."""
    return getattr(e, "error_code", None) == "INVALID_PARAMETER_VALUE"


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri[len("sqlite:///"):])


def _flatten_mapping(d: Mapping, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = dataclasses.asdict(v)
        if isinstance(v, Mapping):
            out.update(_flatten_mapping(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _param_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list | tuple):
        return json.dumps(list(v), default=str)
    return str(v)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file; a torn last line (a crash mid-write) is skipped."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("skipping a torn line in %s", path)
    except FileNotFoundError:
        pass
    return rows
