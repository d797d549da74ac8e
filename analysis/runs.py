"""MLflow runs -> one tidy table, one row per trial and checkpoint (read through
``flatlm.tracking.reader.StoreReader``).

Per-checkpoint metrics come from each run's ``metrics.jsonl`` artifact when present (the trial
writes one JSON object per checkpoint with ``step`` and the metric keys: one download per run),
else from ``MlflowClient.get_metric_history`` (one call per run and key). ``search_runs`` alone
would give only each metric's latest value. Params arrive as strings and are cast back to numbers
where every value of a column is numeric. Runs tagged ``flatlm.report=1`` (the analysis report's
own runs) are skipped.
"""

from __future__ import annotations

import math

import pandas as pd

from flatlm.storage.metrics_log import METRICS_FILE, N_PARAMS, is_number, parse_metrics
from flatlm.tracking.reader import StoreReader
from flatlm.tracking.tracker import (
    TAG_ALGORITHM,
    TAG_PRESET,
    TAG_PROTOCOL,
    TAG_REPORT,
    TAG_SCALE,
    TAG_SWEEP,
)
from flatlm.tracking.ui import metrics_key

METRICS_ARTIFACT = METRICS_FILE
ID_COLUMNS = ("run_id", "trial", "status")
# Where a run ran, named as the README and ``flatlm replicate`` name it (``--scale``,
# ``--protocol``); the sweeps tag a run with their ``preset`` (``tiny``: a pair of them), which
# ``where_ran`` reads, so that stores written before the columns were named so stay readable.
TAG_COLUMNS = (TAG_SWEEP, "scale", "protocol", TAG_ALGORITHM)
_MISSING = {"None", "none", "null", "nan", "NaN", ""}


def load_runs(tracking_uri: str, experiment: str, *, source: str = "auto") -> pd.DataFrame:
    """One row per (run, checkpoint) of ``experiment``.

    Columns: ``run_id, trial, status, sweep, scale, protocol, algorithm`` (``where_ran``),
    every param (dotted name,
    cast to numbers where numeric; ``model`` among them), ``step``, and every metric key at
    that step (``pretrain/loss``, ``n_params``, ...; the training curve ``train/*`` is not a
    checkpoint's and is left out; standard errors under their ``metrics.jsonl`` names,
    ``pretrain/kl_se``, not MLflow's ``se/pretrain/kl``). ``df.attrs["params"]`` and
    ``df.attrs["metrics"]`` list the param and metric columns, ``df.attrs["experiment_id"]`` is
    the experiment's id.

    Args:
        source: ``"auto"`` (``metrics.jsonl`` when a run has it, else histories), ``"artifact"``
            (runs without the file are skipped) or ``"history"``.
    """
    if source not in ("auto", "artifact", "history"):
        raise ValueError(f"source must be auto, artifact or history, not {source!r}")
    store = StoreReader(tracking_uri)
    exp = store.experiment(experiment)
    if exp is None:
        raise ValueError(f"no experiment {experiment!r} at {tracking_uri}")

    records, param_names, metric_names = [], set(), set()
    for run in store.runs(exp.experiment_id):
        tags = run.data.tags
        if tags.get(TAG_REPORT) == "1":
            continue
        steps = None
        if source in ("auto", "artifact"):
            steps = _artifact_steps(store, run.info.run_id)
        if steps is None and source in ("auto", "history"):
            steps = _history_steps(store, run.info.run_id, run.data.metrics)
        if steps is None:
            continue
        base = {"run_id": run.info.run_id, "trial": run.info.run_name, "status": run.info.status}
        base.update({t: tags.get(t) for t in TAG_COLUMNS})
        base.update(where_ran(tags))
        params = {_param_column(k): v for k, v in run.data.params.items()}
        param_names.update(params)
        legacy = {N_PARAMS: float(tags[N_PARAMS])} if N_PARAMS in tags else {}  # was a tag
        for step in sorted(steps):
            row = {**legacy, **steps[step]}
            metric_names.update(row)
            records.append({**base, **params, "step": step, **row})

    params = sorted(param_names)
    metrics = sorted(metric_names)
    columns = [*ID_COLUMNS, *TAG_COLUMNS, *params, "step", *metrics]
    df = pd.DataFrame.from_records(records, columns=columns)
    for col in [*TAG_COLUMNS, *params]:
        df[col] = _cast(df[col])
    df["step"] = df["step"].astype("int64")
    for col in metrics:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    # one block per dtype: the per-column casts above fragment the frame, and every later
    # insertion into it (the figures' assign) would warn
    df = df.sort_values(["trial", "run_id", "step"], kind="stable").reset_index(drop=True).copy()
    df.attrs["params"] = params
    df.attrs["metrics"] = metrics
    df.attrs["experiment_id"] = exp.experiment_id
    return df


