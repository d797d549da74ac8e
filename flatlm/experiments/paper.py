"""The paper's experiments, defined once: a base trial config and a grid of variants (plus, for a
search, distributions). The Ray sweeps (``sweeps/``) and the local runner (``flatlm replicate``)
run these same objects, and name their trials by one rule (``trial_name``).

============  ============================================================  ================
experiment    what varies (every grid point for each seed)                   paper
============  ============================================================  ================
steps         one model trained long under AdamW, checkpointed densely, a     Fig. 2a
              constant rate after warmup under every protocol (A.5)
sizes         the scale's models, each also measured grown into one shape     Fig. 3 / 5
algorithms    adamw, adversarial, noreg, sam (+ the lookup table, measured)   Tables 1 / 2
sgd           ``steps`` under SGD (warmup 12%, then a constant rate)          Fig. 4 / 10, B.2
selection     algorithms (x the scale's lrs) x seeds, with the top            App. D
              eigenvalues and sharpness
search        lr, beta2, weight decay, dropout drawn by a searcher (Optuna)   -
============  ============================================================  ================

Fig. 1 is not an experiment of its own: it is read from the saturated checkpoints of the others'
AdamW runs (``analysis/fig1.py``).

>>> exp = build("sizes", scale="tiny", protocol="paper-code")
>>> [name for name, _ in exp.trials()][:2]
['d16-h1-l1-i64-pre_seed0', 'd16-h1-l1-i64-pre_seed1']
>>> exp.base.measure.grow_to, exp.base.measure.growth_construction, exp.base.measure.growth_compare
('d64-h4-l2-i256-pre', 'paper', ('head-norm',))
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from flatlm.core.config import apply_overrides, refuse_varied
from flatlm.core.registry import Registry
from flatlm.experiments.grids import (
    COMPARED_ALGORITHMS,
    EXPERIMENTS,
    EXTRA_EXPERIMENTS,
    SEARCH_SPACE,
    SELECTION_ALGORITHMS,
    SELECTION_WHAT,
    trial_name,
)
from flatlm.experiments.presets import source_kind, source_overrides
from flatlm.experiments.protocols import model_for, parse_protocol, protocol_overrides
from flatlm.experiments.scales import Scale
from flatlm.experiments.scales import scale as get_scale
from flatlm.measure.curvature.grown import lcm_shape
from flatlm.models.presets import shape_string
from flatlm.runs.trial import TrialConfig, measured_tasks


@dataclass(frozen=True)
class Experiment:
    """Trials = ``base`` with each point of ``grid`` (dotted key -> values; their product);
    ``space`` holds a search's distributions (``SEARCH_SPACE``'s form), drawn by a searcher;
    ``linked`` the settings that go with a grid value (key -> value -> overrides: a sizes
    grid's per-model schedule, ``Scale.model_overrides``), applied with the point."""

    name: str  # a registered experiment (EXPERIMENT_BUILDERS)
    protocol: str  # e.g. "paper", "paper-code", "paper+inside-labels"
    scale: str  # "sweep", "tiny" or "gpu"
    base: TrialConfig
    grid: dict = field(default_factory=dict)
    space: dict = field(default_factory=dict)
    linked: dict = field(default_factory=dict)

    def points(self) -> list[dict]:
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True))
                for values in itertools.product(*(self.grid[k] for k in keys))]

    def trials(self) -> list[tuple[str, TrialConfig]]:
        """(name, config) of every grid point; the name says what the trial varies."""
        return [(trial_name(point), apply_overrides(self.base, {**self.linked_to(point), **point}))
                for point in self.points()]  # a grid value wins over a linked one (--lrs)

    def without_linked(self, settings) -> Experiment:
        """The experiment with ``settings`` (``--set`` keys) dropped from ``linked``: a value
        the command line names wins over the scale's per-model or per-algorithm one."""
        linked = {k: {v: {kk: vv for kk, vv in o.items() if kk not in settings}
                      for v, o in by.items()} for k, by in self.linked.items()}
        return dataclasses.replace(self, linked=linked)

    def linked_to(self, point: dict) -> dict:
        """The ``linked`` settings of ``point``'s values (none for a value not listed)."""
        out = {}
        for key, by_value in self.linked.items():
            out.update(by_value.get(point.get(key), {}))
        return out


