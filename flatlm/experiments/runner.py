"""Runs an experiment's trials one after another on one device, into trial directories.

Layout: ``<root>/<protocol>/<experiment>/<trial>/`` (``flatlm.runs.trial.run_trial``'s files), which
``analysis/trials.py`` reads back. Running again resumes: finished trials are skipped, an
interrupted one continues from its newest checkpoint. A time budget stops the work after the
checkpoint during which it ran out (a checkpoint is never cut short); the next call goes on.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flatlm.core.config import from_dict, to_dict
from flatlm.experiments.paper import Experiment
from flatlm.runs.dirlock import DirectoryBusyError
from flatlm.runs.metrics_log import read_metrics
from flatlm.runs.trial import run_trial, with_downstream_resolved


class OutOfTime(Exception):  # noqa: N818 - a budget reached, not an error
    """The time budget ran out after a checkpoint was measured and recorded."""


@dataclass
class Budget:
    """A wall-clock deadline ``seconds`` from now (``None``: none), read from ``clock``."""

    seconds: float | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self):
        self.deadline = None if self.seconds is None else self.clock() + self.seconds

    def spent(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline


def trial_dir(root: Path, experiment: Experiment, name: str) -> Path:
    return Path(root) / experiment.protocol / experiment.name / name


def finished(out: Path, cfg) -> bool:
    """Every checkpoint of ``cfg`` is in the trial's metrics log."""
    return set(cfg.train.checkpoint_steps) <= set(read_metrics(out)) if out.exists() else False


def check_same_config(out: Path, cfg) -> None:
    """A trial directory resumes only the config it was started with. Its ``config.json`` is
    read as this version's config, so a field added to flatlm since counts as its default."""
    path = out / "config.json"
    if not path.exists():
        return
    if _as_current(json.loads(path.read_text()), cfg) != to_dict(with_downstream_resolved(cfg)):
        raise ValueError(f"{out} holds a trial started with another config (its config.json "
                         "differs): the settings changed since. Pass another --out, or delete "
                         "that directory to start the trial again")


def _as_current(saved: dict, cfg) -> dict:
    """``saved`` (a config.json) with the fields it lacks at their defaults; as read if it no
    longer parses (a field since removed: then it differs, as it should)."""
    try:
        return to_dict(from_dict(type(cfg), saved))
    except (TypeError, ValueError):
        return saved


def run_experiment(experiment: Experiment, root: str | Path, *, device: str = "cpu",
                   budget: Budget | None = None, progress: bool = False,
                   on_trial: Callable[[str, str], None] | None = None) -> bool:
    """Runs (or resumes) every trial of ``experiment`` under ``root``; True when all are done,
    False when the budget ran out first or another process holds a trial (then skipped: its
    holder runs it). ``on_trial(name, state)`` hears "skip", "start", "done", "paused" and
    "busy ..." per trial."""
    budget = budget or Budget()
    root = Path(root).absolute()
    busy = False
    trials = experiment.trials()
    for name, cfg in trials:  # every config checked before any work
        check_same_config(trial_dir(root, experiment, name), cfg)
    for name, cfg in trials:
        out = trial_dir(root, experiment, name)
        if finished(out, cfg):
            _tell(on_trial, name, "skip")
            continue
        if budget.spent():
            _tell(on_trial, name, "paused")
            return False
        _tell(on_trial, name, "start")
        try:
            run_trial(cfg, out, _stop_when(budget), device=device, progress=progress,
                      eval_cache=root / "eval_cache")
        except OutOfTime:
            _tell(on_trial, name, "paused")
            return False
        except DirectoryBusyError:  # another worker runs it (flatlm replicate --jobs)
            _tell(on_trial, name, "busy (another process runs it)")
            busy = True
            continue
        _tell(on_trial, name, "done")
    return not busy


def _stop_when(budget: Budget):
    def report(step, metrics, ckpt_dir) -> None:
        if budget.spent():
            raise OutOfTime(step)
    return report


def _tell(on_trial, name: str, state: str) -> None:
    if on_trial is not None:
        on_trial(name, state)
