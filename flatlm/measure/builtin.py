"""The run functions of flatlm's own measurements; ``measure.registry`` declares them.

A per-checkpoint run is ``(model, source, data, cfg, device, artifact_dir) -> metrics`` (``data``
the trial's ``measure.run.EvalData``, ``cfg`` its ``MeasureConfig``); a run that several
measurements share (fisher and hessian, the landscape's four) runs once and reads ``cfg.what`` for
its parts. A once-per-trial reference is ``(source, data, cfg, device) -> metrics``, or None when
there is nothing to measure. Each run records its own wall time (``measure.timing.timer``:
``time/<name>_s``, advancing the progress bar when one is shown).
"""

from __future__ import annotations

from dataclasses import replace

from flatlm.measure import TRACE_FISHER, se_key
from flatlm.measure.curvature.beyond_trace import measure_beyond_trace
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.flatness import data_hessian, measure_flatness
from flatlm.measure.curvature.grown import grown_flatness, grown_model
from flatlm.measure.landscape.critical import measure_critical
from flatlm.measure.landscape.llc import measure_llc
from flatlm.measure.landscape.precond import measure_precond
from flatlm.measure.loss import pretrain_loss
from flatlm.measure.probes.finetune import finetune_accuracy
from flatlm.measure.probes.glue import glue_finetune
from flatlm.measure.probes.lookup import lookup_features
from flatlm.measure.probes.probe import encoder_probe_features, train_mode_features
from flatlm.measure.probes.probe_rows import probe_rows
from flatlm.measure.reference_cache import reference_rows
from flatlm.measure.timing import showing_progress, timer
from flatlm.measure.truth_cache import flatness_labels, loss_truth
from flatlm.sources.base import Source


