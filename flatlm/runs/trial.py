"""One trial: pre-train, and at every checkpoint measure and report. No Ray, no MLflow here.

``run_trial(cfg, out_dir, report)`` trains ``cfg.model`` on ``cfg.source`` with ``cfg.train`` and,
at each of ``cfg.train.checkpoint_steps``, measures the model (``flatlm.measure.run``) and calls
``report(step, metrics, checkpoint_dir)``. The CLI passes a printer, tests a list, and the sweep
glue a fan-out to Ray Tune and the MLflow tracker. Under ``out_dir`` (absolute: Ray may chdir):

    config.json                  the trial's full config
    metrics.jsonl                one JSON object per checkpoint: {"step": N, <metric>: value, ...}
    checkpoints/step-<N>/        model (save_pretrained layout + flatlm.json), training state,
                                 and metrics.json (that checkpoint's measurements)

Re-running with the same ``out_dir`` resumes from the newest checkpoint; that checkpoint is
measured first if a crash lost its measurements, and reported again either way (a crash may have
fallen between measuring and reporting; the sinks keep one value per step). Older checkpoints
at checkpoint steps without measurements (those of another trial with the same training,
``training_identity``, given to this one by ``flatlm.experiments.runner``) are measured before it.
Each step's row is written once: a resume that goes back before a measured checkpoint (a pack's
members realigned, a damaged checkpoint set aside) trains it again and keeps its row
(``TrialMeasurer.keep_row``); an older checkpoint that is only to be measured and does not load
is set aside and trained again (``retrain_from``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flatlm.core.config import from_dict, to_dict, to_flat_dict
from flatlm.core.safe_io import write_text
from flatlm.measure.registry import unused_sections as unused_measure_sections
from flatlm.measure.run import EvalData, MeasureConfig, downstream_of, eval_data, measure_model
from flatlm.models.checkpoint import INFO_NAME, load_checkpoint, quiet_transformers_bars
from flatlm.models.presets import ModelSpec, parse_model
from flatlm.runs.headline import headline_keys, headline_task, short_line
from flatlm.runs.trial_progress import Sink, TrialProgress
from flatlm.sources import SourceSpec, load
from flatlm.storage.dirlock import writer_lock
from flatlm.storage.diverged import DIVERGED_FILE, divergence, record_divergence
from flatlm.storage.metrics_log import (
    CHECKPOINT_METRICS_FILE,
    N_PARAMS,
    append_metrics,
    read_metrics,
)
from flatlm.train.config import SCHEDULING_KEYS, TrainConfig, resolve
from flatlm.train.loop import TRAINING_INTERVAL, Diverged
from flatlm.train.registry import check_before_training
from flatlm.train.registry import unused_sections as unused_train_sections
from flatlm.train.sizes import check_fits
from flatlm.train.state import (
    checkpoint_dir,
    find_checkpoints,
    measurable_model,
    newest_checkpoint,
    set_aside_dir,
)

log = logging.getLogger(__name__)

# The one report signature (step, that checkpoint's metrics, that checkpoint's directory): the
# trial calls it; printer, the tracker's MlflowTracker.report and the sweeps' Ray sink are ones.
Report = Callable[[int, dict, Path], None]


def _default_train() -> TrainConfig:
    return TrainConfig(steps=200, batch_size=64, checkpoint_steps=(0, 100, 200),
                       warmup_steps=20)


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """A trial = source + model + pre-training + measurements (each stage gets its own part).

    ``source`` and ``model`` may be given as strings (or a source dict); they are checked and
    stored as ``SourceSpec`` / ``ModelSpec`` on construction.
    """

    source: SourceSpec = field(default_factory=SourceSpec)  # short form (pcfg:paper, hmm:seed=0,
    #   dyck:8) or a JSON object; default pcfg:paper
    model: ModelSpec = field(default_factory=ModelSpec)  # a preset (bert-41m, lstm-h512-l8) or
    #   a shape (d64-h1-l1-i256); default bert-2m
    train: TrainConfig = field(default_factory=_default_train)
    measure: MeasureConfig = field(default_factory=MeasureConfig)

    def __post_init__(self):
        for name, kind in (("source", SourceSpec), ("model", ModelSpec)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError as e:
                    raise ValueError(f"{name}={value!r}: {e}") from None


def labelled_source(cfg: TrialConfig) -> SourceSpec:
    """``cfg.source`` as the trial uses it: a PCFG's spec with ``measure.spans`` and
    ``measure.label_rule`` written in where set, so that pre-training (the adversary's labelled
    pool, ``train.adversarial``) and the measurements (probes, lookup table) read the same labels;
    other sources as given (``measure.spans`` is then an error: only a PCFG's tasks have spans)."""
    measure = cfg.measure
    if cfg.source.kind != "pcfg":
        if measure.spans is not None:
            raise ValueError(f"measure.spans={measure.spans!r}: only a PCFG's tasks have spans; "
                             f"leave it unset (measure.spans=null) for a {cfg.source.kind} "
                             "source (--source does, with the PCFG's label rule)")
        return cfg.source
    changes = {"spans": measure.spans, "label_rule": measure.label_rule}
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return cfg.source
    try:
        return SourceSpec({**cfg.source.to_dict(), **changes})
    except ValueError as e:
        raise ValueError(f"measure.spans / measure.label_rule: {e}") from None


def validate_trial(cfg: TrialConfig, source=None):
    """Builds what the trial needs, failing on a bad config before any work: (source, model);
    the source is ``labelled_source(cfg)``'s. ``source``: that source already built (a caller
    that needed it first, e.g. the Ray trainable; a source is built once per trial)."""
    spec = labelled_source(cfg)
    try:
        source = load(spec) if source is None else source
    except (ValueError, OSError) as e:  # the spec was valid when made; a file may have gone
        raise ValueError(f"source: {e}") from None
    model_cfg = parse_model(cfg.model)
    check_before_training(cfg.train, model_cfg)  # grow: each shape a growth of the one before
    # sizes against this host's memory before any work (a sweep checks every grid point here,
    # before Ray starts); the trial checks again on its own device (run_trial)
    check_fits(cfg.train, model_cfg, source, torch.device("cpu"))
    if not cfg.train.checkpoint_steps:
        raise ValueError("train.checkpoint_steps is empty: a trial measures at checkpoints; "
                         "give at least one step, e.g. [0, 100]")
    downstream_of(source, cfg.measure)
    return source, model_cfg


def measured_tasks(cfg: TrialConfig) -> tuple[str, ...]:
    """The downstream tasks a trial measures: ``measure.tasks``, else all of its source's."""
    source, _ = validate_trial(cfg)
    return tuple(cfg.measure.tasks) or tuple(source.tasks)


def with_downstream_resolved(cfg: TrialConfig, source=None) -> TrialConfig:
    """``cfg`` with the downstream label rule and tasks spelled out (the source's defaults where
    left None / empty), so that config.json and the MLflow params say which rule, and which
    tasks, every accuracy was measured with. ``source``: ``labelled_source(cfg)`` loaded, when
    the caller has it (a source is built once per trial)."""
    source = source if source is not None else load(labelled_source(cfg))
    rule, tasks = downstream_of(source, cfg.measure)
    return dataclasses.replace(cfg, measure=dataclasses.replace(cfg.measure, label_rule=rule,
                                                                tasks=tasks))


# In a trial measured from another trial's checkpoints (``flatlm.experiments.runner``): whose.
TRAINED_BY = "trained_by.json"

def training_identity(cfg: TrialConfig, source=None) -> dict:
    """What the trained model of ``cfg`` is a function of, JSON-able: the labelled source it
    trains on (``labelled_source``, with the downstream label rule resolved), the model's shape
    (with the run's dropout) and the resolved ``train`` section, less the keys that only say
    when checkpoints are taken or logged and less the sections of other algorithms. Two trials
    with equal identities train the same model, checkpoint for checkpoint, whatever else they
    differ in (their measurements): ``flatlm.experiments.runner`` measures one from the other's
    checkpoints. ``source``: ``labelled_source(cfg)`` built, if the caller has it."""
    if cfg.measure.label_rule is None and cfg.source.kind == "pcfg":  # the source's default rule
        cfg = with_downstream_resolved(cfg, source)
    train = resolve(cfg.train)
    left_out = {*SCHEDULING_KEYS, *unused_train_sections(train.algorithm)}
    model = dataclasses.replace(parse_model(cfg.model), dropout=train.dropout)
    return {"source": labelled_source(cfg).to_dict(), "model": model.to_dict(),
            "train": {k: v for k, v in {**to_dict(train), **train.own_settings()}.items()
                      if k not in left_out}}


# Options whose None has a meaning worth a word in the logged params (other Nones: not set).
_NONE_MEANS = {"measure.flatness.n_inputs": "all", "measure.noise.n_inputs": "all",
               "measure.cka.n_inputs": "all", "measure.llc.n_beta": "n/log(n)"}


def flat_settings(cfg: TrialConfig) -> dict:
    """``to_flat_dict(cfg)`` with the settings the trial reads, defaults included: its
    algorithm's own section and those of the measurements it runs (a stored config leaves a
    section at its defaults out)."""
    read = {}
    for section in cfg.train.own_settings():
        read |= to_flat_dict(cfg.train.settings(section), f"train.{section}.")
    for section in cfg.measure.used_sections():
        read |= to_flat_dict(cfg.measure.settings(section), f"measure.{section}.")
    return {**to_flat_dict(cfg), **read}


def tracked_params(cfg: TrialConfig) -> dict:
    """The trial's config as it ran, flat (``train.lr``), for a tracking store: the algorithm's
    defaults resolved (``train.dropout``, ``train.warmup_steps``, ...), the settings of other
    algorithms and of measurements that did not run left out, and options left unset (None)
    omitted, so that every logged value is one the trial used."""
    train = resolve(cfg.train)
    if train.micro_batch_size is None:  # None = one pass (sam: each half-batch in one pass)
        train = dataclasses.replace(train, micro_batch_size=train.sentences_per_pass)
    flat = flat_settings(dataclasses.replace(cfg, train=train))
    # the sections of other algorithms, and of measurements that did not run, are not logged
    skipped = [f"train.{section}." for section in unused_train_sections(train.algorithm)]
    skipped += [f"measure.{section}." for section in unused_measure_sections(cfg.measure.what)]
    out = {}
    for key, value in flat.items():
        if key.startswith(tuple(skipped)):
            continue
        value = _NONE_MEANS.get(key) if value is None else value
        if value is not None:
            out[key] = value
    return out


MEASURE_IN = ("process", "background")  # run_trial's measure_in


# What a trial may change when it is run again in its directory: its length and its schedule of
# checkpoints and log lines (a run continued further); nothing that its records were measured by.
EXTENDABLE = ("train.steps", "train.checkpoint_steps", "train.log_every")


def check_same_config(out: Path, cfg, *, extendable: tuple[str, ...] = ()) -> None:
    """A trial directory resumes only the config it was started with (every entry point:
    ``run_trial`` checks it first, with ``EXTENDABLE`` allowed to change; ``flatlm replicate``
    allows nothing). Its ``config.json`` is read as this version's config, so a field added to
    flatlm since counts as its default; a difference is refused naming the keys that differ,
    before any work (a rerun with ``--quick`` would otherwise rewrite the config beside metrics
    measured under another)."""
    path = Path(out) / "config.json"
    if not path.exists():
        return
    saved, now = _as_current(json.loads(path.read_text()), cfg), to_dict(cfg)
    keys = [k for k in _differing(saved, now) if k not in extendable]
    if keys:
        raise ValueError(f"{out} holds a trial started with another config (its config.json "
                         f"differs in {', '.join(keys[:6])}{' ...' if len(keys) > 6 else ''}): "
                         "the settings changed since. Pass another --out, or delete that "
                         "directory to start the trial again")


def _differing(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested config dicts."""
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out += _differing(x, y, f"{prefix}{key}.")
        elif x != y:
            out.append(f"{prefix}{key}")
    return out


def _as_current(saved: dict, cfg) -> dict:
    """``saved`` (a config.json) with the fields it lacks at their defaults; as read if it no
    longer parses (a field since removed: then it differs, as it should)."""
    try:
        return to_dict(from_dict(type(cfg), saved))
    except (TypeError, ValueError):
        return saved


def run_trial(cfg: TrialConfig, out_dir: str | Path, report: Report | None = None, *,
              device: str | torch.device = "cpu", progress: bool = False,
              eval_cache: str | Path | None = None, source=None,
              on_progress: Sink | None = None, measure_in: str = "process",
              measure_prior_s: float | None = None) -> dict[int, dict]:
    """Runs (or resumes) the trial; returns step -> metrics for every checkpoint.

    ``eval_cache``: a directory where the trials of a sweep share their evaluation data and
    reference rows (``flatlm.measure.eval_cache``, ``flatlm.measure.reference_cache``); None
    computes them for this trial alone. ``progress``: console bars for training and measuring.
    Another process writing to ``out_dir`` is an error
    (``flatlm.storage.dirlock.DirectoryBusyError``) before any work. ``source``:
    ``labelled_source(cfg)`` already built by the caller, which then is not built again.
    ``on_progress``: told where the trial is (``Snapshot``: the step, or the measurement part
    under way) at least every second while training, and at once when
    a measurement part starts (``flatlm.runs.trial_progress``).
    ``measure_in``: "process" (default) measures each checkpoint here, training waiting;
    "background" only trains and saves the checkpoints, which another process measures as they
    appear (``flatlm.runs.follow``: ``flatlm measure --follow OUT``), writing the same rows.
    ``measure_prior_s``: the seconds a checkpoint's measurements are expected to take
    (``flatlm.experiments.costs.measure_prior_s``), counted in the time left until one is timed.
    """
    if measure_in not in MEASURE_IN:
        raise ValueError(f"measure_in={measure_in!r}: use one of {', '.join(MEASURE_IN)}")
    source, model_cfg = validate_trial(cfg, source)
    cfg = with_downstream_resolved(cfg, source)
    check_same_config(out_dir, cfg, extendable=EXTENDABLE)
    check_fits(cfg.train, model_cfg, source, torch.device(device))  # before the eval data too
    out_dir = Path(out_dir).absolute()
    with writer_lock(out_dir):  # one writer per trial directory (flatlm.storage.dirlock)
        watch = TrialProgress(cfg.train.steps, cfg.train.checkpoint_steps,
                              on_progress or (lambda snapshot: None),
                              measure_prior_s=measure_prior_s)
        if measure_in == "background":
            return _train_only(cfg, source, model_cfg, out_dir, device, progress, watch)
        return _run_trial(cfg, source, model_cfg, out_dir, report,
                          Runtime(device, progress, eval_cache), watch)


def run_trial_once(cfg: TrialConfig, out_dir: str | Path, report: Report | None = None,
                   **options) -> dict[int, dict]:
    """``run_trial`` (``options`` passed on), a divergence recorded in the trial's
    ``diverged.json`` (``flatlm.storage.diverged``) and raised. A trial that has one already
    raises it again before any work: the same seed would diverge at the same step. The one way
    every runner starts a trial alone (``flatlm trial``, ``flatlm replicate``, a pack's
    unpacked members)."""
    recorded = recorded_divergence(out_dir)
    if recorded is not None:
        raise recorded
    try:
        return run_trial(cfg, out_dir, report, **options)
    except Diverged as e:
        record_divergence(out_dir, e)
        raise


def recorded_divergence(out_dir: str | Path) -> Diverged | None:
    """The ``Diverged`` the trial's ``diverged.json`` records, None if it has none."""
    record = divergence(out_dir)
    if record is None:
        return None
    step, loss = record.get("step"), record.get("loss")
    reason = record.get("reason", "")  # not in records written before it was kept
    return Diverged(step if step is not None else -1, math.nan if loss is None else loss,
                    f"{reason} (recorded in {Path(out_dir) / DIVERGED_FILE}; not trained again: "
                    "delete that directory to run it anew)".lstrip())


def _train_only(cfg, source, model_cfg, out_dir: Path, device, progress,
                watch: TrialProgress) -> dict[int, dict]:
    """The training of a trial measured in another process: its checkpoints, no metrics."""
    from flatlm.train.loop import train

    write_text(out_dir / "config.json", json.dumps(to_dict(cfg), indent=2) + "\n")
    before = retrain_from(out_dir, read_metrics(out_dir), cfg.train.checkpoint_steps)
    train(cfg.train, source, model_cfg, out_dir, device=device, on_checkpoint=None,
          progress=progress, resume=True, on_step=watch.stepped, resume_before=before)
    return read_metrics(out_dir)


def _run_trial(cfg, source, model_cfg, out_dir: Path, report, runtime: Runtime,
               watch: TrialProgress) -> dict[int, dict]:
    from flatlm.train.loop import train

    measurer = TrialMeasurer(cfg, source, model_cfg, out_dir, report, runtime=runtime,
                             watch=watch)
    measurer.catch_up()
    train(cfg.train, source, model_cfg, out_dir, device=runtime.device,
          on_checkpoint=measurer, progress=runtime.progress, resume=True,
          on_step=watch.stepped, resume_before=measurer.retrain_from())
    return measurer.done


@dataclass(frozen=True)
class Runtime:
    """Where a trial's measuring side runs and what it shows, which travel together from
    ``run_trial`` / ``run_pack`` to each ``TrialMeasurer``: the device, console bars, and the
    sweep's shared evaluation cache (``run_trial``'s ``eval_cache``; None: the trial's own)."""

    device: str | torch.device = "cpu"
    progress: bool = False
    eval_cache: str | Path | None = None


@dataclass(frozen=True)
class Premeasured:
    """Measurements of one checkpoint made outside ``measure_model``: the ``MeasureConfig.what``
    names they stand for, their metrics (keys as ``measure_model`` gives them, timings
    included) and the seconds this checkpoint's share of them took."""

    names: tuple[str, ...]
    metrics: dict[str, float]
    seconds: float


class TrialMeasurer:
    """A trial's measuring side, the ``on_checkpoint`` hook of its training: writes
    ``config.json``, prepares the evaluation data, and at each checkpoint measures the model,
    records the row (``metrics.jsonl``, the checkpoint's ``metrics.json``) and reports it.
    ``run_trial`` hands one to ``train``; ``flatlm.runs.pack.run_pack`` one per member to
    ``train_pack``. ``done``: step -> metrics of every checkpoint measured so far.
    ``data``: the evaluation data already built (members of a pack measured alike share it)."""

    def __init__(self, cfg: TrialConfig, source, model_cfg, out_dir: Path, report, *,
                 runtime: Runtime, watch: TrialProgress, data: EvalData | None = None):
        self.cfg, self.source, self.out_dir, self.report = cfg, source, out_dir, report
        self.device, self.progress, self.watch = runtime.device, runtime.progress, watch
        write_text(out_dir / "config.json", json.dumps(to_dict(cfg), indent=2) + "\n")
        if data is None:
            watch.preparing("preparing the evaluation data")
            data = eval_data(source, cfg.measure, model_cfg, device=runtime.device,
                             cache_dir=runtime.eval_cache)
        self.data = data
        self.done = read_metrics(out_dir)
        self.trained_here = not (out_dir / TRAINED_BY).exists()  # else: another trial trained it

    def __call__(self, step: int, model, ckpt_dir: Path, *,
                 given: Premeasured | None = None) -> None:
        """Measures checkpoint ``step`` (``model``, saved in ``ckpt_dir``), records and reports
        it. ``given``: measurements of this model already made elsewhere (a pack's batched
        loss, ``flatlm.runs.pack_measure``), not run again; their metrics lead the row, as
        they would have come from ``measure_model``, and their seconds count in its time.
        A step measured already (a resume went back before it: a pack's members realigned, a
        damaged checkpoint trained again) keeps its row, written once (``keep_row``)."""
        if step in self.done:
            self.keep_row(step, ckpt_dir)
            return
        start = time.perf_counter()
        cfg = self.cfg.measure
        if given is not None:
            cfg = dataclasses.replace(cfg, what=tuple(w for w in cfg.what
                                                      if w not in given.names))
        measured = measure_model(model, self.source, self.data, cfg, self.device,
                                 artifact_dir=ckpt_dir, progress=self.progress,
                                 on_part=lambda part: self.watch.measuring(step, part))
        if given is not None:
            measured = {**given.metrics, **measured}
        seconds = time.perf_counter() - start + (given.seconds if given is not None else 0.0)
        metrics = {N_PARAMS: float(sum(p.numel() for p in model.parameters())), **measured,
                   **measurement_cost(seconds, ckpt_dir, self.trained_here)}
        record_checkpoint(self.out_dir, ckpt_dir, step, metrics)
        self.done[step] = {"step": step, **metrics}
        if self.report is not None:
            self.report(step, metrics, Path(ckpt_dir))
        self.watch.measured(step, time.perf_counter() - start)  # with its report: its time

    def keep_row(self, step: int, ckpt_dir: Path) -> None:
        """The row of a step measured before its checkpoint was trained again (bit for bit on
        the CPU, in distribution on CUDA) into the new checkpoint's ``metrics.json``; not
        measured, appended or reported again: ``metrics.jsonl`` holds each step once."""
        row = json.dumps(self.done[step])
        write_text(Path(ckpt_dir) / CHECKPOINT_METRICS_FILE, row + "\n")

    def retrain_from(self) -> int | None:
        """``retrain_from`` of this trial (its measured steps as recorded so far)."""
        return retrain_from(self.out_dir, self.done, self.cfg.train.checkpoint_steps)

    def catch_up(self, on_checkpoint: Callable | None = None) -> None:
        """``_catch_up``: the checkpoints a crash (or ``carry_training``) left unmeasured,
        measured by this measurer or handed to ``on_checkpoint`` (same arguments)."""
        with contextlib.nullcontext() if self.progress else quiet_transformers_bars():
            _catch_up(self.out_dir, self.done, on_checkpoint or self, self.report, self.device,
                      self.cfg.train.checkpoint_steps)


def checkpoint_metrics(model, source, data: EvalData, cfg: MeasureConfig, device,
                       ckpt_dir: Path, trained_here: bool = True, **options) -> dict:
    """A checkpoint's metrics.jsonl row (without its step): the parameter count, every
    measurement (``measure_model``, ``options`` passed on) and ``measurement_cost``."""
    start = time.perf_counter()
    measured = measure_model(model, source, data, cfg, device, artifact_dir=ckpt_dir, **options)
    return {N_PARAMS: float(sum(p.numel() for p in model.parameters())), **measured,
            **measurement_cost(time.perf_counter() - start, ckpt_dir, trained_here)}


def measurement_cost(seconds: float, ckpt_dir: Path,
                     trained_here: bool = True) -> dict[str, float]:
    """``time/measure_s``: the checkpoint's measurement wall time (at the first checkpoint also
    the evaluation data, the lookup table's and the random model's probes, done once a trial);
    ``time/train_s``: the training before it, since the previous checkpoint (or since this process
    resumed), as the checkpoint recorded it, and 0 when another trial trained it
    (``trained_here=False``: a sum over trials counts each training once); ``time/measure_share``:
    the first over the second, what measuring adds to the run's time (the paper-scale goal is
    <= 0.1)."""
    out = {"time/measure_s": seconds}
    if not trained_here:
        return {**out, "time/train_s": 0.0}
    info = json.loads((Path(ckpt_dir) / INFO_NAME).read_text())
    interval = info.get("extra", {}).get(TRAINING_INTERVAL)  # absent before it was recorded
    if interval and interval["updates"] > 0:
        out["time/train_s"] = interval["seconds"]
        out["time/measure_share"] = seconds / interval["seconds"]
    return out


def retrain_from(out_dir: Path, done: dict, steps) -> int | None:
    """The first of the checkpoint ``steps`` that must be trained again to be measured: it has
    no metrics (``done``: step -> row), no checkpoint, and its checkpoint was set aside as
    damaged (``step-N.corrupt``, ``flatlm.train.state.measurable_model``); None if there is
    none. The trial's training resumes from a checkpoint before it (``train``'s
    ``resume_before``). The set-aside directory is the record, so a run killed before it
    trained the step again finds it on the next rerun."""
    found = find_checkpoints(out_dir)
    lost = [s for s in steps if s not in done and s not in found
            and set_aside_dir(checkpoint_dir(out_dir, s)).is_dir()]
    return min(lost, default=None)


def record_checkpoint(out_dir: Path, ckpt_dir: Path, step: int, metrics: dict) -> None:
    """Writes a checkpoint's row to its ``metrics.json`` and appends it to ``metrics.jsonl``."""
    row = json.dumps({"step": step, **metrics})
    write_text(Path(ckpt_dir) / CHECKPOINT_METRICS_FILE, row + "\n")  # never through a link
    append_metrics(out_dir, step, metrics)


def _catch_up(out_dir: Path, done: dict, on_checkpoint, report, device, steps) -> None:
    """Measures the checkpoints at ``steps`` older than the newest that have no metrics, oldest
    first, then measures the newest if it has none, or reports it again.

    ``train`` does not call the hook for the checkpoint it resumes from, yet a crash can fall
    between saving it and measuring it, or between measuring it and reporting it. Re-reporting
    is safe: the sinks keep one value per step (the tracker sends a step's key once). In a resume
    only the newest can lack metrics; a trial given another trial's checkpoints
    (``flatlm.experiments.runner.carry_training``) lacks them all. An older checkpoint that
    does not load (it fails its manifest) is set aside (``measurable_model``), for the
    training to produce it again (``retrain_from``).
    """
    ckpt = newest_checkpoint(out_dir)
    if ckpt is None:
        return
    newest = int(Path(ckpt).name.split("-")[-1])
    for step, older in find_checkpoints(out_dir).items():  # ascending
        if step < newest and step in steps and step not in done:
            model = measurable_model(older)
            if model is not None:
                on_checkpoint(step, model.to(device), Path(older))
    if newest not in done:
        on_checkpoint(newest, load_checkpoint(ckpt)[0].to(device), Path(ckpt))
    elif report is not None:
        report(newest, {k: v for k, v in done[newest].items() if k != "step"}, Path(ckpt))


def printer(step: int, metrics: dict, ckpt_dir: Path, *, task: str | None = None,
            say: Callable[[str], None] | None = None) -> None:
    """A report sink for the command line: one short line per checkpoint, the keys a sweep's
    console shows (``flatlm.runs.headline``: loss, KL, Tr(F) and ``task``'s probe accuracy,
    the first task measured if ``task`` is None or not measured); the whole row is in
    ``metrics.jsonl``. ``say``: where
    the line goes (``print`` by default; ``flatlm trial`` passes its console's)."""
    measured = tuple(k.split("/")[1] for k in metrics
                     if k.startswith("probe/") and k.endswith("/acc_mean"))
    line = short_line(step, metrics, headline_keys(headline_task(measured, task)))
    if say is None:
        print(line, flush=True)
    else:
        say(line)


__all__ = ["EvalData", "Report", "TrialConfig", "TrialMeasurer", "labelled_source",
           "measured_tasks", "printer", "read_metrics", "recorded_divergence", "run_trial",
           "run_trial_once", "tracked_params",
           "training_identity", "validate_trial"]
