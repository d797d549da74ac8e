"""What a sweep is (``Sweep``) and what follows from its base config: checks, the downstream task
it is judged on, the metrics shown per result, its view in the MLflow UI and the searcher's
objectives. No Ray here.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

from flatlm.core.config import apply_overrides
from flatlm.experiments.grids import trial_name
from flatlm.experiments.layers import DEFAULT, base_layers, grid_layers
from flatlm.measure import (
    KL,
    LOSS,
    PROBE_STAGES,
    TRACE_FISHER,
    TRACE_HESSIAN,
    probe_key,
    probe_keys,
    ridge_stage,
)
from flatlm.measure.registry import metric_keys
from flatlm.runs.headline import display_columns, headline_keys, headline_task
from flatlm.runs.pack import check_pack_request, check_pack_size, group_packs
from flatlm.runs.trial import TrialConfig, measured_tasks, validate_trial
from flatlm.storage.metrics_log import N_PARAMS
from flatlm.tracking.tracker import check_tracking_uri as check
from flatlm.tracking.ui import RUNS_VIEW_ID, description_tag, runs_view_tag

MODEL, SEED = "model", "train.seed"  # params every trial logs: the runs table shows them


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """One experiment: trials = base config x search space."""

    name: str  # MLflow experiment and Ray experiment name
    scale: str | None = None  # where the base runs (flatlm.experiments.scales): the runs' tag
    protocol: str | None = None  # how (flatlm.experiments.protocols): the runs' tag
    base: TrialConfig  # what every trial shares
    space: dict = field(default_factory=dict)  # dotted key -> tune.grid_search([...]) or a
    #   distribution (tune.loguniform, ...); the same keys as --set
    cpus_per_trial: float = 1.0  # Ray CPUs per trial (Ray sets OMP threads to match)
    gpus_per_trial: float = 0.0  # fractional: 0.25 packs four small trials on one GPU
    num_samples: int = 1  # repeats of the grid, or trials drawn by a searcher
    max_concurrent: int = 0  # with a searcher: trials in flight (0 = Ray's default)
    objectives: tuple[tuple[str, str], ...] = ()  # (metric, "min"|"max") for a searcher;
    #   () = maximise the probe accuracy of the sweep's task (sweep_task)
    searcher: str | None = None  # None (grid / random) or "optuna"
    max_failures: int = 3  # retries of a failed trial from its last checkpoint
    analysis_task: str | None = None  # downstream task the sweep is judged on; None = the
    #   task the adversary attacks when the sweep trains one (Table 1: B), else the first task
    #   the base config measures (measure.tasks, else the source's)
    kl_threshold: float = 0.1  # saturation rule of the closing correlations: checkpoints with
    #   pretrain/kl below it (nats per token); correlations need one (analysis/correlate.py)
    loss_tolerance: float | None = None  # the rule instead, when set: pretrain/loss within it
    #   of the entropy, or, for a source without a truth (real text), of the lowest loss reached
    selection: bool = False  # the summary prints the whole model-selection table
    #   (analysis/selection.py), not only its verdict
    pack: int = 1  # the most grid points of one shape trained as one model in one Ray trial
    #   (flatlm.runs.pack), each still its own MLflow run; 1 = every trial alone


def sweep_task(sweep: Sweep) -> str:
    """The downstream task the sweep's summary and default objective use."""
    tasks = measured_tasks(sweep.base)
    if not tasks:
        raise ValueError(f"source {sweep.base.source}: no downstream task to judge the sweep "
                         "on; give the source tasks (a text source's glue=DIR) or "
                         "measure.tasks")
    if sweep.analysis_task is None:
        return headline_task(tasks, attacked_task(sweep))
    if sweep.analysis_task not in tasks:
        raise ValueError(f"analysis_task {sweep.analysis_task!r} is not measured by this sweep "
                         f"(it measures {', '.join(tasks)}); pick one of those, or add it to "
                         "measure.tasks")
    return sweep.analysis_task


def attacked_task(sweep: Sweep) -> str | None:
    """The task the base config's adversarial objective attacks (``train.adversarial.task``,
    which the algorithms experiment sets: B, as Table 1 reads it), else None."""
    return sweep.base.train.adversarial.task


def accuracy_key(sweep: Sweep) -> str:
    """``probe/<task>/acc_mean`` of the sweep's task: what its correlations are with."""
    return probe_keys(sweep_task(sweep))[0]


def saturation(sweep: Sweep) -> dict:
    """The closing summary's saturation rule, as the keyword analysis/correlate.py takes."""
    if sweep.loss_tolerance is not None:
        return {"loss_tolerance": sweep.loss_tolerance}
    return {"kl_threshold": sweep.kl_threshold}


