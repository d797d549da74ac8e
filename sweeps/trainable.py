"""The Tune function trainable: one ``run_trial`` (``flatlm.runs.trial``) per trial, reported
to its MLflow run (``flatlm.tracking.tracker``) and to Tune with a checkpoint that carries the
tracking state.

At each checkpoint the trial's report (a ``flatlm.runs.trial.Report``) sends the new rows of the
trial's ``metrics.jsonl`` to MLflow, uploads the changed files, adds the tracking state to the
checkpoint directory (``travel``) and reports to Tune, which persists that directory under the
sweep's storage path. A retried trial (``FailureConfig``) restores it and continues; the run id
travelling in it keeps one MLflow run per trial. Runs in Ray workers: imports nothing from
``analysis/``.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

import torch

from flatlm.core.config import apply_overrides, from_dict
from flatlm.core.registry import load_plugins
from flatlm.core.safe_io import write_bytes
from flatlm.experiments.costs import measure_prior_s
from flatlm.experiments.presets import scale_and_protocol_of
from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN, probe_keys
from flatlm.runs.headline import display_columns
from flatlm.runs.trial import TrialConfig, tracked_params
from flatlm.sources import load
from flatlm.storage.diverged import DIVERGED_FILE, record_divergence
from flatlm.storage.metrics_log import METRICS_FILE, read_metrics, read_train_log
from flatlm.tracking.ledger import STATE_FILE
from flatlm.tracking.tracker import (
    TAG_ALGORITHM,
    TAG_MODEL,
    TAG_PROTOCOL,
    TAG_SCALE,
    TAG_SWEEP,
    MlflowTracker,
    find_run,
)
from flatlm.train.loop import Diverged
from sweeps.curves import plot_curves
from sweeps.progress_board import poster
from sweeps.rayenv import tune
from sweeps.travel import restore_tracking, save_tracking

# in a diverged trial's directory: {"step", "loss", "message"} (flatlm.storage.diverged)
#   (loss null when it was not finite: the file stays valid JSON)
TAG_DIVERGED = "flatlm.diverged"  # MLflow tag of a diverged trial's run: the step
# Artifacts of a trial's MLflow run: its config, every checkpoint's measurements, its curves.
TRIAL_ARTIFACTS = (METRICS_FILE, "metrics.json", "trial_config.json", "*.png",
                   "spectral_density.json")  # measure.what "density", per checkpoint
# The checkpoints' files among them (metrics.json, the spectral density) sit in the run's
# artifacts under measurements/step-<N>/: the model weights stay on disk, not in MLflow.
ARTIFACT_FOLDERS = {"checkpoints": "measurements"}
FINISH_WAIT_S = 300.0  # how long a trial ending in a tracking outage waits for MLflow
#   (env FLATLM_FINISH_WAIT_S overrides it)


def trainable(config: dict) -> None:
    """Tune function trainable; ``config``: ``base`` (a TrialConfig as a dict), ``overrides``
    (this trial's point of the search space) and ``sweep`` (name, tracking URI, experiment id,
    trials directory)."""
    from flatlm.runs.trial import run_trial, validate_trial, with_downstream_resolved

    quiet_ray_train()
    sweep = config["sweep"]
    load_plugins(sweep.get("plugins", ()))  # the driver's plug-ins, before the config names them
    cfg = apply_overrides(from_dict(TrialConfig, config["base"]), config["overrides"])
    source, _ = validate_trial(cfg)  # built once: run_trial takes it
    cfg = with_downstream_resolved(cfg, source)  # the tracked params name the label rule
    name = tune.get_context().get_trial_name()
    out_dir = Path(sweep["trials_dir"]) / name
    out_dir.mkdir(parents=True, exist_ok=True)
    tracker = _tracker(cfg, sweep, name, out_dir)

    def report(step: int, metrics: dict, ckpt_dir: Path) -> None:
        tracker.report(step, metrics, ckpt_dir)  # before Tune's report: a kill after it loses
        tracker.sync_artifacts(out_dir, patterns=TRIAL_ARTIFACTS,  # nothing
                               folders=ARTIFACT_FOLDERS)
        save_tracking(ckpt_dir, out_dir, tracker.run_id, step)
        tune.report({**metrics, "step": step},
                    checkpoint=tune.Checkpoint.from_directory(str(ckpt_dir)))

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        run_trial(cfg, out_dir, report, device=device, source=source,
                  eval_cache=Path(sweep["trials_dir"]).parents[1] / "eval_cache",
                  on_progress=poster(name),  # the driver prints where it is (sweeps.progress_board)
                  measure_prior_s=measure_prior_s(cfg, device))
    except Diverged as e:  # ends here, not retried: a retry would diverge the same way
        end_diverged(tracker, out_dir, e)
        return
    except BaseException:
        tracker.finish("FAILED")
        raise
    end_finished(tracker, out_dir, name, cfg)


def quiet_ray_train() -> None:
    """Ray Train logs "Checkpoint successfully created at: ..." at INFO for every checkpoint of
    every trial; the driver prints its own line per result. ``--verbose`` (env
    ``FLATLM_VERBOSE=1``, inherited by local workers) keeps Ray's lines."""
    if not os.environ.get("FLATLM_VERBOSE"):
        logging.getLogger("ray.train").setLevel(logging.WARNING)


