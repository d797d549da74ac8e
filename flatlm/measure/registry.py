"""Every measurement is one ``Measurement`` in one registry, in the order they run.

``MeasureConfig.what`` names them and ``measure_model`` runs them; the tables the rest of flatlm
needs are derived from here: the names (``measurement_names``: the config's check, the CLI's
help), what a source without the truth skips (``measure.run.skipped_without_truth``), the
MeasureConfig sections a trial logs (``unused_sections``, read by ``runs.trial.tracked_params``)
and the metric keys (``metric_keys``).

Adding one is a function and one call, in a module imported before the trial's config is built
(``tests/assets/toy_measurement.py``)::

    from flatlm.measure.registry import Measurement, register_measurement

    def param_norm(model, source, data, cfg, device, artifact_dir):
        return {"toy/param_norm": ...}

    register_measurement(Measurement(name="param_norm", run=param_norm, keys=("toy/param_norm",)))

after which ``measure.what: [..., param_norm]`` measures it at every checkpoint, after the
built-in ones. The run functions' arguments are described in ``measure.builtin``.

Settings of its own are a small frozen config dataclass given as ``config=`` with its
``section``: its keys are ``measure.<section>.<key>`` (``--set measure.param_norm.p=1``),
checked against that class when the config is built, saved in config.json and logged when the
measurement runs; the run reads them as ``cfg.settings(section)``. No ``MeasureConfig`` field is
added (``tests/assets/toy_measurement.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flatlm.core.registry import Registry
from flatlm.measure import (
    ENTROPY,
    HESSIAN_FISHER_GAP,
    KL,
    LLC_KEYS,
    LOSS,
    LOSS_DATA,
    PROBE_STATS,
    RIDGE_STATS,
    SLQ_NEGATIVE_TRACE,
    SLQ_TRACE_HESSIAN,
    TOP_EIG_FISHER,
    TOP_EIG_HESSIAN,
    TRACE_FISHER,
    TRACE_HESSIAN,
    finetune_keys,
    per_sentence_key,
    probe_key,
    ridge_stage,
    se_key,
)
from flatlm.measure.builtin import (
    check_glue_source,
    lookup_rows,
    random_init_rows,
    run_beyond_trace,
    run_critical,
    run_finetune,
    run_flatness,
    run_glue,
    run_llc,
    run_loss,
    run_precond,
    run_probe,
)
from flatlm.measure.landscape.critical import KEYS as CRITICAL_KEYS
from flatlm.measure.landscape.noise import run_noise
from flatlm.measure.landscape.precond import KEYS as PRECOND_KEYS
from flatlm.measure.representations.cka import (
    CKA_TRUTH,
    CKA_TRUTH_TOKEN,
    check_cka_source,
    random_init_cka,
    run_cka_truth,
)

# (model, source, data: EvalData, cfg: MeasureConfig, device, artifact_dir) -> metrics
Run = Callable[..., dict[str, float]]
# the downstream tasks -> keys
KeysOfTasks = Callable[[tuple[str, ...]], tuple[str, ...]]


@dataclass(frozen=True, kw_only=True)
class Reference:
    """A row measured once per trial beside a measurement and reported at every checkpoint, after
    the per-checkpoint metrics: ``run(source, data, cfg, device)`` -> metrics, or None when there
    is nothing to measure; cached in ``EvalData.reference[name]``, its time ``time/<name>_s``."""

    name: str
    run: Callable[..., dict[str, float] | None]
    # it measures the trial's shape randomly initialised: eval_data builds that model
    # (EvalData.random_model) when given the model config
    random_model: bool = False


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """One name of ``MeasureConfig.what`` and all the rest of flatlm needs to know about it."""

    name: str
    # per checkpoint; several measurements may share one run, which then runs once
    run: Run | None = None
    reference: Reference | None = None  # once per trial
    needs_truth: bool = False  # not measured on a source without the truth (Source.has_truth)
    # what a source without the truth does not get, as the trial's warning names it: the keys
    # that need the truth, or for a measurement that needs it whole, "<name>/*" by default
    without_truth: tuple[str, ...] = ()
    # the MeasureConfig sections it reads: a trial logs a section only when a measurement ran
    # that reads it
    sections: tuple[str, ...] = ()
    # the keys it always gives on a source with the truth: a tuple, a function of the downstream
    # tasks, or None where they depend on more (the model's blocks, the config, the GLUE task)
    keys: tuple[str, ...] | KeysOfTasks | None = None
    implies: tuple[str, ...] = ()  # measurements it gives too (hessian: Tr(F) beside Tr(H))
    # raises a ValueError when a source cannot give it (validate_trial calls it before any work)
    check: Callable[[Any], None] | None = None
    # a plug-in's settings: a frozen dataclass whose defaults are its section's, keys
    # measure.<section>.<key>, read by the run as cfg.settings(section); no MeasureConfig field
    # is added. The section joins ``sections`` (logged only when the measurement runs)
    config: type | None = None
    section: str | None = None  # where ``config``'s settings are; None: it has none

    def __post_init__(self):
        if not self.name or "," in self.name or self.name != self.name.strip():
            raise ValueError(f"measurement name {self.name!r}: use a word without commas")
        if self.run is None and self.reference is None:
            raise ValueError(f"measurement {self.name!r}: give a run or a reference (or both)")
        if (self.config is None) != (self.section is None) or not (
                self.section is None or (self.section.isidentifier()
                                         and dataclasses.is_dataclass(self.config))):
            raise ValueError(f"measurement {self.name!r}: config={self.config!r}, section="
                             f"{self.section!r}: give both, a dataclass of its settings and "
                             "the identifier of their section (measure.<section>.<key>), or "
                             "neither")
        if self.section is not None and self.section not in self.sections:
            object.__setattr__(self, "sections", (*self.sections, self.section))
        if self.needs_truth and not self.without_truth:
            object.__setattr__(self, "without_truth", (f"{self.name}/*",))

    def keys_for(self, tasks: Iterable[str]) -> tuple[str, ...] | None:
        return self.keys(tuple(tasks)) if callable(self.keys) else self.keys


def _check_entry(name: str, measurement: Measurement) -> None:
    """Its implied measurements are registered; its settings section is no other's."""
    unknown = [implied for implied in measurement.implies if implied not in MEASUREMENTS]
    if unknown:
        raise ValueError(f"measurement {name!r} implies {unknown}, not registered")
    others = {m.config for n, m in MEASUREMENTS.items()
              if n != name and measurement.section and m.section == measurement.section}
    for other in others - {measurement.config}:
        raise ValueError(f"measurement {name!r}: section {measurement.section!r} holds another "
                         f"measurement's settings ({other.__name__}); choose another section")


