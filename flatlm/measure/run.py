"""All measurements of one model at one checkpoint: ``MeasureConfig`` -> one flat metrics dict.

The evaluation data (validation sentences for the pre-training loss and flatness, labelled
downstream sentences for the probes) are drawn once per trial by ``eval_data``, so every
checkpoint of a run is measured on the same sentences and differences between checkpoints are not
sampling noise. Every probe result comes with its reference rows (``flatlm.measure``): the majority
class (in the probe's own result), the lookup table and the same probe on a randomly initialised
model of the trial's shape; the last two do not change during a trial: computed once and cached,
and with a cache directory once for every trial of a sweep (``measure.reference_cache``).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from flatlm.measure import (
    ENTROPY,
    HESSIAN_FISHER_GAP,
    KL,
    TRACE_FISHER,
    TRACE_HESSIAN,
    se_key,
)
from flatlm.measure.curvature import FlatnessConfig
from flatlm.measure.eval_cache import cache_key, cached_tensors
from flatlm.measure.finetune import FinetuneConfig, finetune_accuracy
from flatlm.measure.flatness import data_hessian, measure_flatness
from flatlm.measure.landscape import WHAT as LANDSCAPE_WHAT
from flatlm.measure.landscape import measure_landscape
from flatlm.measure.lookup import lookup_features
from flatlm.measure.loss import LossConfig, pretrain_loss
from flatlm.measure.probe import ProbeConfig, encoder_probe_features
from flatlm.measure.probe_rows import probe_rows
from flatlm.measure.reference_cache import reference_rows
from flatlm.measure.sharpness import SharpnessConfig
from flatlm.measure.spectrum import SpectrumConfig
from flatlm.models.bert import build_model
from flatlm.seeds import derive_seed
from flatlm.sources.base import Source

log = logging.getLogger(__name__)

WHAT = ("loss", "fisher", "hessian", "probe", "finetune", "lookup", "glue", *LANDSCAPE_WHAT)


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """What to measure at each checkpoint, and on how much data."""

    # measurements to run, from WHAT: loss (pretrain/*), fisher (Tr F), hessian (Tr H and the
    # gap to Tr F; implies fisher), probe, finetune, lookup, glue (GLUE fine-tuning on a text or
    # lm source's task files, measure.glue, with finetune's settings: the GLUE tasks among
    # measure.tasks, else all the source's GLUE tasks, glue_tasks_of); beyond the trace
    # (measure.landscape): eigen (top eigenvalues of H and F), density (spectral density), blocks
    # (Tr H per block), sharpness (adaptive sharpness); these need the source's truth
    what: tuple[str, ...] = ("loss", "fisher", "hessian", "probe", "lookup")
    # validation sentences for pretrain/* and the flatness inputs; >= 2. 4000: relative s.e. of
    # Tr(F) ~2.5% (8 sampled labels per input, bench/flatness_se.py)
    n_eval: int = 4000
    # labelled downstream sentences, shared by the tasks (80/20 train/test); >= 10. 8000: 1600
    # test sentences, s.e. of an accuracy ~1 point (bench/protocol_cpu.py); the paper 10^5
    n_downstream: int = 8000
    tasks: tuple[str, ...] = ()  # downstream tasks; () = all of the source's
    label_rule: str | None = None  # downstream label rule; None = the source's default
    seed: int = 0  # draws the evaluation data; the estimators have their own seeds
    loss: LossConfig = field(default_factory=LossConfig)
    flatness: FlatnessConfig = field(default_factory=lambda: FlatnessConfig(n_inputs=None))
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    finetune: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(seeds=2))
    spectrum: SpectrumConfig = field(default_factory=SpectrumConfig)  # eigen, density
    sharpness: SharpnessConfig = field(default_factory=SharpnessConfig)
    # also measure flatness in this BERT shape (flat/*_grown; ``measure.grown``): the common shape
    # of a sweep over sizes, shape_string(lcm_shape(models)); None = native shape only
    grow_to: str | None = None

    def __post_init__(self):
        unknown = set(self.what) - set(WHAT)
        if unknown:
            raise ValueError(f"measure.what: unknown measurement(s) {sorted(unknown)}; use any "
                             f"of {', '.join(WHAT)}")
        if self.n_eval < 2:
            raise ValueError(f"measure.n_eval={self.n_eval}: use at least 2 sentences")
        if self.n_downstream < 10:
            raise ValueError(f"measure.n_downstream={self.n_downstream}: use at least 10")
        if self.grow_to is not None:
            from flatlm.measure.grown import check_grow_to

            check_grow_to(self.grow_to)


@dataclass
class EvalData:
    """The sentences every checkpoint of a trial is measured on."""

    tokens: torch.Tensor  # (n_eval, T) validation sentences
    lengths: torch.Tensor
    downstream_tokens: torch.Tensor  # (n_downstream, T) labelled sentences, shared by the tasks
    downstream_lengths: torch.Tensor
    classes: dict  # task -> class ids (n_downstream,), -1 = undefined for that sentence
    random_model: nn.Module | None = None  # the trial's shape, randomly initialised
    reference: dict = field(default_factory=dict)  # cached reference metrics (once per trial)
    seconds: float | None = None  # eval_data's wall time, reported at the first checkpoint
    cache_dir: Path | None = None  # where the reference rows are shared (measure.reference_cache)
    key: str = ""  # the evaluation data's cache key: part of the reference rows' keys
    shape: dict | None = None  # the random-init model's ModelConfig, as a dict


def downstream_of(source: Source, cfg: MeasureConfig) -> tuple[str, tuple[str, ...]]:
    """(label rule, tasks) that ``cfg`` measures on ``source``, the source's defaults filled in,
    or a ValueError naming the fields."""
    if "glue" in cfg.what and not source.glue_tasks:
        raise ValueError("measure.what: 'glue' needs a text source with GLUE task files (text:"
                         "FILES,tokenizer=...,glue=DIR, or lm:MODEL,...,glue=DIR); drop 'glue' "
                         "or add the source's glue")
    try:
        return source.check_downstream(cfg.label_rule, cfg.tasks)
    except ValueError as e:
        raise ValueError(f"measure.tasks / measure.label_rule: {e}") from None


def eval_data(source: Source, cfg: MeasureConfig, model_cfg=None, *, device=None,
              cache_dir=None) -> EvalData:
    """Draws the validation and downstream sentences from seeds derived from ``cfg.seed`` (the
    labels computed on ``device``); with ``cache_dir``, the trials of a sweep share them
    (``measure.eval_cache``). With ``model_cfg`` (a ``ModelConfig``) also builds the
    random-features reference model."""
    rule, tasks = downstream_of(source, cfg)
    key = cache_key(source.fingerprint(), source.spec or {}, {
        "seed": cfg.seed, "n_eval": cfg.n_eval, "n_downstream": cfg.n_downstream, "rule": rule,
        "tasks": list(tasks)})
    start = time.perf_counter()
    t = cached_tensors(cache_dir, key, lambda: _draw(source, cfg, rule, tasks, device))
    seconds = time.perf_counter() - start
    skipped = skipped_without_truth(source, cfg)
    if skipped:
        log.warning("%s has no exact conditionals: not measured: %s; pretrain/loss is the "
                    "one-hot validation loss", type(source).__name__, ", ".join(skipped))
    random_model = None
    if model_cfg is not None and "probe" in cfg.what:
        random_model = build_model(model_cfg, source.V, source.max_length,
                                   seed=derive_seed(cfg.seed, "random-features")).eval()
    classes = {task: t[f"class/{task}"] for task in tasks}
    return EvalData(t["tokens"], t["lengths"], t["downstream_tokens"], t["downstream_lengths"],
                    classes, random_model, seconds=seconds, key=key,
                    cache_dir=Path(cache_dir) if cache_dir is not None else None,
                    shape=asdict(model_cfg) if model_cfg is not None else None)


def skipped_without_truth(source: Source, cfg: MeasureConfig) -> list[str]:
    """The metrics ``cfg`` asks for that ``source`` cannot give: those that need its exact
    conditionals, on a source without them (``Source.has_truth``); [] otherwise."""
    if source.has_truth:
        return []
    what, skipped = set(cfg.what), []
    if "loss" in what:
        skipped += [ENTROPY, KL]
    if "hessian" in what:  # the one-hot Hessian flat/trace_hessian_data is measured instead
        skipped += [TRACE_HESSIAN, HESSIAN_FISHER_GAP]
    if "lookup" in what:
        skipped.append("lookup/*")
    skipped += [f"{name} (population-loss curvature)" for name in LANDSCAPE_WHAT if name in what]
    return skipped


def _draw(source: Source, cfg: MeasureConfig, rule: str, tasks, device) -> dict:
    seeds = np.random.SeedSequence(cfg.seed, spawn_key=(7,)).generate_state(2)
    tokens, lengths = source.sample_validation(cfg.n_eval, int(seeds[0]))
    dtok, dlen, classes = source.sample_downstream(cfg.n_downstream, int(seeds[1]), rule=rule,
                                                   tasks=tasks, device=device)
    return {"tokens": tokens, "lengths": lengths, "downstream_tokens": dtok,
            "downstream_lengths": dlen, **{f"class/{t}": y for t, y in classes.items()}}


def measure_model(model: nn.Module, source: Source, data: EvalData, cfg: MeasureConfig,
                  device, *, artifact_dir=None, progress: bool = False) -> dict[str, float]:
    """Every metric ``cfg.what`` asks for (keys as in ``flatlm.measure``), plus timings
    (``time/<measurement>_s``); files (the spectral density) go to ``artifact_dir`` (the
    checkpoint's directory), if given. ``progress``: a console bar naming the measurement."""
    from tqdm.auto import tqdm

    with tqdm(desc="measure", unit="part", leave=False, disable=not progress) as bar:
        token = _BAR.set(bar if progress else None)
        try:
            return _measure(model, source, data, cfg, device, artifact_dir)
        finally:
            _BAR.reset(token)


def _measure(model, source, data: EvalData, cfg: MeasureConfig, device, artifact_dir) -> dict:
    what, out = set(cfg.what), {}
    model.eval()
    if "loss" in what:
        with timer(out, "loss"):
            out.update(pretrain_loss(model, source, data.tokens, data.lengths, cfg.loss,
                                     device=device))
    if "fisher" in what or "hessian" in what:
        with timer(out, "flatness"):
            out.update(_flatness(model, source, data, cfg, device, what))
        if cfg.grow_to is not None:
            from flatlm.measure.grown import grown_flatness

            with timer(out, "flatness_grown"):
                out.update(grown_flatness(model, cfg.grow_to, source, data.tokens, data.lengths,
                                          cfg.flatness, device,
                                          hessian="hessian" in what and source.has_truth))
    if what & set(LANDSCAPE_WHAT) and source.has_truth:  # population-loss curvature
        with timer(out, "landscape"):
            out.update(measure_landscape(
                model, source, data.tokens, data.lengths, what, device, flatness=cfg.flatness,
                spectrum=cfg.spectrum, sharpness=cfg.sharpness, artifact_dir=artifact_dir))
    if "probe" in what:
        with timer(out, "probe"):
            out.update(_probes(model, source, data, cfg, "probe", device))
    if "finetune" in what:
        for task, y in data.classes.items():
            with timer(out, f"finetune_{task}"):
                out.update(finetune_accuracy(model, source, data.downstream_tokens,
                                             data.downstream_lengths, y, task, cfg.finetune,
                                             device))
    if "glue" in what:
        from flatlm.measure.glue import glue_finetune

        for task in glue_tasks_of(source, data):
            with timer(out, f"glue_{task}"):
                out.update(glue_finetune(model, source, task, cfg.finetune, device))
    out.update(_references(source, data, cfg, device, what))
    return out


def glue_tasks_of(source: Source, data: EvalData) -> tuple[str, ...]:
    """The GLUE tasks measured: those among the trial's tasks (a text source's tasks are its
    GLUE tasks), else every GLUE task of the source (an LM source probes mask-k beside them)."""
    chosen = tuple(task for task in data.classes if task in source.glue_tasks)
    return chosen or source.glue_tasks


def _probes(model, source, data: EvalData, cfg: MeasureConfig, stage: str, device) -> dict:
    """Every task's probe on one forward pass over the downstream sentences, and the features'
    effective rank (``<stage>/feature_rank``)."""
    features = encoder_probe_features(model, data.downstream_tokens, data.downstream_lengths,
                                      device=device, batch_size=cfg.probe.forward_batch_size)
    return _probe_tasks(features, source, data, cfg, stage)


def _probe_tasks(features, source, data: EvalData, cfg: MeasureConfig, stage: str) -> dict:
    return probe_rows(features, source, data.classes, cfg.probe, stage,
                      progress=_BAR.get() is not None)


def _references(source, data: EvalData, cfg: MeasureConfig, device, what) -> dict:
    """The lookup table's and the random model's probe results (computed once per trial, on
    ``device``; their time, ``time/lookup_s`` and ``time/random_init_s``, at that checkpoint,
    and at the first one ``time/eval_data_s``, drawing and labelling or reading the cache)."""
    times = {} if data.seconds is None else {"time/eval_data_s": data.seconds}
    data.seconds = None
    if "lookup" in what and source.has_truth and "lookup" not in data.reference:
        with timer(times, "lookup"):
            data.reference["lookup"] = reference_rows(
                data.cache_dir, data.key, "lookup", cfg.probe, device,
                lambda: _probe_tasks(lookup_features(source, data.downstream_tokens,
                                                     data.downstream_lengths, device=device),
                                     source, data, cfg, "lookup"))
    if "probe" in what and data.random_model is not None and "random_init" not in \
            data.reference:
        with timer(times, "random_init"):
            data.reference["random_init"] = reference_rows(
                data.cache_dir, data.key, "random_init", cfg.probe, device,
                lambda: _probes(data.random_model.to(device), source, data, cfg, "random_init",
                                device), shape=data.shape)
        data.random_model = None  # measured: free its memory
    return {**{k: v for metrics in data.reference.values() for k, v in metrics.items()}, **times}


def _flatness(model, source, data, cfg, device, what) -> dict[str, float]:
    if "hessian" in what and source.has_truth:
        return measure_flatness(model, source, data.tokens, data.lengths, cfg.flatness, device)
    from flatlm.measure.fisher import trace_fisher

    fisher = trace_fisher(model, data.tokens, data.lengths, cfg.flatness, device=device)
    out = {TRACE_FISHER: fisher["mean"], se_key(TRACE_FISHER): fisher["se"]}
    if "hessian" in what:  # no truth: the Hessian of the one-hot loss on the data's words
        out.update(data_hessian(model, data.tokens, data.lengths, cfg.flatness, device))
    return out


# The progress bar of the measure_model call under way (None: no bar), which every timed
# measurement advances: the measurements need not pass it along.
_BAR: ContextVar = ContextVar("measure_progress", default=None)


@contextmanager
def timer(out: dict, name: str):
    """Records the wall time of the block as ``time/<name>_s`` (and names it on the bar)."""
    bar = _BAR.get()
    if bar is not None:
        bar.set_description_str(f"measure {name}")
    start = time.perf_counter()
    yield
    out[f"time/{name}_s"] = time.perf_counter() - start
    if bar is not None:
        bar.update()