def build(name: str, *, scale: str = "tiny", protocol: str = "paper",
          seeds: tuple[int, ...] | None = None, models: tuple[str, ...] | None = None,
          source: str | None = None, algorithms: tuple[str, ...] | None = None,
          overrides: dict | None = None, selection_measures: bool = True) -> Experiment:
    """Experiment ``name`` at ``scale`` under ``protocol``; ``seeds``, ``models`` (the sizes grid)
    and ``algorithms`` (the algorithms and selection grids) replace the defaults;
    ``selection_measures=False`` leaves out the scale's ``selection_what``; ``source``
    (``--source``) brings its kind's settings (``presets.source_overrides``); ``overrides``
    (``--set``) come last. Every trial's name has its seed, one seed or several."""
    builder = EXPERIMENT_BUILDERS.lookup(name)
    parse_protocol(protocol)
    sc = get_scale(scale).under(protocol)
    if source_kind(source) == "hmm":  # the sizes grid of an HMM is BiLSTMs (A.4)
        sc = dataclasses.replace(sc, models=sc.lstms)
    if models:
        sc = dataclasses.replace(sc, models=tuple(models))
    if not selection_measures:
        sc = dataclasses.replace(sc, selection_what=())
    base = apply_overrides(protocol_base(sc, protocol), source_overrides(sc, source))
    base, grid, space = builder(sc, protocol, base, algorithms)
    seeds = tuple(sc.seeds if seeds is None else seeds)
    if not seeds:
        raise ValueError("seeds: give at least one training seed")
    grid["train.seed"] = list(seeds)
    linked = {**_model_schedules(sc, protocol, grid), **_algorithm_schedules(sc, grid)}
    if overrides:
        base = apply_overrides(base, overrides)  # a bad value is named as such first
        refuse_varied(overrides, (*grid, *space), f"the {name} experiment",
                      "flatlm replicate: --seeds, --models and --algorithms choose what it varies")
    experiment = Experiment(name=name, protocol=protocol, scale=sc.name, base=base, grid=grid,
                            space=space, linked=linked)
    return experiment.without_linked(overrides or {})


def _model_schedules(sc: Scale, protocol: str, grid: dict) -> dict:
    """The scale's per-model settings (``Scale.model_overrides``) for a grid over models, under
    the protocol's model names (``-pre`` under pre-LN)."""
    if not sc.model_overrides or "model" not in grid:
        return {}
    return {"model": {model_for(m, protocol): dict(o) for m, o in sc.model_overrides.items()}}


def _algorithm_schedules(sc: Scale, grid: dict) -> dict:
    """The scale's per-algorithm settings (``Scale.algorithm_overrides``) for a grid over
    algorithms; SGD at the scale's SGD rate (``sgd_lr``, as in the sgd experiment) unless they
    name another: AdamW's rate of 1e-3 leaves SGD untrained on the CPU scales (0.3 there)."""
    if "train.algorithm" not in grid:
        return {}
    overrides = {"sgd": {"train.lr": sc.sgd_lr}, **sc.algorithm_overrides}
    return {"train.algorithm": {a: dict(overrides[a]) for a in grid["train.algorithm"]
                                if a in overrides}}  # only what the grid runs: no stray keys


def base_of(scale: str, protocol: str = "paper", source: str | None = None) -> TrialConfig:
    """The base trial of ``scale`` under ``protocol``, on ``source`` with its kind's settings:
    what every experiment there starts from."""
    parse_protocol(protocol)
    sc = get_scale(scale)  # protocol_base applies the protocol's own scale fields
    return apply_overrides(protocol_base(sc, protocol), source_overrides(sc, source))


def protocol_base(sc: Scale, protocol: str) -> TrialConfig:
    """The scale's base under ``protocol``: its overrides, the pre-LN model under ``pre-ln``,
    the deep or second grammar under theirs."""
    sc = sc.under(protocol)
    changes = {}
    if model_for(sc.model, protocol) != sc.model:
        changes["model"] = model_for(sc.model, protocol)
    switches = parse_protocol(protocol)[1]
    if {"deep-grammar", "second-grammar"} <= set(switches):
        raise ValueError(f"protocol {protocol!r}: deep-grammar and second-grammar both choose "
                         "the language; keep one")
    if "deep-grammar" in switches:
        changes["source"] = sc.deep_source
    if "second-grammar" in switches:
        if sc.second_source is None:
            raise ValueError(f"protocol {protocol!r}: the {sc.name} scale has no second grammar "
                             "(--scale testbed and testbed-v2 have one); drop +second-grammar")
        changes["source"] = sc.second_source
    scaled = {k: v for switch in switches for k, v in sc.switch_overrides.get(switch, {}).items()}
    return apply_overrides(sc.base(), {**protocol_overrides(protocol), **scaled, **changes})


def _long_run(sc: Scale, base: TrialConfig, **extra) -> TrialConfig:
    """The steps and sgd experiments' run: ``long_steps`` checkpointed densely, at a constant
    rate after warmup under every protocol (A.5, B.2: a decay to 0 would make the late
    checkpoints flatter by the schedule alone; the released code ships it too: schedules.py's
    ConstCurve, "constant_step")."""
    every = sc.long_steps // sc.checkpoints
    first = 0 if sc.long_from_zero else every
    return apply_overrides(base, {**sc.long_overrides, "train.steps": sc.long_steps,
                                  "train.checkpoint_steps":
                                  list(range(first, sc.long_steps + 1, every)),
                                  "train.schedule": "constant", **extra})


def _with_selection_measures(sc: Scale, base: TrialConfig) -> TrialConfig:
    """``base`` also measuring the scale's ``selection_what`` (none at most scales)."""
    extra = [w for w in sc.selection_what if w not in base.measure.what]
    return apply_overrides(base, {"measure.what": [*base.measure.what, *extra]}) if extra else base


