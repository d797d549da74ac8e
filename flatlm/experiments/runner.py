"""Runs an experiment's trials one after another on one device, into trial directories.

Layout: ``<root>/<protocol>/<experiment>/<trial>/`` (``flatlm.runs.trial.run_trial``'s files), which
``analysis/trials.py`` reads back. Running again resumes: finished trials are skipped, an
interrupted one continues from its newest checkpoint. A time budget stops the work after the
checkpoint during which it ran out (a checkpoint is never cut short); the next call goes on.

A trial whose training a finished trial already did (an equal
``flatlm.runs.trial.training_identity``: the sizes grid's base model and the algorithms' AdamW
run, say, or the same run under a protocol that differs only in how it measures, such as
``paper+released-probe`` beside ``paper``) is not trained again: that trial's checkpoints are
hard-linked into its directory (``trained_by.json`` says whose) and measured there, by its own
measurement settings. A twin of the trial's own protocol is preferred.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flatlm.core.config import from_dict
from flatlm.core.safe_io import make_fresh_dir, refuse_link, write_atomic
from flatlm.experiments.costs import measure_prior_s
from flatlm.experiments.paper import Experiment
from flatlm.runs.pack import check_pack_size, group_packs, run_pack, unpacked_reason
from flatlm.runs.trial import (
    TRAINED_BY,
    check_same_config,
    run_trial_once,
    training_identity,
    with_downstream_resolved,
)
from flatlm.runs.trial_progress import Sink
from flatlm.storage.dirlock import DirectoryBusyError, writer_lock
from flatlm.storage.diverged import DIVERGED_FILE, divergence
from flatlm.storage.manifest import MANIFEST, listed_files, verify_manifest
from flatlm.storage.metrics_log import CHECKPOINT_METRICS_FILE, TRAIN_LOG_FILE, read_metrics
from flatlm.train.run import Diverged
from flatlm.train.state import checkpoint_dir, find_checkpoints

log = logging.getLogger(__name__)
DIVERGED = "diverged"  # the state on_trial hears for a diverged trial (first word)


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


def run_experiment(experiment: Experiment, root: str | Path, *, device: str = "cpu",
                   budget: Budget | None = None, progress: bool = False,
                   on_trial: Callable[[str, str], None] | None = None,
                   on_progress: Callable[[str], Sink | None] | None = None,
                   pack: int = 1) -> bool:
    """Runs (or resumes) every trial of ``experiment`` under ``root``; True when all are done,
    False when the budget ran out first or another process holds a trial (then skipped: its
    holder runs it). ``on_trial(name, state)`` hears "skip", "start", "done", "paused" and
    "busy ...", "diverged ..." per trial (a diverged trial is recorded, reported and skipped on
    reruns: ``flatlm.storage.diverged``). ``on_progress(name)``: the sink of a trial's progress
    (``run_trial``'s ``on_progress``), asked as the trial starts (a pack's first member's).
    ``pack``: the most trials of one shape trained together as one model
    (``flatlm.runs.pack``); 1 trains each alone."""
    budget = budget or Budget()
    root = Path(root).absolute()
    check_pack_size(pack)
    trials = experiment.trials()
    for name, cfg in trials:  # every config checked before any work
        check_same_config(trial_dir(root, experiment, name), with_downstream_resolved(cfg))
    pending = []
    for name, cfg in trials:
        out = trial_dir(root, experiment, name)
        if finished(out, cfg):
            _tell(on_trial, name, "skip")
        elif (record := divergence(out)) is not None:  # the same seed would diverge again
            _tell(on_trial, name, f"{DIVERGED} at step {record['step']} (recorded in "
                                  f"{DIVERGED_FILE}; delete the directory to run it again)")
        else:
            pending.append((name, cfg))
    run = _Runner(experiment, root, device, budget, progress, on_trial, on_progress)
    busy = False
    for unit in _units(pending, pack, root, experiment):
        if budget.spent():
            for name, _ in unit:
                _tell(on_trial, name, "paused")
            return False
        state = run.alone(*unit[0], pack > 1) if len(unit) == 1 else run.packed(unit)
        if state == "paused":
            return False
        busy = busy or state == "busy"
    return not busy


def _units(pending: list, pack: int, root: Path, experiment: Experiment) -> list[list]:
    """``pending`` (name, config) cut into what runs at once: each trial alone when ``pack`` is
    1; else first the trials measured from a twin's checkpoints (``find_twin``), then packs of
    at most ``pack`` (``flatlm.runs.pack.group_packs``), then the trials whose training an
    earlier pending trial does (alone, after it: they find it as their twin)."""
    if pack == 1:
        return [[t] for t in pending]
    twins, packable, later, identities = [], [], [], set()
    for name, cfg in pending:
        out = trial_dir(root, experiment, name)
        if not find_checkpoints(out) and find_twin(root, experiment.protocol, out, cfg):
            twins.append([(name, cfg)])
            continue
        identity = json.dumps(training_identity(cfg), sort_keys=True)
        (later if identity in identities else packable).append((name, cfg))
        identities.add(identity)
    packs = group_packs([cfg for _, cfg in packable], pack)
    return [*twins, *[[packable[k] for k in p] for p in packs], *[[t] for t in later]]


@dataclass
class _Runner:
    """Runs one trial alone, or a pack of them, and tells ``on_trial`` how each went."""

    experiment: Experiment
    root: Path
    device: str
    budget: Budget
    progress: bool
    on_trial: Callable[[str, str], None] | None
    on_progress: Callable[[str], Sink | None] | None

    def sink(self, name: str):
        return self.on_progress(name) if self.on_progress else None

    def alone(self, name: str, cfg, packing: bool) -> str:
        """"done", "paused", "busy" or "diverged"; ``packing``: say why it is not in a pack."""
        out = trial_dir(self.root, self.experiment, name)
        try:
            # the lock held from the check to the end (re-entrant: run_trial takes it again):
            # a worker of --jobs that checked before another finished the trial, and locked
            # after, started it a second time (a trial of nothing to do, said twice)
            with writer_lock(out):
                return self._alone_held(name, cfg, packing, out)
        except DirectoryBusyError:  # another worker runs it (flatlm replicate --jobs)
            _tell(self.on_trial, name, "busy (another process runs it)")
            return "busy"

    def _alone_held(self, name: str, cfg, packing: bool, out: Path) -> str:
        root, on_trial = self.root, self.on_trial
        if finished(out, cfg):  # since the list was made: another worker (--jobs) ran it
            _tell(on_trial, name, "skip")
            return "done"
        twin = None if find_checkpoints(out) else find_twin(root, self.experiment.protocol, out,
                                                            cfg)
        reason = unpacked_reason(cfg) if packing else None
        _tell(on_trial, name, f"start (its training is {twin.name(root)}'s: measuring those "
                              "checkpoints)" if twin is not None else
                              f"start (unpacked: {reason})" if reason else "start")
        try:
            if twin is not None:
                carry_training(twin, out, root)
            run_trial_once(cfg, out, _stop_when(self.budget), device=self.device,
                           progress=self.progress, eval_cache=root / "eval_cache",
                           on_progress=self.sink(name),
                           measure_prior_s=measure_prior_s(cfg, self.device))
        except OutOfTime:
            _tell(on_trial, name, "paused")
            return "paused"
        except Diverged as e:  # recorded (run_trial_once) and reported; the others go on
            _tell(on_trial, name, f"{DIVERGED}: {e}")
            return DIVERGED
        _tell(on_trial, name, "done")
        return "done"

    def packed(self, unit: list) -> str:
        """The trials of ``unit`` as one pack (``flatlm.runs.pack.run_pack``)."""
        names = [name for name, _ in unit]
        for name in names:
            _tell(self.on_trial, name, f"start (a pack of {len(unit)}: {', '.join(names)})")
        outs = [trial_dir(self.root, self.experiment, name) for name in names]
        try:
            results = run_pack([cfg for _, cfg in unit], outs,
                               [_stop_when(self.budget)] * len(unit), device=self.device,
                               progress=self.progress, eval_cache=self.root / "eval_cache",
                               on_progress=self.sink(names[0]))
        except OutOfTime:
            for name in names:
                _tell(self.on_trial, name, "paused")
            return "paused"
        except DirectoryBusyError as e:  # another worker holds one of them
            for name in names:
                _tell(self.on_trial, name, f"busy (another process runs {e.directory.name})")
            return "busy"
        for name, result in zip(names, results, strict=True):
            _tell(self.on_trial, name, f"{DIVERGED}: {result}"
                  if isinstance(result, Diverged) else "done")
        return "done"


@dataclass(frozen=True)
class Twin:
    """A finished trial that trained what another trial would: its directory, and its
    checkpoints at the other's checkpoint steps."""

    path: Path
    checkpoints: dict[int, Path]

    def name(self, root: Path) -> str:
        return self.path.relative_to(root).as_posix()


def find_twin(root: Path, protocol: str, out: Path, cfg) -> Twin | None:
    """A finished trial under ``root`` (any protocol, ``protocol``'s first; any experiment) with
    ``cfg``'s training identity and a complete checkpoint (with its manifest) at every one of
    ``cfg.train.checkpoint_steps``; None if there is none. Unreadable trial directories are passed
    over. Another protocol's trial qualifies because the identity holds everything the training
    reads (model, source and labels, train section): a protocol that changes any of it trains
    anew."""
    needed = sorted(set(cfg.train.checkpoint_steps))
    identity = None  # worked out once a candidate has the checkpoints
    for config in _trial_configs(root, protocol):
        candidate = config.parent
        other = _saved_config(config, type(cfg))
        if candidate == out or other is None or not finished(candidate, other):
            continue
        found = find_checkpoints(candidate)
        if not all(s in found and listed_files(found[s]) is not None for s in needed):
            continue
        identity = identity or training_identity(cfg)
        if _identity_or_none(other) == identity and _verified(found, needed):
            return Twin(candidate, {s: found[s] for s in needed})
    return None


def _verified(found: dict[int, Path], needed: list[int]) -> bool:
    """Every needed checkpoint's files match its manifest: a twin whose checkpoint was damaged
    since (a flipped bit, a truncated file) is passed over, with a warning naming the file, and
    the trial trains itself; linking it would pass the damage on, and measuring it would stop
    at it on every rerun."""
    for step in needed:
        try:
            verify_manifest(found[step])
        except ValueError as e:
            log.warning("not measuring a twin's checkpoints (%s); training this trial instead",
                        e)
            return False
    return True


def _trial_configs(root: Path, protocol: str) -> list[Path]:
    """The config.json of every trial under ``root``: ``protocol``'s first, then the others'."""
    configs = sorted(Path(root).glob("*/*/*/config.json"))
    return sorted(configs, key=lambda c: c.parent.parent.parent.name != protocol)  # stable


def _saved_config(path: Path, cls):
    """A trial's config.json as this version's config, or None if it does not parse."""
    try:
        return from_dict(cls, json.loads(path.read_text()))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _identity_or_none(cfg) -> dict | None:
    try:
        return training_identity(cfg)
    except (OSError, ValueError):  # a config this version no longer builds: no twin
        return None


def carry_training(twin: Twin, out: Path, root: Path) -> None:
    """Gives ``out`` the twin's checkpoints, under ``out``'s writer lock and only while it has
    none: each one's files as written with it (those its manifest lists, and the manifest)
    hard-linked, or copied where linking fails, but not what was measured there (its
    metrics.json, a spectral density), which this trial measures by its own settings. Nothing
    writes into a checkpoint's files after the checkpoint is written, so the links are never
    changed, the twin's files with them. The twin's training curve is copied;
    ``trained_by.json`` names the twin and the steps."""
    with writer_lock(out):
        if find_checkpoints(out):  # another worker started it meanwhile: it resumes
            return
        for step, ckpt in twin.checkpoints.items():
            _carry_checkpoint(ckpt, checkpoint_dir(out, step))
        curve = twin.path / TRAIN_LOG_FILE
        if curve.is_file():
            write_atomic(out / TRAIN_LOG_FILE, curve.read_bytes())
        write_atomic(out / TRAINED_BY, json.dumps(
            {"trial": twin.name(root), "steps": sorted(twin.checkpoints)}, indent=1) + "\n")


def _carry_checkpoint(ckpt: Path, final: Path) -> None:
    """``ckpt``'s training files linked into a fresh directory renamed to ``final`` (so that a
    crash leaves no half checkpoint that looks complete)."""
    tmp = final.with_name(final.name + ".carry")
    refuse_link(tmp.parent)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    make_fresh_dir(tmp)
    for name in [*listed_files(ckpt), MANIFEST]:
        if name == CHECKPOINT_METRICS_FILE:
            continue
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(ckpt / name, tmp / name)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(ckpt / name, tmp / name)
    refuse_link(final)
    shutil.rmtree(final, ignore_errors=True)  # a torn one (no training state) left by a crash
    tmp.rename(final)


def _stop_when(budget: Budget):
    def report(step, metrics, ckpt_dir) -> None:
        if budget.spent():
            raise OutOfTime(step)
    return report


def _tell(on_trial, name: str, state: str) -> None:
    if on_trial is not None:
        on_trial(name, state)
