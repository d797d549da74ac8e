"""Trial directories -> the same tidy table as ``analysis.runs.load_runs``, without MLflow.

A trial directory is what ``flatlm.runs.trial.run_trial`` writes (``config.json`` and
``metrics.jsonl``); ``flatlm replicate`` and the sweeps write them under a root. Every directory
below ``root`` holding both files is one run. Its ``run_id`` is its path relative to ``root``,
``trial`` its name, and the directories between ``root`` and it fill ``protocol`` and
``experiment`` when the layout is ``<root>/<protocol>/<experiment>/<trial>`` (what ``flatlm
replicate`` writes); ``sweep`` is the experiment, as the sweeps' MLflow tag is.

>>> import json, tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> run = root / "paper" / "steps" / "seed0"; run.mkdir(parents=True)
>>> _ = (run / "config.json").write_text(json.dumps({"model": "d16-h1-l1-i64",
...     "train": {"algorithm": "adamw", "seed": 0}}))
>>> _ = (run / "metrics.jsonl").write_text('{"step": 0, "pretrain/kl": 1.5}\\n')
>>> df = load_trials(root)
>>> df[["protocol", "experiment", "trial", "train.seed", "step", "pretrain/kl"]].values.tolist()
[['paper', 'steps', 'seed0', 0, 0, 1.5]]
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pandas as pd

from analysis.runs import ID_COLUMNS as RUN_ID_COLUMNS
from analysis.runs import TAG_COLUMNS
from flatlm.core.config import flatten_dict
from flatlm.experiments.grids import EXPERIMENTS
from flatlm.storage.diverged import divergence
from flatlm.storage.metrics_log import METRICS_FILE, is_number, read_metrics

CONFIG_FILE = "config.json"
log = logging.getLogger(__name__)
ID_COLUMNS = (*RUN_ID_COLUMNS, "experiment")  # and the tags' ``protocol``


def trial_dirs(root: str | Path) -> list[Path]:
    """Every directory under ``root`` (itself included) with a config and a metrics log."""
    root = Path(root)
    found = [p.parent for p in root.rglob(CONFIG_FILE) if (p.parent / METRICS_FILE).exists()]
    return sorted(found)


def finished_trials(root: Path, experiments=EXPERIMENTS) -> tuple[list[Path], list[Path]]:
    """(finished, unfinished) trial directories of ``experiments`` (``<protocol>/<experiment>/
    <trial>`` under ``root``): finished = the last configured checkpoint is in ``metrics.jsonl``.
    Other experiments under ``root`` (the selection's lr axis) are not the paper's: left out."""
    done, running = [], []
    for config_file in sorted(root.rglob("config.json")):
        trial = config_file.parent
        parts = trial.relative_to(root).parts
        if ("eval_cache" in parts or len(parts) != 3 or parts[1] not in experiments
                or not (trial / METRICS_FILE).exists()):
            continue
        last = max(json.loads(config_file.read_text())["train"]["checkpoint_steps"])
        (done if last in read_metrics(trial) else running).append(trial)
    return done, running


def replace_records(root: Path, out: Path) -> tuple[list[Path], list[Path]]:
    """The finished trials of ``root`` (``finished_trials``) with their records copied to
    ``out``, replacing what was there; returns (finished, unfinished)."""
    done, running = finished_trials(root)
    if done:
        shutil.rmtree(out, ignore_errors=True)
        copy_records(done, root, out)
    return done, running


def copy_records(trials: list[Path], root: Path, out: Path) -> None:
    """Each trial's record (its config and metrics log; never a checkpoint) from under
    ``root`` to the same relative place under ``out``."""
    for trial in trials:
        target = out / trial.relative_to(root)
        target.mkdir(parents=True, exist_ok=True)
        for name in (CONFIG_FILE, METRICS_FILE):
            shutil.copyfile(trial / name, target / name)


def load_trials(root: str | Path) -> pd.DataFrame:
    """One row per (trial directory, checkpoint) under ``root``; columns as ``load_runs``'s
    (``run_id, trial, status``, the tags, every config field as a dotted param, ``step``, the
    metrics) plus ``protocol`` and ``experiment`` (None when the layout does not give them)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"--trials {root}: no such directory")
    records, params, metrics = [], set(), set()
    for run in trial_dirs(root):
        config = read_config(run)
        if config is None:
            continue
        params.update(config)
        rows = read_metrics(run)
        base = {**_ids(root, run, config, rows), **_tags(root, config, run), **config}
        for step, row in sorted(rows.items()):
            values = {k: float(v) for k, v in row.items() if k != "step" and is_number(v)}
            metrics.update(values)
            records.append({**base, "step": step, **values})
    columns = [*ID_COLUMNS, *TAG_COLUMNS, *sorted(params), "step", *sorted(metrics)]
    df = pd.DataFrame.from_records(records, columns=columns)
    df["step"] = df["step"].astype("int64")
    for col in metrics:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    # one block per dtype (the per-column casts above fragment the frame)
    df = df.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True).copy()
    df.attrs["params"] = sorted(params)
    df.attrs["metrics"] = sorted(metrics)
    return df


def read_config(run: Path) -> dict | None:
    """A trial's config, flattened; None (with a warning naming the file) when it is not a
    JSON object: a truncated or damaged record is left out of the report, not its end."""
    path = run / CONFIG_FILE
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("%s is not readable JSON (%s): trial left out", path, e)
        return None
    if not isinstance(config, dict):
        log.warning("%s holds a %s, not a trial config: trial left out", path,
                    type(config).__name__)
        return None
    return flatten_dict(config)


def _ids(root: Path, run: Path, config: dict, rows: dict) -> dict:
    parts = run.relative_to(root).parts
    experiment = parts[-2] if len(parts) >= 3 else None
    planned = set(config.get("train.checkpoint_steps") or ())
    if divergence(run) is not None:
        status = "FAILED"
    elif planned <= set(rows):
        status = "FINISHED"
    else:  # still running, or interrupted: not every checkpoint is measured yet
        status = "RUNNING"
    return {"run_id": "/".join(parts) or ".", "trial": run.name, "status": status,
            "experiment": experiment}


def _tags(root: Path, config: dict, run: Path) -> dict:
    """``load_runs``' tag columns; the protocol from the layout (no scale is recorded)."""
    parts = run.relative_to(root).parts
    return {"sweep": run.parent.name, "scale": None,
            "protocol": parts[-3] if len(parts) >= 3 else None,
            "algorithm": config.get("train.algorithm")}
