"""All measurements of one model at one checkpoint: ``MeasureConfig`` -> one flat metrics dict.

The evaluation data (validation sentences for the pre-training loss and flatness, labelled
downstream sentences for the probes) are drawn once per trial by ``eval_data``, so every
checkpoint of a run is measured on the same sentences and differences between checkpoints are not
sampling noise. Every probe result comes with its reference rows (``flatlm.measure``): the majority
class (in the probe's own result), the lookup table and the same probe on a randomly initialised
model of the trial's shape; the last two do not change during a trial: computed once and cached,
and with a cache directory once for every trial of a sweep (``measure.reference_cache``).
Which measurements there are, and what each needs and gives, is ``measure.registry``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from flatlm.core.config import OpenSections
from flatlm.measure.curvature.grown import check_grow_to
from flatlm.measure.eval_cache import cache_key, cached_tensors
from flatlm.measure.reference_cache import random_features_model
from flatlm.measure.registry import (
    Measurement,
    measurement_names,
    requested,
    settings_class,
    settings_sections,
)
from flatlm.measure.timing import progress_bar, record, timer
from flatlm.models.constructions import check_construction
from flatlm.models.masked_lm import non_finite_part
from flatlm.sources.base import Source
from flatlm.sources.pcfg import SPAN_RULES

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class MeasureConfig(OpenSections):
    """What to measure at each checkpoint, and on how much data. Each measurement's own
    settings are its registry entry's ``config`` (``Measurement.config``), the built-ins' as a
    plug-in's: keys measure.<section>.* as if each were a field (flatlm.core.config, "Open
    sections"), read as ``cfg.probe``, ``cfg.flatness``: loss (``LossConfig``), flatness
    (``FlatnessConfig``: fisher, hessian and the landscape's), probe (``ProbeConfig``: probe,
    lookup, cka_truth), finetune (``FinetuneConfig``: finetune, glue), spectrum (eigen,
    density), sharpness, precond, critical, noise, cka and llc."""

    OPEN_SECTIONS: ClassVar[str] = "sections"
    SECTION_KEY: ClassVar[str] = "measure"
    SECTION_OWNER: ClassVar[str] = "measurement"

    # measurements to run, from measurement_names() (measure.registry): loss (pretrain/*),
    # fisher (Tr F), hessian (Tr H and the gap to Tr F; implies fisher), probe, finetune, lookup,
    # glue (GLUE fine-tuning on a text or lm source's task files, measure.glue, with finetune's
    # settings: the GLUE tasks among measure.tasks, else all the source's GLUE tasks,
    # measure.builtin.glue_tasks_of); beyond the trace (measure.landscape): eigen (top
    # eigenvalues of H and F), density (spectral density), blocks (Tr H per block), sharpness
    # (adaptive sharpness), precond (lambda_max(P^{-1} H) with the checkpoint's Adam
    # preconditioner), critical (critical sharpness along the optimizer's next update); these
    # need the source's truth. noise (the loss's rise under relative Gaussian weight noise,
    # measure.noise); cka_truth (linear CKA of the probe's features to the truth's parse
    # posteriors, measure.cka; a pcfg or hmm source); llc (the local learning coefficient by
    # SGLD, measure.llc; needs the source's truth)
    what: tuple[str, ...] = ("loss", "fisher", "hessian", "probe", "lookup")
    # validation sentences for pretrain/* and the flatness inputs; >= 2. 4000: relative s.e. of
    # Tr(F) ~2.5% (8 sampled labels per input, bench/flatness_se.py)
    n_eval: int = 4000
    # labelled downstream sentences, shared by the tasks (80/20 train/test); >= 10. 8000: 1600
    # test sentences, s.e. of an accuracy ~1 point (bench/protocol_cpu.py); the paper 10^5
    n_downstream: int = 8000
    tasks: tuple[str, ...] = ()  # downstream tasks; () = all of the source's
    label_rule: str | None = None  # downstream label rule; None = the source's default (a
    #   PCFG's: posterior, span or inside, flatlm.sources.pcfg)
    spans: str | None = None  # a PCFG's task spans (flatlm.sources.pcfg): "depth" (the paper's
    #   text, A.1: tasks A, B, C the symbols at parse depth 1, 2, 3, over the whole sentence and
    #   its first T/2 and T/4 words, T its longest: L = 32/16/8 on the paper's grammar),
    #   "released" (B = 4, C = 2 words: the released labeling()); None = the source spec's own
    seed: int = 0  # draws the evaluation data; the estimators have their own seeds
    # the true conditionals the loss and the flatness read (the same at every checkpoint) are
    # computed at the first checkpoint and kept for the trial's later ones, on the measuring
    # device, up to this many MB (measure.truth_cache; 0: recomputed at every checkpoint, as
    # before). The gpu scale's 10^6 validation sentences of the paper's PCFG: 1526 MB (float64)
    truth_cache_mb: float = 4096.0
    # also measure flatness in this BERT shape (flat/*_grown; ``measure.grown``): the common shape
    # of a sweep over sizes, shape_string(lcm_shape(models)); None = native shape only
    grow_to: str | None = None
    # how a model grows into grow_to (flatlm.models.constructions.CONSTRUCTIONS): "paper" (B.4.2 and
    # the released enlarge.py: input embeddings / m) or "head-norm" (flatlm's earlier: the MLM
    # head's LayerNorm / m). Same function, different Tr(F): the flat/*_grown keys are this one's
    growth_construction: str = "paper"
    # further constructions measured too, under flat/*_grown_<construction> ("-" as "_"), so that
    # one trial shows Fig. 5 under each; () = none
    growth_compare: tuple[str, ...] = ()
    sections: tuple[tuple[str, Any], ...] = ()  # (section, settings) of the measurements whose
    #   settings differ from their defaults (measure.<section>.<key>: measure.probe.seeds, a
    #   plug-in's), sorted by section; a mapping is accepted. A section at its defaults is not
    #   stored, so configs that say the same compare equal; ``cfg.probe`` reads either

    @classmethod
    def section_class(cls, name: str) -> type | None:
        """The settings class of a registered measurement's own section ``name`` (not a field)."""
        return settings_class(name)

    @classmethod
    def open_section_names(cls) -> list[str]:
        return settings_sections()

    def used_sections(self) -> list[str]:
        """The sections the measurements ``what`` read, in the order they run: what the logged
        params give, defaults included, though a stored config leaves those out."""
        return list(dict.fromkeys(s for m in requested(self.what) for s in m.sections))

    def __post_init__(self):
        known = measurement_names()
        unknown = set(self.what) - set(known)
        if unknown:
            raise ValueError(f"measure.what: unknown measurement(s) {sorted(unknown)}; use any "
                             f"of {', '.join(known)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"measure.seed={self.seed!r}: use an integer >= 0 (it seeds numpy's "
                             "SeedSequence, which takes no negative entropy)")
        if not self.truth_cache_mb >= 0:
            raise ValueError(f"measure.truth_cache_mb={self.truth_cache_mb}: use a number of "
                             "MB >= 0 (0: no cache)")
        if self.n_eval < 2:
            raise ValueError(f"measure.n_eval={self.n_eval}: use at least 2 sentences")
        if self.n_downstream < 10:
            raise ValueError(f"measure.n_downstream={self.n_downstream}: use at least 10")
        if self.spans is not None and self.spans not in SPAN_RULES:
            raise ValueError(f"measure.spans={self.spans!r}: use one of {', '.join(SPAN_RULES)}, "
                             "or None for the source's own")
        if self.grow_to is not None:

            check_grow_to(self.grow_to)
        self._check_growth_constructions()
        self._check_sections()

    def _check_sections(self) -> None:
        """Each section given is a registered measurement's, of its class (stored without those
        at their defaults), and no registered section shadows a field."""
        self.check_section_names()
        self._store_sections()

    def _check_growth_constructions(self) -> None:
        check_construction(self.growth_construction, "measure.growth_construction")
        for name in self.growth_compare:
            check_construction(name, "measure.growth_compare")
        if self.growth_construction in self.growth_compare or \
                len(set(self.growth_compare)) < len(self.growth_compare):
            raise ValueError(f"measure.growth_compare={list(self.growth_compare)}: name each "
                             "construction once, and not measure.growth_construction="
                             f"{self.growth_construction!r} (its keys are flat/*_grown)")
        if self.growth_compare and self.grow_to is None:
            raise ValueError(f"measure.growth_compare={list(self.growth_compare)} needs "
                             "measure.grow_to (the shape to grow into)")


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
    # what a measurement computes once per trial and keeps (cka_truth: the truth's features)
    cache: dict = field(default_factory=dict)
    # task -> (n_downstream,) each sentence's Bayes accuracy, for the tasks whose labels the
    # sentence does not determine (Source.bayes_accuracies; the probes' bayes_ceiling)
    bayes: dict = field(default_factory=dict)


def downstream_of(source: Source, cfg: MeasureConfig) -> tuple[str, tuple[str, ...]]:
    """(label rule, tasks) that ``cfg`` measures on ``source``, the source's defaults filled in,
    or a ValueError naming the fields."""
    for measurement in requested(cfg.what):
        if measurement.check is not None:
            measurement.check(source)
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
    # not among the cached tensors (one forward-backward pass): the cache's files stay as they
    # were
    bayes = source.bayes_accuracies(t["downstream_tokens"], t["downstream_lengths"], rule,
                                    tasks, device=device)
    seconds = time.perf_counter() - start
    skipped = skipped_without_truth(source, cfg)
    if skipped:
        log.warning("%s has no exact conditionals: not measured: %s; pretrain/loss is the "
                    "one-hot validation loss", type(source).__name__, ", ".join(skipped))
    random_model = None
    if model_cfg is not None and any(m.reference and m.reference.random_model
                                     for m in requested(cfg.what)):
        random_model = random_features_model(model_cfg, source, cfg.seed)
    classes = {task: t[f"class/{task}"] for task in tasks}
    return EvalData(t["tokens"], t["lengths"], t["downstream_tokens"], t["downstream_lengths"],
                    classes, random_model, seconds=seconds, key=key, bayes=bayes,
                    cache_dir=Path(cache_dir) if cache_dir is not None else None,
                    shape=asdict(model_cfg) if model_cfg is not None else None)


def skipped_without_truth(source: Source, cfg: MeasureConfig) -> list[str]:
    """The metrics ``cfg`` asks for that ``source`` cannot give: those that need its exact
    conditionals, on a source without them (``Source.has_truth``); [] otherwise."""
    if source.has_truth:
        return []
    return [skipped for m in requested(cfg.what) for skipped in m.without_truth]


def _draw(source: Source, cfg: MeasureConfig, rule: str, tasks, device) -> dict:
    seeds = np.random.SeedSequence(cfg.seed, spawn_key=(7,)).generate_state(2)
    tokens, lengths = source.sample_validation(cfg.n_eval, int(seeds[0]))
    dtok, dlen, classes = source.sample_downstream(cfg.n_downstream, int(seeds[1]), rule=rule,
                                                   tasks=tasks, device=device)
    return {"tokens": tokens, "lengths": lengths, "downstream_tokens": dtok,
            "downstream_lengths": dlen, **{f"class/{t}": y for t, y in classes.items()}}


def measure_model(model: nn.Module, source: Source, data: EvalData, cfg: MeasureConfig,
                  device, *, artifact_dir=None, progress: bool = False,
                  on_part: Callable[[str], None] | None = None) -> dict[str, float]:
    """Every metric ``cfg.what`` asks for (keys as in ``flatlm.measure``), plus timings
    (``time/<measurement>_s``); files (the spectral density) go to ``artifact_dir`` (the
    checkpoint's directory), if given. The measurements run in the registry's order, a run
    shared by several once. ``progress``: a console bar naming the measurement under way.
    ``on_part``: told as each part starts, ``probe (3/7)`` (the reference rows not yet
    measured count as parts)."""
    chosen, out = requested(cfg.what, has_truth=source.has_truth), {}
    runs = {}  # a run shared by several measurements runs once, under the first one's name
    for m in chosen:
        if m.run is not None:
            runs.setdefault(m.run, m.name)
    pending = list(dict.fromkeys(m.reference.name for m in chosen if m.reference is not None
                                 and m.reference.name not in data.reference))
    names = [*runs.values(), *pending]  # the parts, in the order they run

    def tell(name: str) -> None:
        if on_part is not None:
            on_part(f"{name} ({names.index(name) + 1}/{len(names)})")

    broken = non_finite_part(model)  # a diverged model: what fails to measure reads NaN
    with progress_bar(progress):
        model.eval()
        for run, name in runs.items():
            tell(name)
            start = time.perf_counter()
            args = (model, source, data, cfg, device, artifact_dir)
            metrics = _run_one(run, name, [m for m in chosen if m.run == run], broken, args)
            out.update(metrics)
            # the built-in runs time their parts (time/flatness_s, time/finetune_<task>_s);
            # a registered one that does not is timed whole
            if not any(key.startswith("time/") for key in metrics):
                record(out, name, time.perf_counter() - start)
        out.update(_references(source, data, cfg, device, chosen, tell))
    return out


def _run_one(run, name: str, sharing: list, broken: str | None, args: tuple) -> dict:
    """One measurement run. On a model with weights or outputs that are not finite (``broken``
    names which: a diverged checkpoint) an estimator may fail where it would sample or
    diagonalise (Tr(F)'s labels, the spectral density's eigh): its keys then read NaN, with a
    warning, like the loss and probes, instead of ending the command."""
    try:
        return run(*args)
    except (RuntimeError, ValueError, torch.linalg.LinAlgError):
        if broken is None:
            raise
        tasks = tuple(args[2].classes)  # the eval data's downstream tasks
        keys = [k for m in sharing for k in (m.keys_for(tasks) or ())]
        if not keys:
            raise
        log.warning("the model's %s are not finite: %s reads NaN", broken, name)
        return dict.fromkeys(keys, float("nan"))


def _references(source, data: EvalData, cfg: MeasureConfig, device,
                chosen: list[Measurement], tell: Callable[[str], None]) -> dict:
    """The reference rows (the lookup table's and the random model's probe results): measured
    once per trial, on ``device``, or read from the sweep's cache (``measure.reference_cache``),
    and reported at every checkpoint; their time (``time/lookup_s``, ``time/random_init_s``) at
    that checkpoint, and at the first one ``time/eval_data_s``, drawing and labelling or reading
    the cache."""
    times = {} if data.seconds is None else {"time/eval_data_s": data.seconds}
    data.seconds = None
    for reference in (m.reference for m in chosen if m.reference is not None):
        if reference.name not in data.reference:
            tell(reference.name)
            timed = {}
            with timer(timed, reference.name):
                rows = reference.run(source, data, cfg, device)
            if rows is not None:
                data.reference[reference.name] = rows
                times.update(timed)
    return {**{k: v for metrics in data.reference.values() for k, v in metrics.items()}, **times}
