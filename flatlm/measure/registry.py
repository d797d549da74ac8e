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
measurement runs; the run reads them as ``cfg.<section>`` (``cfg.settings(section)``). No
``MeasureConfig`` field is added (``tests/assets/toy_measurement.py``). The built-ins declare
theirs the same way (``cfg.probe``, ``cfg.flatness``), by ``"module:Class"`` so that this module
loads without torch; several measurements may read one section (flatness: nine).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from flatlm.core.registry import LazyRef, Registry, load_ref
from flatlm.measure import (
    CKA_TRUTH,
    CKA_TRUTH_TOKEN,
    CRITICAL_KEYS,
    CRITICAL_SHARPNESS,
    ENTROPY,
    HESSIAN_FISHER_GAP,
    KL,
    LLC,
    LLC_KEYS,
    LOSS,
    LOSS_DATA,
    NOISE_PREFIX,
    PRECOND_KEYS,
    PRECOND_SHARPNESS,
    PROBE_STATS,
    RIDGE_STATS,
    SHARPNESS_AVG,
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
    sharpness_worst_key,
)

BUILTIN = "flatlm.measure.builtin"  # the built-in runs, imported (with torch) on their first call
CKA = "flatlm.measure.representations.cka"
NATS = "nats/token"  # the loss, the entropy, the KL and the noise's loss rise are per masked token

# (model, source, data: EvalData, cfg: MeasureConfig, device, artifact_dir) -> metrics; or
# "module:name", imported on its first call (so that this table loads without torch: the analysis
# layer reads it)
Run = Callable[..., dict[str, float]] | str
# the downstream tasks -> keys
KeysOfTasks = Callable[[tuple[str, ...]], tuple[str, ...]]


@dataclass(frozen=True, kw_only=True)
class Quantity:
    """What one of a measurement's keys measures, as the figures, tables and the leaderboard of
    ``analysis`` read it: its name in words and unit, and whether it competes as a selector."""

    key: str  # the metric key, or with ``family`` the start of its keys ("noise/loss_delta_")
    label: str  # in words: "Tr(F), Fisher trace"; a family's: "... {}", the rest of the key
    unit: str | None = None  # what the figures' axes add in parentheses: "nats/token"
    family: bool = False  # ``key`` is a prefix: one key per setting (noise scale, CKA level)
    # in analysis.leaderboard as a model selector: its lowest value picked (flatter), or with
    # ``higher_picked`` its highest (more truth-like)
    leaderboard: bool = False
    higher_picked: bool = False
    # comparable between models of different shapes as it is (nats, features, an effective
    # parameter count), not in each model's own parameterisation (analysis.leaderboard)
    shape_free: bool = False

    def __post_init__(self):
        if not self.key or self.key.endswith("_se") or not self.label:
            raise ValueError(f"quantity {self.key!r}: give a metric key (not its _se twin) and "
                             "a label")
        if self.higher_picked and not self.leaderboard:
            raise ValueError(f"quantity {self.key!r}: higher_picked is a leaderboard setting; "
                             "give leaderboard=True too")

    def covers(self, key: str) -> bool:
        return key.startswith(self.key) if self.family else key == self.key

    def name_of(self, key: str) -> str:
        """``key``'s name in words: a family's label filled with the rest of the key, less a
        leading "_" (``flat/trace_fisher_grown_head_norm``: "head_norm")."""
        if not self.family:
            return self.label
        return self.label.format(key.removeprefix(self.key).removeprefix("_"))