def _steps(sc, protocol, base, algorithms):
    return _long_run(sc, _with_selection_measures(sc, base)), {}, {}


def _sgd(sc, protocol, base, algorithms):
    # B.2: SGD, warmup over 12% of the steps, then (a long run's) constant rate (the paper's
    # 1e-3 at GPU scale)
    return _long_run(sc, base, **{"train.algorithm": "sgd", "train.lr": sc.sgd_lr,
                                  "train.warmup_steps": None,
                                  "train.warmup_proportion": 0.12}), {}, {}


def _sizes(sc, protocol, base, algorithms):
    models = [model_for(m, protocol) for m in sc.models]
    # thirds of the run (a size's curve), unless the scale spaces its runs' checkpoints itself
    thirds = ({} if sc.run_checkpoints > 1 or sc.checkpoint_steps else {
        "train.checkpoint_steps": sc.run_steps(
        {sc.steps // 3, 2 * sc.steps // 3, sc.steps})})
    # Tr(F) of models of different sizes is compared in one parameterisation: each checkpoint
    # is also measured grown into the least common shape (flat/*_grown, Fig. 5, Table 4), by
    # the paper's construction and by the scale's others (``growth_compare``: flatlm's
    # "head-norm", flat/*_grown_head_norm): the traces differ between them, so the Fig. 5
    # verdict is shown under both; only BERTs grow, so a grid of BiLSTMs is measured in its
    # own shapes
    grown = {} if models[0].startswith("lstm-") else {
        "measure.grow_to": shape_string(lcm_shape(models)),
        **({"measure.growth_compare": list(sc.growth_compare)} if sc.growth_compare else {})}
    base = apply_overrides(_with_selection_measures(sc, base),
                           {**grown, **thirds, **sc.sizes_overrides})
    return base, {"model": models}, {}


def _algorithms(sc, protocol, base, algorithms):
    algorithms = list(algorithms or COMPARED_ALGORITHMS)
    base = _with_adversary(sc, _with_selection_measures(sc, base), "adversarial" in algorithms)
    return base, {"train.algorithm": algorithms}, {}


def _with_adversary(sc: Scale, base: TrialConfig, runs: bool) -> TrialConfig:
    """The scale's adversary settings; it attacks B (Table 1) if the trial measures B, else the
    first task measured (an HMM's task-6, Dyck's g_star). A source without tasks is refused
    where the adversarial algorithm ``runs``, else left with the defaults."""
    adversary = dict(sc.adversarial)
    if "train.adversarial.task" not in adversary:
        tasks = measured_tasks(base)
        if not tasks and not runs:
            return base
        if not tasks:
            raise ValueError(
                f"the algorithms experiment: its adversarial run attacks a downstream task, and "
                f"the source {str(base.source)!r} measures none; give a source with tasks "
                f"(GLUE files beside real text, a PCFG, an HMM) or leave it out: --algorithms "
                f"{','.join(a for a in COMPARED_ALGORITHMS if a != 'adversarial')}")
        adversary["train.adversarial.task"] = "B" if "B" in tasks else tasks[0]
    return apply_overrides(base, adversary)


def _selection(sc, protocol, base, algorithms):
    # several notions of flatness compete: the traces, the top eigenvalues, adaptive sharpness
    # (and the scale's selection measures); the rates vary too where the scale names them
    base = _with_selection_measures(sc, base)
    what = [*base.measure.what, *(w for w in SELECTION_WHAT if w not in base.measure.what)]
    grid = {"train.algorithm": list(algorithms or SELECTION_ALGORITHMS)}
    if sc.selection_lrs:
        grid["train.lr"] = list(sc.selection_lrs)
    return apply_overrides(base, {"measure.what": what}), grid, {}


def _search(sc, protocol, base, algorithms):
    return base, {}, dict(SEARCH_SPACE)


# name -> (scale, protocol, base, algorithms or None) -> (base, grid, search space): what an
# experiment changes in the protocol's base and what it varies
Builder = Callable[[Scale, str, TrialConfig, "tuple[str, ...] | None"],
                   tuple[TrialConfig, dict, dict]]
EXPERIMENT_BUILDERS: Registry[Builder] = Registry(
    "experiment", key="experiment",
    how_to_add="flatlm.experiments.paper.register_experiment in a plug-in module: --plugin "
               "MODULE")


def register_experiment(name: str, builder: Builder, *, replace: bool = False) -> Builder:
    """Adds the experiment ``name``, built by ``builder`` (see ``Builder``), for ``build``."""
    if not callable(builder):
        raise ValueError(f"register_experiment({name!r}): builder={builder!r}: give a function "
                         "(scale, protocol, base, algorithms) -> (base, grid, space)")
    return EXPERIMENT_BUILDERS.register(name, builder, replace=replace)


for _name, _builder in zip((*EXPERIMENTS, *EXTRA_EXPERIMENTS),
                           (_steps, _sizes, _algorithms, _sgd, _selection, _search), strict=True):
    register_experiment(_name, _builder)
