"""The sweep's contact with MLflow outside the trials: the store reached before Ray starts, and
after ``fit`` the runs ended that their trials could not end (killed, diverged, undelivered)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from flatlm.storage.diverged import DIVERGED_FILE, divergence
from flatlm.tracking.ledger import STATE_FILE, read_state
from flatlm.tracking.reader import StoreReader
from flatlm.tracking.tracker import (
    MlflowTracker,
    store_lock,
)


class TrackingIncomplete(Exception):  # noqa: N818 - the sweep ran; its tracking lags
    """Every trial ran, but MLflow could not be reached to end some runs: their rows and status
    wait in the trial directories (``flatlm.tracking.tracker``'s outbox) until a ``--resume``."""

    def __init__(self, uri: str, trials: list[str]):
        super().__init__(f"MLflow at {uri} unreachable at the end of the sweep: {len(trials)} "
                         f"run(s) not ended ({', '.join(trials)}); their metrics are safe in "
                         "their trial directories")
        self.uri, self.trials = uri, trials


def reach_tracking(uri: str, name: str) -> None:
    """An unreachable store is an error naming the fix before Ray starts (with a few quick
    retries, not MLflow's minutes of back-off). Creates nothing in the store but its schema."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
             "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update(quick)
    try:
        with store_lock(uri):  # the store's first contact creates its tables
            StoreReader(uri).experiment(name)
    except Exception as e:  # noqa: BLE001 - any failure to reach the store
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise ValueError(f"MLflow tracking store {uri} is unreachable ({first}); start it "
                         "(mlflow server --host 127.0.0.1 --port 5000, or `ray attach` the "
                         "cluster with -p 5000) or pass another --tracking-uri") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def mark_killed(trials_dir: Path, uri: str) -> list[str]:
    """Ends as KILLED the MLflow runs of trials that had not finished (their runs would stay
    RUNNING, or FAILED when Ctrl-C reached the workers too); a resumed trial reopens its run.
    Returns the trials' names."""
    store, killed = StoreReader(uri), []
    for out_dir in sorted(p for p in trials_dir.glob("*") if p.is_dir()):
        run_id = (read_state(out_dir) or {}).get("run_id")
        if (run_id is None or divergence(out_dir) is not None
                or store.run_status(run_id) == "FINISHED"):
            continue
        if MlflowTracker(uri, out_dir, run_id=run_id).finish("KILLED"):
            killed.append(out_dir.name)
    return killed


def report_diverged(trials_dir: Path) -> list[str]:
    """Prints the trials that diverged (they end normally for Tune, FAILED in MLflow); returns
    their names."""
    names = []
    for marker in sorted(trials_dir.glob(f"*/{DIVERGED_FILE}")):
        message = (divergence(marker.parent) or {}).get("message", "diverged")
        names.append(marker.parent.name)
        print(f"trial {marker.parent.name} diverged, not measured after it: {message}",
              flush=True)
    if names:
        print(f"{len(names)} trial(s) diverged: {', '.join(names)}", flush=True)
    return names


def finish_undelivered(trials_dir: Path, uri: str, experiment_id: str) -> list[str]:
    """Ends the runs whose trials could not deliver their end (or last rows) to MLflow; returns
    the trials whose runs are still not ended (MLflow unreachable)."""
    pending = []
    for state_file in sorted(trials_dir.glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if state.get("pending_status"):
            out_dir = state_file.parent
            tracker = MlflowTracker(uri, out_dir, experiment_id=experiment_id,
                                    run_name=out_dir.name)
            if not tracker.finish():
                pending.append(out_dir.name)
    return pending