@dataclass(frozen=True, kw_only=True)
class Reference:
    """A row measured once per trial beside a measurement and reported at every checkpoint, after
    the per-checkpoint metrics: ``run(source, data, cfg, device)`` -> metrics, or None when there
    is nothing to measure; cached in ``EvalData.reference[name]``, its time ``time/<name>_s``."""

    name: str
    run: Callable[..., dict[str, float] | None] | str  # or "module:name", as Measurement.run

    def __post_init__(self):
        if isinstance(self.run, str):
            object.__setattr__(self, "run", LazyRef(self.run))
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
    check: Callable[[Any], None] | str | None = None
    # its settings: a frozen dataclass (or "module:Class") whose defaults are its section's, keys
    # measure.<section>.<key>, read by the run as cfg.<section>; no MeasureConfig field is
    # added. The section joins ``sections`` (logged only when the measurement runs)
    config: type | str | None = None
    section: str | None = None  # where ``config``'s settings are; None: it has none
    # its keys as the analysis layer reads them (labels, units, leaderboard selectors)
    quantities: tuple[Quantity, ...] = ()
    # the time/<timing>_s that covers its keys: its run's own timer where the run times itself
    # (several measurements sharing one), else its name (measure.run times the run whole)
    timing: str | None = None

    def __post_init__(self):
        for hook in ("run", "check"):
            if isinstance(getattr(self, hook), str):
                object.__setattr__(self, hook, LazyRef(getattr(self, hook)))
        if self.timing is None:
            object.__setattr__(self, "timing", self.name)
        if not self.name or "," in self.name or self.name != self.name.strip():
            raise ValueError(f"measurement name {self.name!r}: use a word without commas")
        if self.run is None and self.reference is None:
            raise ValueError(f"measurement {self.name!r}: give a run or a reference (or both)")
        if isinstance(self.config, str):
            LazyRef(self.config)  # "module:name", or a ValueError naming the form
        if (self.config is None) != (self.section is None) or not (
                self.section is None or (self.section.isidentifier() and (
                    isinstance(self.config, str) or dataclasses.is_dataclass(self.config)))):
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
        # a class and "module:Class" of the same one (imported only here, for a plug-in)
        if load_ref(other) is not load_ref(measurement.config):
            raise ValueError(f"measurement {name!r}: section {measurement.section!r} holds "
                             f"another measurement's settings ({_class_name(other)}); choose "
                             "another section")


def _class_name(config: type | str) -> str:
    return config.rsplit(":", 1)[-1] if isinstance(config, str) else config.__name__


MEASUREMENTS: Registry[Measurement] = Registry(
    "measurement", key="measure.what", check=_check_entry,
    how_to_add="flatlm.measure.registry.register_measurement in a plug-in module: --plugin "
               "MODULE")


def register_measurement(measurement: Measurement, *, replace: bool = False) -> Measurement:
    """Adds ``measurement`` after those registered (it runs after them; ``replace``: in the
    place of one registered before). A name taken, or an implied measurement not registered, is
    a ValueError."""
    return MEASUREMENTS.add(measurement, Measurement, "register_measurement", replace=replace)


def measurement_names() -> tuple[str, ...]:
    """The names ``MeasureConfig.what`` accepts, in the order they run."""
    return tuple(MEASUREMENTS)


def settings_class(section: str) -> type | None:
    """The settings class of the registered measurements' own section ``section``, or None."""
    return load_ref(next((m.config for m in MEASUREMENTS.values() if m.section == section),
                         None))


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


def quantities() -> list[tuple[Measurement, Quantity]]:
    """Every registered measurement's quantities with it, in the order they run."""
    return [(m, q) for m in MEASUREMENTS.values() for q in m.quantities]


def quantity_of(key: str) -> tuple[Measurement, Quantity] | None:
    """What says what ``key`` measures: the quantity naming it, else the first registered family
    it belongs to; None where no measurement declares it."""
    every = quantities()
    exact = (pair for pair in every if not pair[1].family and pair[1].covers(key))
    return next(exact, None) or next((p for p in every if p[1].covers(key)), None)


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


# the built-ins' settings classes, by where they are (their modules import torch)
LOSS_SETTINGS = "flatlm.measure.loss:LossConfig"
FLATNESS_SETTINGS = "flatlm.measure.curvature.common:FlatnessConfig"
SPECTRUM_SETTINGS = "flatlm.measure.curvature.spectrum:SpectrumConfig"
SHARPNESS_SETTINGS = "flatlm.measure.landscape.sharpness:SharpnessConfig"
PRECOND_SETTINGS = "flatlm.measure.landscape.precond:PrecondConfig"
CRITICAL_SETTINGS = "flatlm.measure.landscape.critical:CriticalConfig"
NOISE_SETTINGS = "flatlm.measure.landscape.noise:NoiseConfig"
LLC_SETTINGS = "flatlm.measure.landscape.llc:LLCConfig"
PROBE_SETTINGS = "flatlm.measure.probes.probe:ProbeConfig"
CKA_SETTINGS = "flatlm.measure.representations.cka:CKAConfig"
FINETUNE_SETTINGS = "flatlm.measure.probes.finetune:FinetuneConfig"


