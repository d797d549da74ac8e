"""Where a report reads its runs and where it logs: the tidy table from an MLflow experiment or
trial directories, the accuracy column it is about, and the report run beside the experiment.
Shared by ``report`` and ``selection`` (neither imports the other).

A library: what the user can fix (no store there, no such experiment, a password in the URI)
is a ValueError naming the fix; the scripts' ``main`` prints it as one ``error:`` line."""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from pathlib import Path

from analysis.runs import load_runs
from analysis.trials import load_trials
from flatlm.measure import probe_keys
from flatlm.tracking.reader import StoreReader
from flatlm.tracking.tracker import (
    TAG_REPORT,
    MlflowTracker,
    check_tracking_uri,
    default_tracking_uri,
    delete_tagged_runs,
    ensure_experiment,
)


def accuracy_key(columns, task: str | None) -> str:
    if task is not None:
        return task if "/" in task else probe_keys(task)[0]
    probes = sorted(c for c in columns if c.startswith("probe/") and c.endswith("/acc_mean"))
    if not probes:
        raise ValueError("no probe/<task>/acc_mean column in the runs; pass --task")
    return probes[0]


def report_experiment(experiment: str) -> str:
    """Where the report of ``experiment`` is logged: beside it, not among its runs, where
    MLflow's charts would list it (and colour it) as one more run."""
    return f"{experiment}.report"


def log_report(tracking_uri: str, experiment: str, paths, params: dict, *,
               run_name: str = "report") -> str | None:
    """The run ``run_name`` (tag ``flatlm.report=1``) of ``experiment`` holding ``paths`` as
    artifacts; an earlier run of that name there is deleted first (one report at a time)."""
    eid = ensure_experiment(tracking_uri, experiment)
    delete_tagged_runs(tracking_uri, eid, TAG_REPORT, run_name)
    with tempfile.TemporaryDirectory() as outbox:
        tracker = MlflowTracker(tracking_uri, outbox, experiment_id=eid,
                                run_name=run_name, params=params, tags={TAG_REPORT: "1"})
        for path in paths:
            tracker.log_artifact(path)
        ok = tracker.finish("FINISHED")
    if not ok:
        print("warning: MLflow unreachable; the report is only on disk", file=sys.stderr)
    return tracker.run_id


def check_store(uri: str, experiment: str) -> None:
    """A ValueError naming the fix when the store or the experiment is not there; opening a
    missing sqlite file would create an empty store instead."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise ValueError(f"no MLflow store at {uri}: run the report where the sweep ran "
                         "(its --workdir), or pass --tracking-uri")
    store = StoreReader(uri)
    if store.experiment(experiment) is None:
        names = store.experiment_names()
        close = difflib.get_close_matches(experiment, names, n=3)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise ValueError(f"no experiment {experiment!r} at {uri}; {hint}experiments "
                         f"there: {', '.join(sorted(names)) or 'none'}")


def refuse_password(uri: str) -> None:
    """A ValueError, which does not echo the URI, when it holds a password
    (``flatlm.tracking.tracker``'s rule)."""
    check_tracking_uri(uri, "--tracking-uri (or $MLFLOW_TRACKING_URI)")


def load_table(args) -> tuple:
    """(the tidy table, the tracking URI or None) from ``--trials`` or ``--experiment``."""
    if args.trials is not None:
        return load_trials(args.trials), None
    uri = (args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
           or default_tracking_uri(Path.cwd()))
    refuse_password(uri)
    check_store(uri, args.experiment)
    return load_runs(uri, args.experiment, source=getattr(args, "source", "auto")), uri