def saturation_flag(sweep: Sweep) -> str:
    """The same rule as analysis/report.py's flag: ``--kl-threshold 0.05``."""
    ((key, value),) = saturation(sweep).items()
    return f"--{key.replace('_', '-')} {value:g}"


def shown_metrics(sweep: Sweep) -> tuple[str, ...]:
    """The metrics printed for every reported checkpoint: ``flatlm.runs.headline``'s, the ones
    ``flatlm trial`` prints, of the sweep's task."""
    return headline_keys(sweep_task(sweep))


def grid_points(sweep: Sweep) -> list[dict]:
    """Every point of the sweep's grid (its grid searches' product) as overrides, the last key
    varying fastest."""
    grid = {k: v["grid_search"] for k, v in sweep.space.items()
            if isinstance(v, dict) and "grid_search" in v}
    points = [{}]
    for key, values in grid.items():
        points = [{**p, key: v} for p in points for v in values]
    return points


def packs(sweep: Sweep) -> list[list[dict]]:
    """The grid's points cut into packs (``flatlm.runs.pack.group_packs``, at most
    ``sweep.pack`` points of one shape each): one Ray trial per pack."""
    points = grid_points(sweep)
    cfgs = [apply_overrides(sweep.base, p) for p in points]
    return [[points[k] for k in pack] for pack in group_packs(cfgs, sweep.pack)]


def ray_trials(sweep: Sweep) -> int:
    """How many Ray trials the sweep runs: its trials, or its packs' count with ``--pack``."""
    if sweep.pack == 1:
        return planned_trials(sweep)
    return len(packs(sweep)) * sweep.num_samples


def planned_trials(sweep: Sweep) -> int:
    """How many trials the sweep runs: the grid's points times ``num_samples`` (a searcher's
    or a distribution's draws: ``num_samples``)."""
    points = 1
    for values in sweep.space.values():
        if isinstance(values, dict) and "grid_search" in values:
            points *= len(values["grid_search"])
    return points * sweep.num_samples


def grid_trials(sweep: Sweep) -> list[tuple[dict, TrialConfig]]:
    """(grid point, its trial config) of every point of the sweep's grid searches, as Ray
    builds them (the base with the point applied); a distribution's key is drawn per trial, so
    it keeps the base's value here."""
    grids = {k: v["grid_search"] for k, v in sweep.space.items()
             if isinstance(v, dict) and "grid_search" in v}
    points = [dict(zip(grids, values, strict=True)) for values in itertools.product(
        *grids.values())]
    return [(point, apply_overrides(sweep.base, point)) for point in points]


def trial_layers(sweep: Sweep, built: TrialConfig,
                 source: str | None = None) -> list[tuple[str, list]]:
    """(trial name, its layers) of every grid point (``flatlm.experiments.layers``): the scale's,
    protocol's and ``source``'s layers, the sweep's base as its script ``built`` it, the
    command line's ``--set`` (``sweep.base``), then the grid point. A sweep of no known scale
    (one's own script) starts from the defaults."""
    head = (base_layers(sweep.scale, sweep.protocol or "paper", source) if sweep.scale
            else [(DEFAULT, TrialConfig())])
    trials = [(trial_name(point), cfg) for point, cfg in grid_trials(sweep)]
    layers = grid_layers([*head, (f"sweep {sweep.name}", built)], sweep.base, trials)
    return [(name, one) for (name, _), one in zip(trials, layers, strict=True)]


def drawn_keys(sweep: Sweep) -> list[str]:
    """The keys of the sweep's space that a distribution or a searcher draws."""
    return [k for k, v in sweep.space.items() if not (isinstance(v, dict) and "grid_search" in v)]


def runs_view(sweep: Sweep) -> dict[str, str]:
    """The experiment tag of the sweep's saved view in the MLflow UI (``flatlm.tracking.ui``):
    the runs table with the headline metrics rounded (``display_columns``), the model, seed and
    what else the sweep varies, then the headline metrics exact as columns; the charts (of the
    exact values) led by the loss and KL, each measured task's probe accuracy, then the
    flatness traces, then the other measurements' sections, the standard errors' last and
    folded."""
    tasks = measured_tasks(sweep.base)
    probes = [probe_keys(t)[0] for t in tasks]
    # what the measurements give (registry), and the probes' references per task
    references = [probe_key(t, stat, s) for stage in PROBE_STAGES for s in (stage,
                  ridge_stage(stage)) for t in tasks for stat in ("acc_mean", "acc_se")]
    key, value = runs_view_tag(
        display=display_columns(tasks).values(),
        params=dict.fromkeys([MODEL, SEED, *varied(sweep)]),  # model and seed first, once
        columns=[LOSS, KL, *probes, TRACE_FISHER, N_PARAMS],
        charts=[LOSS, KL, *probes, TRACE_FISHER, TRACE_HESSIAN], log_scale=[KL],
        metrics=[*metric_keys(sweep.base.measure.what, tasks), *references, N_PARAMS])
    return {key: value}