def end_finished(tracker, out_dir: Path, name: str, cfg: TrialConfig) -> None:
    """Ends a trial that trained to its end: its figures (``plot_trial``; one that fails is
    only said), its artifacts synced, its MLflow run FINISHED."""
    try:
        plot_trial(out_dir, name, cfg)
    except Exception as e:  # noqa: BLE001 - a figure is not worth failing a finished trial
        print(f"trial {name}: could not plot its curves: {e}", file=sys.stderr, flush=True)
    tracker.sync_artifacts(out_dir, patterns=TRIAL_ARTIFACTS, folders=ARTIFACT_FOLDERS)
    finish_trial(tracker, "FINISHED", finish_wait_s())


def end_diverged(tracker, out_dir: Path, e: Diverged) -> None:
    """Marks the trial diverged (``DIVERGED_FILE``, the run's ``TAG_DIVERGED`` tag) and ends its
    MLflow run FAILED. Nothing after the divergence was measured; the trial returns normally so
    that Tune neither retries it nor stops the sweep (the driver lists diverged trials)."""
    print(f"trial {out_dir.name}: {e}", file=sys.stderr, flush=True)
    record_divergence(out_dir, e)  # valid JSON: a non-finite loss is null
    if not tracker.set_tag(TAG_DIVERGED, str(e.step)):
        print(f"trial {out_dir.name}: could not tag its run diverged ({DIVERGED_FILE} says so)",
              file=sys.stderr, flush=True)
    finish_trial(tracker, "FAILED", finish_wait_s())


def _tracker(cfg: TrialConfig, sweep: dict, name: str, out_dir: Path):
    """The trial's tracker, on the MLflow run of its restored checkpoint, of its earlier
    attempt on this node, of its name (a retry before any checkpoint), or a new one."""
    run_id = None
    ckpt = tune.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            run_id = restore_tracking(Path(d), out_dir)
    return tracker_for(cfg, sweep, name, out_dir, run_id)


def tracker_for(cfg: TrialConfig, sweep: dict, name: str, out_dir: Path, run_id: str | None):
    """The trial's tracker on MLflow run ``run_id`` (a restored checkpoint's), else on that of
    its earlier attempt on this node, of its name (a retry before any checkpoint), or new.
    ``cfg``: its tasks resolved (``with_downstream_resolved``): the rounded columns name them."""
    if run_id is None and not (out_dir / STATE_FILE).exists():
        run_id = find_run(sweep["tracking_uri"], sweep["experiment_id"], name)
    return MlflowTracker(sweep["tracking_uri"], out_dir, experiment_id=sweep["experiment_id"],
                         run_id=run_id, run_name=name, params=tracked_params(cfg),
                         tags=run_tags(cfg, sweep),
                         display=display_columns(tuple(cfg.measure.tasks)))


def run_tags(cfg: TrialConfig, sweep: dict) -> dict:
    """What the MLflow UI groups and filters by; the parameter count is a metric
    (``flatlm.runs.trial.N_PARAMS``), so that it sorts as a number."""
    tags = {TAG_SWEEP: sweep["name"], TAG_MODEL: str(cfg.model),
            TAG_ALGORITHM: cfg.train.algorithm, "source": str(cfg.source)}
    scale, protocol = sweep.get("scale"), sweep.get("protocol")
    if sweep.get("preset"):  # a sweep started before --preset was retired, resumed
        scale, protocol = scale_and_protocol_of(sweep["preset"])
    tags.update({k: v for k, v in ((TAG_SCALE, scale), (TAG_PROTOCOL, protocol)) if v})
    return tags


def curve_keys(tasks: tuple[str, ...]) -> list[str]:
    """What ``curves.png`` shows: loss, KL, the flatness traces and each task's probe accuracy."""
    return [LOSS, KL, TRACE_FISHER, TRACE_HESSIAN, *(probe_keys(t)[0] for t in tasks)]


def plot_trial(out_dir: Path, name: str, cfg: TrialConfig) -> None:
    """``curves.png``: the trial's training loss and measurements over training steps (a figure
    to look at in the MLflow UI), and ``trial_config.json`` (a copy of config.json under an
    unambiguous name)."""
    tasks = tuple(cfg.measure.tasks) or tuple(load(cfg.source).tasks)
    plot_curves(read_metrics(out_dir), curve_keys(tasks), out_dir / "curves.png", name,
                train_rows=read_train_log(out_dir))
    write_bytes(out_dir / "trial_config.json", (out_dir / "config.json").read_bytes())


def finish_wait_s() -> float:
    """How long a trial ending in a tracking outage waits for MLflow (``finish_trial``)."""
    return float(os.environ.get("FLATLM_FINISH_WAIT_S", FINISH_WAIT_S))


def finish_trial(tracker, status: str, wait_s: float) -> bool:
    """Ends the trial's MLflow run, waiting up to ``wait_s`` through a tracking outage.

    ``finish`` never raises: while the server is down it returns False, and a trial that simply
    returned then would leave its run RUNNING with its last rows unsent. The driver re-sends
    what is still undelivered after ``fit`` (``sweeps.delivery.finish_undelivered``, for the trial
    directories it can see); on a cluster, ``MlflowTracker(uri, out_dir).finish()`` on the
    trial's node does.
    """
    deadline = time.monotonic() + wait_s
    while not tracker.finish(status):
        if time.monotonic() >= deadline:
            print(f"MLflow unreachable for {wait_s:.0f} s: run {tracker.run_id} not ended; its "
                  f"unsent rows stay in {tracker.trial_dir}", file=sys.stderr, flush=True)
            return False
        time.sleep(min(5.0, max(deadline - time.monotonic(), 0.0)))
    return True