def _beyond_trace(name: str, keys=None, quantities: tuple[Quantity, ...] = (),
                  **own) -> Measurement:
    """eigen, density, blocks, sharpness: the population loss's curvature (one shared run,
    timed as time/landscape_s: the committed records' key), with flatness's settings and
    ``own`` (config=, section=) besides."""
    return Measurement(name=name, run=f"{BUILTIN}:run_beyond_trace", needs_truth=True,
                       without_truth=(f"{name} (population-loss curvature)",),
                       sections=("flatness",), keys=keys, quantities=quantities,
                       timing="landscape", **own)


def _grown(key: str, label: str) -> tuple[Quantity, ...]:
    """A trace's twins in the grown shape (``grown_key``): by the default construction, and a
    family of one per construction of ``measure.growth_compare``; comparable across shapes."""
    return (Quantity(key=f"{key}_grown", label=f"grown {label}, in one common shape",
                     shape_free=True),
            Quantity(key=f"{key}_grown", label=f"grown {label}, {{}} construction", family=True,
                     leaderboard=True, shape_free=True))


# flatlm's own, in the order they run (the references, once per trial, after all the runs); the
# leaderboard's selectors are their quantities with leaderboard=True (analysis.leaderboard)
BUILT_IN = (
    Measurement(name="loss", run=f"{BUILTIN}:run_loss", without_truth=(ENTROPY, KL),
                config=LOSS_SETTINGS, section="loss", keys=_loss_keys(), quantities=(
                    Quantity(key=KL, label="KL to the truth", unit=NATS),
                    Quantity(key=LOSS, label="pre-training loss", unit=NATS, shape_free=True),
                    Quantity(key=ENTROPY, label="entropy of the truth", unit=NATS))),
    Measurement(name="fisher", run=f"{BUILTIN}:run_flatness", config=FLATNESS_SETTINGS,
                section="flatness", keys=_with_se(TRACE_FISHER), timing="flatness", quantities=(
                    Quantity(key=TRACE_FISHER, label="Tr(F), Fisher trace", leaderboard=True),
                    *_grown(TRACE_FISHER, "Tr(F)"))),
    Measurement(name="hessian", run=f"{BUILTIN}:run_flatness", implies=("fisher",),
                # without the truth, the one-hot Hessian flat/trace_hessian_data instead
                without_truth=(TRACE_HESSIAN, HESSIAN_FISHER_GAP), config=FLATNESS_SETTINGS,
                section="flatness",
                keys=_with_se(TRACE_HESSIAN, HESSIAN_FISHER_GAP), timing="flatness",
                quantities=(
                    Quantity(key=TRACE_HESSIAN, label="Tr(H), Hessian trace", leaderboard=True),
                    Quantity(key=HESSIAN_FISHER_GAP, label="Tr(H) - Tr(F)"),
                    *_grown(TRACE_HESSIAN, "Tr(H)"))),
    # only a reference: its place among the runs is free; before probe, since the references
    # come in this order (the lookup table's, then the random model's)
    Measurement(name="lookup", reference=Reference(name="lookup", run=f"{BUILTIN}:lookup_rows"),
                needs_truth=True, config=PROBE_SETTINGS, section="probe",
                keys=_probe_rows("lookup")),
    _beyond_trace("eigen", _with_se(TOP_EIG_HESSIAN, TOP_EIG_FISHER), (
        Quantity(key=TOP_EIG_HESSIAN, label="top eigenvalue of H", leaderboard=True),
        Quantity(key=TOP_EIG_FISHER, label="top eigenvalue of F", leaderboard=True)),
        config=SPECTRUM_SETTINGS, section="spectrum"),
    _beyond_trace("density", _with_se(SLQ_TRACE_HESSIAN, SLQ_NEGATIVE_TRACE), (
        Quantity(key=SLQ_TRACE_HESSIAN, label="Tr(H) by Lanczos quadrature"),),
        config=SPECTRUM_SETTINGS, section="spectrum"),
    _beyond_trace("blocks"),
    _beyond_trace("sharpness", quantities=(
        *(Quantity(key=sharpness_worst_key(norm), label=f"worst-case sharpness, {name}",
                   leaderboard=True) for norm, name in (("linf", "L-inf"), ("l2", "L2"))),
        Quantity(key=sharpness_worst_key(""), label="worst-case sharpness, {}", family=True),
        Quantity(key=SHARPNESS_AVG, label="average sharpness", leaderboard=True)),
        config=SHARPNESS_SETTINGS, section="sharpness"),
    # the optimizer's view of the curvature, from the checkpoint's saved optimizer state
    # (artifact_dir: the checkpoint's directory); flatness.exclude picks the parameters
    Measurement(name="precond", run=f"{BUILTIN}:run_precond", needs_truth=True,
                without_truth=("precond (population-loss curvature)",),
                sections=("flatness",), config=PRECOND_SETTINGS, section="precond",
                keys=PRECOND_KEYS, quantities=(
                    Quantity(key=PRECOND_SHARPNESS, label="preconditioned sharpness (Adam)",
                             leaderboard=True),
                    Quantity(key=PRECOND_KEYS[2], label="preconditioned sharpness x lr"),
                    Quantity(key=PRECOND_KEYS[3],
                             label="preconditioned sharpness / Adam's edge"))),
    Measurement(name="critical", run=f"{BUILTIN}:run_critical", needs_truth=True,
                without_truth=("critical (population-loss curvature)",),
                sections=("flatness",), config=CRITICAL_SETTINGS, section="critical",
                keys=CRITICAL_KEYS, quantities=(
                    Quantity(key=CRITICAL_SHARPNESS, label="critical sharpness, 2 / critical rate",
                             leaderboard=True, shape_free=True),
                    Quantity(key=CRITICAL_KEYS[2], label="critical rate"),
                    Quantity(key=CRITICAL_KEYS[3], label="critical sharpness x lr"),
                    Quantity(key=CRITICAL_KEYS[4], label="curvature along the update"))),
    # the loss's rise under weight noise, noise/loss_delta_<s> (keys: the config's scales); with
    # the trial's measure.loss settings
    Measurement(name="noise", run="flatlm.measure.landscape.noise:run_noise",
                config=NOISE_SETTINGS, section="noise", sections=("loss",), quantities=(
                    Quantity(key=NOISE_PREFIX, label="loss rise under weight noise {}",
                             family=True, leaderboard=True, shape_free=True),)),
    # the local learning coefficient by SGLD, of the population loss over the parameters
    # flatness counts (flatness.exclude)
    Measurement(name="llc", run=f"{BUILTIN}:run_llc", needs_truth=True,
                without_truth=("llc (population-loss learning coefficient)",),
                sections=("flatness",), config=LLC_SETTINGS, section="llc", keys=LLC_KEYS,
                quantities=(
                    Quantity(key=LLC, label="local learning coefficient", leaderboard=True,
                             shape_free=True),)),
    Measurement(name="probe", run=f"{BUILTIN}:run_probe", config=PROBE_SETTINGS,
                section="probe",
                keys=_probe_rows("probe"),
                reference=Reference(name="random_init", run=f"{BUILTIN}:random_init_rows",
                                    random_model=True)),
    # linear CKA of the probe's features to the truth's (a pcfg's parse, an hmm's states); the
    # leaderboard picks the most truth-like, every cka/truth* key but the random-init twins
    Measurement(name="cka_truth", run=f"{CKA}:run_cka_truth", needs_truth=True,
                config=CKA_SETTINGS, section="cka", sections=("probe",),
                keys=(CKA_TRUTH, CKA_TRUTH_TOKEN),
                check=f"{CKA}:check_cka_source",
                reference=Reference(name="cka_random_init", run=f"{CKA}:random_init_cka",
                                    random_model=True), quantities=(
                    Quantity(key=CKA_TRUTH, label="CKA to the truth, per sentence"),
                    Quantity(key=CKA_TRUTH_TOKEN, label="CKA to the truth, per word"),
                    Quantity(key=CKA_TRUTH, label="CKA to the truth, {}", family=True,
                             leaderboard=True, higher_picked=True, shape_free=True))),
    Measurement(name="finetune", run=f"{BUILTIN}:run_finetune", config=FINETUNE_SETTINGS,
                section="finetune",
                keys=lambda tasks: tuple(k for task in tasks for k in finetune_keys(task))),
    # GLUE fine-tuning with finetune's settings, on the GLUE tasks of a text or LM source
    Measurement(name="glue", run=f"{BUILTIN}:run_glue", config=FINETUNE_SETTINGS,
                section="finetune",
                check=f"{BUILTIN}:check_glue_source"),
)
for _measurement in BUILT_IN:
    register_measurement(_measurement)