def run_loss(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    out = {}
    with timer(out, "loss"):
        truth = loss_truth(source, data, cfg.loss, device, cfg.truth_cache_mb)
        out.update(pretrain_loss(model, source, data.tokens, data.lengths, cfg.loss,
                                 device=device, truth=truth))
    return out


def run_flatness(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """fisher and hessian: one run, since Tr(H) comes with Tr(F) and their gap; with
    ``cfg.grow_to`` the same again in the grown shape, by ``cfg.growth_construction`` and by
    each of ``cfg.growth_compare`` (its name in the keys)."""
    what, out = set(cfg.what), {}
    with timer(out, "flatness"):
        out.update(_flatness(model, source, data, cfg, device, what))
    if cfg.grow_to is None:
        return out
    hessian = "hessian" in what and source.has_truth
    for construction in (cfg.growth_construction, *cfg.growth_compare):
        compared = construction != cfg.growth_construction
        timed = "flatness_grown" + ("_" + construction.replace("-", "_") if compared else "")
        with timer(out, timed):
            big = grown_model(model, cfg.grow_to, construction=construction)
            out.update(grown_flatness(big, source, data.tokens, data.lengths, cfg.flatness,
                                      device, hessian=hessian,
                                      construction=construction if compared else None))
    return out


def _flatness(model, source, data, cfg, device, what) -> dict[str, float]:
    if "hessian" in what and source.has_truth:
        labels = flatness_labels(source, data, cfg.flatness, device, cfg.truth_cache_mb)
        return measure_flatness(model, source, data.tokens, data.lengths, cfg.flatness, device,
                                labels=labels)
    fisher = trace_fisher(model, data.tokens, data.lengths, cfg.flatness, device=device)
    out = {TRACE_FISHER: fisher["mean"], se_key(TRACE_FISHER): fisher["se"]}
    if "hessian" in what:  # no truth: the Hessian of the one-hot loss on the data's words
        out.update(data_hessian(model, data.tokens, data.lengths, cfg.flatness, device))
    return out


def run_beyond_trace(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """eigen, density, blocks, sharpness: one run, since eigen and density share their
    curvature operator (``measure.curvature.beyond_trace``)."""
    out = {}
    with timer(out, "landscape"):  # time/landscape_s: the committed records' key
        out.update(measure_beyond_trace(model, source, data, cfg, device, artifact_dir))
    return out


# timed whole by measure.run (time/precond_s, time/critical_s, time/llc_s), as every run that
# does not time its own parts
def run_precond(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """lambda_max(P^{-1} H) with the Adam state saved in ``artifact_dir`` (the checkpoint)."""
    return measure_precond(model, source, data.tokens, data.lengths, cfg.precond,
                           cfg.flatness.exclude, device, artifact_dir)


def run_critical(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """Critical sharpness along the next update of the optimizer saved in ``artifact_dir``."""
    return measure_critical(model, source, data.tokens, data.lengths, cfg.critical,
                            cfg.flatness.exclude, device, artifact_dir)


def run_llc(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    """The local learning coefficient by SGLD (``measure.llc``), over the parameters flatness
    counts (``flatness.exclude``)."""
    return measure_llc(model, source, data.tokens, data.lengths, cfg.llc,
                       cfg.flatness.exclude, device)


def run_probe(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    out = {}
    with timer(out, "probe"):
        out.update(_probes(model, source, data, cfg, "probe", device))
    return out


def random_init_rows(source, data, cfg, device) -> dict[str, float] | None:
    """The probe on the trial's shape randomly initialised (``EvalData.random_model``), or the
    sweep's cached rows of that shape (``measure.reference_cache``); None when eval_data built
    no such model (it was given no model config)."""
    if data.random_model is None:
        return None
    rows = reference_rows(
        data.cache_dir, data.key, "random_init", cfg.probe, device,
        lambda: _probes(data.random_model.to(device), source, data, cfg, "random_init", device),
        shape=data.shape)
    data.random_model = None  # measured: free its memory
    return rows


def lookup_rows(source, data, cfg, device) -> dict[str, float]:
    """The probe on the lookup table: the true conditionals of every position (or the sweep's
    cached rows, ``measure.reference_cache``). It has no encoder: ``probe.positions``,
    ``zero_padding`` and ``encoder_train_mode`` do not apply (its features are the T word
    positions, zero on padding); ``feature_dropout`` and the head's settings do."""
    def measure() -> dict[str, float]:
        features = lookup_features(source, data.downstream_tokens, data.downstream_lengths,
                                   device=device)
        no_encoder = replace(cfg.probe, encoder_train_mode=False)
        return probe_rows(features, source, data.classes, no_encoder, "lookup",
                          bayes=data.bayes, progress=showing_progress())

    return reference_rows(data.cache_dir, data.key, "lookup", cfg.probe, device, measure)


def _probes(model, source, data, cfg, stage: str, device) -> dict[str, float]:
    """Every task's probe on one forward pass over the downstream sentences, and the features'
    effective rank (``<stage>/feature_rank``); with ``probe.encoder_train_mode`` the heads train
    on a train-mode forward pass every epoch (``probe.train_mode_features``)."""
    probe_cfg = cfg.probe
    features = encoder_probe_features(model, data.downstream_tokens, data.downstream_lengths,
                                      device=device, batch_size=probe_cfg.forward_batch_size,
                                      positions=probe_cfg.positions,
                                      zero_padding=probe_cfg.zero_padding)
    draw = (train_mode_features(model, data.downstream_tokens, data.downstream_lengths,
                                probe_cfg, device) if probe_cfg.encoder_train_mode else None)
    return probe_rows(features, source, data.classes, probe_cfg, stage, draw=draw,
                      bayes=data.bayes, progress=showing_progress())


def run_finetune(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    out = {}
    for task, y in data.classes.items():
        with timer(out, f"finetune_{task}"):
            out.update(finetune_accuracy(model, source, data.downstream_tokens,
                                         data.downstream_lengths, y, task, cfg.finetune, device))
    return out


def run_glue(model, source, data, cfg, device, artifact_dir) -> dict[str, float]:
    out = {}
    for task in glue_tasks_of(source, data):
        with timer(out, f"glue_{task}"):
            out.update(glue_finetune(model, source, task, cfg.finetune, device))
    return out


def check_glue_source(source: Source) -> None:
    if not source.glue_tasks:
        raise ValueError("measure.what: 'glue' needs a text source with GLUE task files (text:"
                         "FILES,tokenizer=...,glue=DIR, or lm:MODEL,...,glue=DIR); drop 'glue' "
                         "or add the source's glue")


def glue_tasks_of(source: Source, data) -> tuple[str, ...]:
    """The GLUE tasks measured: those among the trial's tasks (a text source's tasks are its
    GLUE tasks), else every GLUE task of the source (an LM source probes mask-k beside them)."""
    chosen = tuple(task for task in data.classes if task in source.glue_tasks)
    return chosen or source.glue_tasks