MEASUREMENTS: Registry[Measurement] = Registry(
    "measurement", key="measure.what", check=_check_entry,
    how_to_add="flatlm.measure.registry.register_measurement in a plug-in module: --plugin "
               "MODULE")


def register_measurement(measurement: Measurement, *, replace: bool = False) -> Measurement:
    """Adds ``measurement`` after those registered (it runs after them; ``replace``: in the
    place of one registered before). A name taken, or an implied measurement not registered, is
    a ValueError."""
    if not isinstance(measurement, Measurement):
        raise TypeError(f"register_measurement: expected a Measurement, got {measurement!r}")
    return MEASUREMENTS.register(measurement.name, measurement, replace=replace)


def measurement_names() -> tuple[str, ...]:
    """The names ``MeasureConfig.what`` accepts, in the order they run."""
    return tuple(MEASUREMENTS)


def settings_class(section: str) -> type | None:
    """The settings class of the registered measurements' own section ``section``, or None."""
    return next((m.config for m in MEASUREMENTS.values() if m.section == section), None)


def settings_sections() -> list[str]:
    """The sections that registered measurements' own settings are in (``measure.<section>``)."""
    return list(dict.fromkeys(m.section for m in MEASUREMENTS.values() if m.section))


def requested(what: Iterable[str], *, has_truth: bool = True) -> list[Measurement]:
    """The measurements ``what`` names and those they imply, in the order they run; with
    ``has_truth=False`` (the source has none) without those that need it."""
    names, todo = set(), list(what)
    while todo:
        name = todo.pop()
        if name not in names:
            names.add(name)
            todo += MEASUREMENTS[name].implies
    return [m for m in MEASUREMENTS.values()
            if m.name in names and (has_truth or not m.needs_truth)]


def unused_sections(what: Iterable[str]) -> list[str]:
    """The MeasureConfig sections that no measurement ``what`` asks for reads."""
    used = {section for m in requested(what) for section in m.sections}
    every = dict.fromkeys(section for m in MEASUREMENTS.values() for section in m.sections)
    return [section for section in every if section not in used]


def metric_keys(what: Iterable[str], tasks: Iterable[str]) -> tuple[str, ...]:
    """The keys the measurements ``what`` asks for always give on a source with the truth,
    on the downstream ``tasks`` (those whose keys are known in advance; no ``time/``)."""
    keys = (m.keys_for(tasks) for m in requested(what))
    return tuple(key for some in keys if some is not None for key in some)


def _loss_keys() -> tuple[str, ...]:
    """``pretrain_loss``'s keys: each quantity per token and per sentence, each with its s.e."""
    both = (k for key in (LOSS, ENTROPY, KL, LOSS_DATA) for k in (key, per_sentence_key(key)))
    return tuple(k for key in both for k in (key, se_key(key)))