def experiment_tags(sweep: Sweep) -> dict[str, str]:
    """The tags the sweep's MLflow experiment carries: its saved view and its description."""
    return {**runs_view(sweep), **description_tag(description(sweep))}


def description(sweep: Sweep) -> str:
    """What the experiment is, for whoever opens MLflow without the printed address: the
    sweep, what varies, what each run holds, the saved view and the model-training switch."""
    where = ", ".join(x for x in (sweep.scale and f"{sweep.scale} scale",
                                  sweep.protocol and f"{sweep.protocol} protocol") if x)
    varies = ", ".join(varied(sweep)) or "nothing (one grid point)"
    tasks = ", ".join(measured_tasks(sweep.base)) or "none"
    return (f"flatlm sweep {sweep.name} ({where or 'its own base'}): "
            f"{planned_trials(sweep)} trial(s) of {sweep.base.model} on {sweep.base.source}, "
            f"varying {varies}. Each run is one trial; its metrics are logged at every "
            f"checkpoint (x axis: the training step): pre-training loss ({LOSS}), "
            f"KL to the true conditionals ({KL}), traces of the Fisher and Hessian "
            f"({TRACE_FISHER}, {TRACE_HESSIAN}), linear-probe accuracy per task ({tasks}: "
            f"{probe_keys('<task>')[0]}); a standard error is se/<key>. Columns and charts in "
            f"reading order: the saved view '{RUNS_VIEW_ID}' (the Views menu above the runs "
            "table). If this page opens on traces (MLflow's GenAI view), switch the "
            "experiment type to machine learning / model training.")


def varied(sweep: Sweep) -> list[str]:
    """The keys of the search space that take more than one value (a grid of one, such as the
    sizes experiment's single seed, is not shown as varying)."""
    return sorted(key for key, values in sweep.space.items()
                  if not (isinstance(values, dict) and len(values.get("grid_search", ())) == 1))


def objectives(sweep: Sweep) -> tuple[tuple[str, str], ...]:
    """The searcher's (metric, mode) pairs: the sweep's own, else max the task's accuracy."""
    return sweep.objectives or ((accuracy_key(sweep), "max"),)


def check_pack(sweep: Sweep, points: list[dict]) -> None:
    """``--pack K``: a whole number >= 1; above 1, a grid (a searcher's or a distribution's
    trials are drawn one at a time) and no algorithm that cannot be packed."""
    check_pack_size(sweep.pack)
    if sweep.pack == 1:
        return
    drawn = [k for k, v in sweep.space.items() if not (isinstance(v, dict) and "grid_search" in v)]
    if sweep.searcher is not None or drawn:
        raise ValueError(f"--pack {sweep.pack}: packs group a grid's points, and this sweep "
                         f"draws its trials ({'a searcher' if sweep.searcher else ''}"
                         f"{', '.join(drawn)}); pass --pack 1")
    check_pack_request([apply_overrides(sweep.base, p) for p in points], sweep.pack)


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")  # a sweep name: one directory level


def check_name(name: str) -> None:
    """A sweep name becomes directories under the workdir: no separators, no '..'."""
    if not NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"--name {name!r}: use letters, digits and . _ + - (no '/' or '..'; "
                         "it names directories under --workdir)")


def check_tracking_uri(uri: str | None) -> None:
    """Credentials in the URI (any scheme's case) would be printed and written into Ray's state
    files: ``flatlm.tracking.tracker.check_tracking_uri``, the one rule every entry point
    applies."""
    check(uri)


def check_sweep(sweep: Sweep) -> None:
    """Builds every grid point's config and validates it: bad sweeps fail before any trial."""
    check_name(sweep.name)
    if sweep.max_failures < 0:
        raise ValueError(f"--max-failures {sweep.max_failures}: use 0 or more (Ray reads a "
                         "negative value as unlimited retries)")
    points = grid_points(sweep)
    for point in points:
        validate_trial(apply_overrides(sweep.base, point))
    check_pack(sweep, points)
    if sweep.cpus_per_trial <= 0 or sweep.gpus_per_trial < 0:
        raise ValueError("--cpus-per-trial must be > 0 and --gpus-per-trial >= 0")
    sweep_task(sweep)
    if sweep.searcher is not None and any(m not in ("min", "max") for _, m in objectives(sweep)):
        raise ValueError(f"objectives {sweep.objectives}: each mode must be 'min' or 'max'")