def where_ran(tags: dict) -> dict:
    """``scale`` and ``protocol`` of a run from its tags: their own tags where a run has them,
    else the sweeps' ``preset`` tag read as the pair it names (``tiny`` -> ``sweep`` /
    ``paper``; ``testbed/paper`` where they were given apart); a preset of no known name is
    kept as the scale.

    >>> where_ran({"preset": "tiny"}), where_ran({"preset": "testbed/paper-code"})
    ({'scale': 'sweep', 'protocol': 'paper'}, {'scale': 'testbed', 'protocol': 'paper-code'})
    """
    scale, protocol, preset = (tags.get(t) for t in (TAG_SCALE, TAG_PROTOCOL, TAG_PRESET))
    if preset and not (scale or protocol):
        from flatlm.experiments.presets import (  # loads torch: only for a preset tag
            scale_and_protocol_of,
        )

        scale, protocol = scale_and_protocol_of(preset)
    return {"scale": scale, "protocol": protocol}


def _artifact_steps(store: StoreReader, run_id: str) -> dict[int, dict[str, float]] | None:
    """step -> {key: value} from the run's ``metrics.jsonl``; None if it has none (or its
    artifact store cannot be read: histories then)."""
    text = store.artifact_text(run_id, METRICS_ARTIFACT)
    return None if text is None else parse_metrics_jsonl(text)


def parse_metrics_jsonl(text: str) -> dict[int, dict[str, float]]:
    """step -> {key: value} from ``metrics.jsonl`` text: numeric fields only. Read by the
    trial's own reader (``flatlm.storage.metrics_log.parse_metrics``): for a step reported twice (a
    resumed trial) the last row wins, as everywhere."""
    return {step: {k: float(v) for k, v in row.items() if k != "step" and is_number(v)}
            for step, row in parse_metrics(text).items()}


def _history_steps(store: StoreReader, run_id: str, latest: dict) -> dict[int, dict[str, float]]:
    """step -> {key: value} from each key's metric history (the earliest value per step); the
    training curve (``train/*``, logged between checkpoints) is not a checkpoint's."""
    steps: dict[int, dict[str, float]] = {}
    for name in (k for k in latest if not k.startswith("train/")):
        key = metrics_key(name)  # se/pretrain/kl in MLflow is pretrain/kl_se in the table
        for m in sorted(store.metric_history(run_id, name), key=lambda m: m.timestamp):
            steps.setdefault(int(m.step), {}).setdefault(key, float(m.value))
    return steps


def _param_column(name: str) -> str:
    clash = {*ID_COLUMNS, *TAG_COLUMNS, "step"}
    return f"params.{name}" if name in clash else name


def _cast(col: pd.Series) -> pd.Series:
    """Strings -> integers, floats or booleans when every present value parses; else unchanged.
    ``None``/``nan``/empty count as missing."""
    text = col.map(lambda v: None if _missing(v) else str(v))
    present = text.dropna()
    if present.empty:
        return text
    if present.isin(["True", "False"]).all():
        return text.map({"True": True, "False": False})
    numbers = pd.to_numeric(text, errors="coerce")
    if numbers[present.index].isna().any():
        return col
    if present.str.fullmatch(r"[+-]?\d+").all():
        return numbers.astype("Int64")
    return numbers.astype("float64")


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or str(v) in _MISSING
