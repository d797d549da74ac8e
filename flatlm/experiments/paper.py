"""One experiment per claim of the paper: a base trial config and a grid of variants.

============  ============================================================  ================
experiment    what varies (every grid point for each seed of the scale)      paper
============  ============================================================  ================
steps         one model trained long under AdamW, checkpointed densely        Fig. 2 / 4
sizes         the scale's models, each also measured grown into one shape     Fig. 3 / 5
algorithms    adamw, adversarial, noreg, sam (+ the lookup table, measured)   Tables 1 / 2
sgd           ``steps`` under SGD (warmup 12%, then a constant rate)          B.2, Fig. 10
============  ============================================================  ================

The Fig. 1 scatter is not an experiment of its own: it is read from every checkpoint of the
others (``analysis/replication.py``).

>>> exp = build("sizes", scale="tiny", protocol="paper-code")
>>> [name for name, _ in exp.trials()][:2]
['model=d16-h1-l1-i64-pre,seed=0', 'model=d16-h1-l1-i64-pre,seed=1']
>>> exp.base.measure.grow_to
'd64-h4-l2-i256-pre'
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from flatlm.core.config import apply_overrides
from flatlm.experiments.protocols import model_for, parse_protocol, protocol_overrides
from flatlm.experiments.scales import Scale
from flatlm.experiments.scales import scale as get_scale
from flatlm.measure.grown import lcm_shape
from flatlm.models.presets import shape_string
from flatlm.runs.trial import TrialConfig

EXPERIMENTS = ("steps", "sizes", "algorithms", "sgd")
ALGORITHMS = ("adamw", "adversarial", "noreg", "sam")


@dataclass(frozen=True)
class Experiment:
    """Trials = ``base`` with each point of ``grid`` (dotted key -> values; their product)."""

    name: str  # one of EXPERIMENTS
    protocol: str  # e.g. "paper", "paper-code", "paper+inside-labels"
    scale: str  # "tiny" or "gpu"
    base: TrialConfig
    grid: dict = field(default_factory=dict)

    def points(self) -> list[dict]:
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True))
                for values in itertools.product(*(self.grid[k] for k in keys))]

    def trials(self) -> list[tuple[str, TrialConfig]]:
        """(name, config) of every trial; the name spells the grid point (``model=..,seed=0``)."""
        return [(trial_name(point), apply_overrides(self.base, point)) for point in self.points()]


def trial_name(point: dict) -> str:
    return ",".join(f"{key.split('.')[-1]}={value}" for key, value in point.items())


def build(name: str, *, scale: str = "tiny", protocol: str = "paper",
          seeds: tuple[int, ...] | None = None, models: tuple[str, ...] | None = None,
          overrides: dict | None = None) -> Experiment:
    """Experiment ``name`` at ``scale`` under ``protocol``; ``seeds`` and ``models`` (the sizes
    grid) replace the scale's; ``overrides`` (``--set``) come last."""
    if name not in EXPERIMENTS:
        raise ValueError(f"experiment {name!r}: use one of {', '.join(EXPERIMENTS)}")
    parse_protocol(protocol)
    sc = get_scale(scale)
    if models:
        sc = dataclasses.replace(sc, models=tuple(models))
    base = _protocol_base(sc, protocol)
    base, grid = _BUILDERS[name](sc, protocol, base)
    grid["train.seed"] = list(sc.seeds if seeds is None else seeds)
    if overrides:
        base = apply_overrides(base, overrides)
    return Experiment(name=name, protocol=protocol, scale=sc.name, base=base, grid=grid)


def _protocol_base(sc: Scale, protocol: str) -> TrialConfig:
    base = apply_overrides(sc.base(), protocol_overrides(protocol))
    changes = {"model": model_for(sc.model, protocol)}
    if "deep-grammar" in parse_protocol(protocol)[1]:
        changes["source"] = sc.deep_source
    return apply_overrides(base, changes)


def _long_run(sc: Scale, base: TrialConfig, **extra) -> TrialConfig:
    every = sc.long_steps // sc.checkpoints
    return apply_overrides(base, {"train.steps": sc.long_steps, "train.checkpoint_steps":
                                  list(range(0, sc.long_steps + 1, every)), **extra})


def _steps(sc: Scale, protocol: str, base: TrialConfig):
    return _long_run(sc, base), {}


def _sgd(sc: Scale, protocol: str, base: TrialConfig):
    # B.2: SGD, warmup over 12% of the steps, then a constant rate (the paper's 1e-3 at GPU scale)
    return _long_run(sc, base, **{"train.algorithm": "sgd", "train.lr": sc.sgd_lr,
                                  "train.warmup_steps": None, "train.warmup_proportion": 0.12,
                                  "train.schedule": "constant"}), {}


def _sizes(sc: Scale, protocol: str, base: TrialConfig):
    models = [model_for(m, protocol) for m in sc.models]
    thirds = sorted({sc.steps // 3, 2 * sc.steps // 3, sc.steps})
    base = apply_overrides(base, {"measure.grow_to": shape_string(lcm_shape(models)),
                                  "train.checkpoint_steps": thirds})
    return base, {"model": models}


def _algorithms(sc: Scale, protocol: str, base: TrialConfig):
    return apply_overrides(base, sc.adversarial), {"train.algorithm": list(ALGORITHMS)}


_BUILDERS = {"steps": _steps, "sizes": _sizes, "algorithms": _algorithms, "sgd": _sgd}
