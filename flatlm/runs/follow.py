"""A trial's checkpoints measured in a second process, beside its training, so training never
waits for a measurement.

``follow_trial(out_dir)`` reads the trial's ``config.json``, draws its evaluation data once, and
measures each checkpoint at ``train.checkpoint_steps`` that has no metrics yet, oldest first, as
it appears: the same ``checkpoint_metrics`` row that ``run_trial`` measures in its own process,
written the same way (``checkpoints/step-N/metrics.json`` and a ``metrics.jsonl`` line), so the
rows equal the in-process ones but for their ``time/`` keys (tests/runs/test_follow.py). It
stops when every checkpoint step is measured, or when nothing is left to measure and no process
holds the trial's directory (its training ended, or failed). One follower per trial: it holds the
lock of ``OUT/checkpoints``; the training holds ``OUT``'s.

    flatlm trial --out t/ --measure-in background      # trains, and measures in a second process
    flatlm measure --follow t/                          # or: the second process, started by hand

A checkpoint is renamed into place whole (``train.run``), so one that is listed can be read; one
damaged since (it fails its manifest) is set aside (``flatlm.train.state.measurable_model``) and
trained again when the trial is run again (``flatlm.runs.trial.retrain_from``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

from flatlm.core.config import from_dict
from flatlm.measure.run import eval_data
from flatlm.models.checkpoint import quiet_transformers_bars
from flatlm.runs.trial import (
    TRAINED_BY,
    Report,
    TrialConfig,
    checkpoint_metrics,
    record_checkpoint,
    validate_trial,
)
from flatlm.storage.dirlock import held_elsewhere, writer_lock
from flatlm.storage.metrics_log import read_metrics
from flatlm.train.state import find_checkpoints, measurable_model

log = logging.getLogger(__name__)


def trial_config_of(out_dir: Path) -> TrialConfig:
    """The trial config ``run_trial`` wrote to ``out_dir/config.json``, or a ValueError saying
    what is missing."""
    path = Path(out_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{out_dir} has no config.json: start the trial first (flatlm trial "
                         "--out DIR --measure-in background), or give its directory")
    return from_dict(TrialConfig, json.loads(path.read_text()))


def follow_trial(out_dir: str | Path, *, device="cpu", eval_cache: str | Path | None = None,
                 report: Report | None = None, poll_s: float = 2.0,
                 wait_s: float = 600.0, say: Callable[[str], None] | None = None
                 ) -> dict[int, dict]:
    """Measures the trial's checkpoints as they appear (module docstring); returns step ->
    row for every checkpoint measured so far. ``report(step, metrics, ckpt_dir)`` is told of
    each, as ``run_trial``'s. ``wait_s``: how long to wait for the trial's config.json and
    training to appear before giving up (a ValueError)."""
    out_dir = Path(out_dir).absolute()
    _wait_for_start(out_dir, poll_s, wait_s)
    cfg = trial_config_of(out_dir)
    source, model_cfg = validate_trial(cfg)
    steps = set(cfg.train.checkpoint_steps)
    (out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    with writer_lock(out_dir / "checkpoints"):
        data = eval_data(source, cfg.measure, model_cfg, device=device, cache_dir=eval_cache)
        done = read_metrics(out_dir)
        trained_here = not (out_dir / TRAINED_BY).exists()
        while True:
            todo = [(s, d) for s, d in find_checkpoints(out_dir).items()
                    if s in steps and s not in done]
            if not todo:
                if steps <= set(done) or not held_elsewhere(out_dir):
                    return done
                time.sleep(poll_s)
                continue
            step, ckpt = todo[0]
            with quiet_transformers_bars():
                model = measurable_model(ckpt)  # damaged: set aside, trained on the rerun
            if model is None:
                continue
            model = model.to(device)
            metrics = checkpoint_metrics(model, source, data, cfg.measure, device, ckpt,
                                         trained_here)
            record_checkpoint(out_dir, ckpt, step, metrics)
            done[step] = {"step": step, **metrics}
            if say is not None:
                say(f"measured step {step} in {metrics['time/measure_s']:.1f} s")
            if report is not None:
                report(step, metrics, ckpt)


def _wait_for_start(out_dir: Path, poll_s: float, wait_s: float) -> None:
    """Returns once the trial has written its config.json (a follower may start first)."""
    deadline = time.monotonic() + wait_s
    while not (out_dir / "config.json").is_file():
        if time.monotonic() > deadline:
            trial_config_of(out_dir)  # raises, naming what is missing
        time.sleep(poll_s)
