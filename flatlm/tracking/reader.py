"""Reading an MLflow store: its experiments, their runs, a run's status, artifacts and metric
histories. With ``tracker`` (which writes), the only modules that import MLflow
(``tests/test_architecture.py`` pins it): the next MLflow rename touches these two. The analysis
tables (``analysis.runs``, ``analysis.store``) and the sweeps' end-of-sweep checks
(``sweeps.delivery``) read through a ``StoreReader``.

MLflow is imported when a reader is made, not with this module: the core imports without it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


class StoreReader:
    """Reads the MLflow store at ``tracking_uri`` (``sqlite:///...``, ``http://...``). Nothing is
    created but, for a fresh sqlite file, MLflow's own tables."""

    def __init__(self, tracking_uri: str):
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self._client = MlflowClient(tracking_uri)

    def experiment(self, name: str):
        """The experiment named ``name`` (``experiment_id``, ``name``, ``lifecycle_stage``,
        ``tags``), or None."""
        return self._client.get_experiment_by_name(name)

    def experiment_names(self) -> list[str]:
        """The names of the store's active experiments."""
        return [e.name for e in self._client.search_experiments()]

    def runs(self, experiment_id: str, filter_string: str = "") -> list:
        """Every run of the experiment matching ``filter_string`` (all pages), each with
        ``info`` (``run_id``, ``run_name``, ``status``) and ``data`` (``params``, ``metrics``: the
        latest value of each, ``tags``)."""
        runs, token = [], None
        while True:
            page = self._client.search_runs([experiment_id], filter_string, max_results=1000,
                                            page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def run_status(self, run_id: str) -> str:
        """``RUNNING``, ``FINISHED``, ``FAILED`` or ``KILLED``."""
        return self._client.get_run(run_id).info.status

    def artifact_text(self, run_id: str, path: str) -> str | None:
        """The text of the run's artifact ``path`` (at the artifact root), or None when the run
        has none or its artifact store cannot be read."""
        try:
            names = {f.path for f in self._client.list_artifacts(run_id)}
        except Exception:  # noqa: BLE001 - an unreadable artifact store: the caller falls back
            return None
        if path not in names:
            return None
        with tempfile.TemporaryDirectory() as tmp, _no_progress_bar():
            return Path(self._client.download_artifacts(run_id, path, tmp)).read_text()

    def metric_history(self, run_id: str, key: str) -> list:
        """Every value logged under ``key`` (``step``, ``value``, ``timestamp``), in MLflow's
        order."""
        return self._client.get_metric_history(run_id, key)


@contextlib.contextmanager
def _no_progress_bar():
    """MLflow draws a progress bar per download; one per run clutters a report's output."""
    name = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    old = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