def _with_se(*keys: str) -> tuple[str, ...]:
    return tuple(k for key in keys for k in (key, se_key(key)))


def _probe_rows(stage: str) -> KeysOfTasks:
    """A probe stage's keys (``measure.probe_rows``): the features' rank, each task's probe and
    its closed-form ridge twin (``<stage>_ridge/*``; given with ``probe.ridge``, the default)."""
    return lambda tasks: (
        f"{stage}/feature_rank",
        *(probe_key(task, stat, stage) for task in tasks for stat in PROBE_STATS),
        *(probe_key(task, stat, ridge_stage(stage)) for task in tasks for stat in RIDGE_STATS))


def _beyond_trace(name: str, sections: tuple[str, ...], keys=None) -> Measurement:
    """eigen, density, blocks, sharpness: the population loss's curvature (one shared run)."""
    return Measurement(name=name, run=run_beyond_trace, needs_truth=True,
                       without_truth=(f"{name} (population-loss curvature)",),
                       sections=("flatness", *sections), keys=keys)


# flatlm's own, in the order they run (the references, once per trial, after all the runs)
BUILT_IN = (
    Measurement(name="loss", run=run_loss, without_truth=(ENTROPY, KL), sections=("loss",),
                keys=_loss_keys()),
    Measurement(name="fisher", run=run_flatness, sections=("flatness",),
                keys=_with_se(TRACE_FISHER)),
    Measurement(name="hessian", run=run_flatness, implies=("fisher",),
                # without the truth, the one-hot Hessian flat/trace_hessian_data instead
                without_truth=(TRACE_HESSIAN, HESSIAN_FISHER_GAP), sections=("flatness",),
                keys=_with_se(TRACE_HESSIAN, HESSIAN_FISHER_GAP)),
    # only a reference: its place among the runs is free; before probe, since the references
    # come in this order (the lookup table's, then the random model's)
    Measurement(name="lookup", reference=Reference(name="lookup", run=lookup_rows),
                needs_truth=True, sections=("probe",), keys=_probe_rows("lookup")),
    _beyond_trace("eigen", ("spectrum",), _with_se(TOP_EIG_HESSIAN, TOP_EIG_FISHER)),
    _beyond_trace("density", ("spectrum",), _with_se(SLQ_TRACE_HESSIAN, SLQ_NEGATIVE_TRACE)),
    _beyond_trace("blocks", ()),
    _beyond_trace("sharpness", ("sharpness",)),
    # the optimizer's view of the curvature, from the checkpoint's saved optimizer state
    # (artifact_dir: the checkpoint's directory); flatness.exclude picks the parameters
    Measurement(name="precond", run=run_precond, needs_truth=True,
                without_truth=("precond (population-loss curvature)",),
                sections=("flatness", "precond"), keys=PRECOND_KEYS),
    Measurement(name="critical", run=run_critical, needs_truth=True,
                without_truth=("critical (population-loss curvature)",),
                sections=("flatness", "critical"), keys=CRITICAL_KEYS),
    # the loss's rise under weight noise, noise/loss_delta_<s> (keys: the config's scales); with
    # the trial's measure.loss settings
    Measurement(name="noise", run=run_noise, sections=("noise", "loss")),
    # the local learning coefficient by SGLD, of the population loss over the parameters
    # flatness counts (flatness.exclude)
    Measurement(name="llc", run=run_llc, needs_truth=True,
                without_truth=("llc (population-loss learning coefficient)",),
                sections=("flatness", "llc"), keys=LLC_KEYS),
    Measurement(name="probe", run=run_probe, sections=("probe",), keys=_probe_rows("probe"),
                reference=Reference(name="random_init", run=random_init_rows,
                                    random_model=True)),
    # linear CKA of the probe's features to the truth's (a pcfg's parse, an hmm's states)
    Measurement(name="cka_truth", run=run_cka_truth, needs_truth=True, sections=("cka", "probe"),
                keys=(CKA_TRUTH, CKA_TRUTH_TOKEN), check=check_cka_source,
                reference=Reference(name="cka_random_init", run=random_init_cka,
                                    random_model=True)),
    Measurement(name="finetune", run=run_finetune, sections=("finetune",),
                keys=lambda tasks: tuple(k for task in tasks for k in finetune_keys(task))),
    # GLUE fine-tuning with finetune's settings, on the GLUE tasks of a text or LM source
    Measurement(name="glue", run=run_glue, sections=("finetune",), check=check_glue_source),
)
for _measurement in BUILT_IN:
    register_measurement(_measurement)
