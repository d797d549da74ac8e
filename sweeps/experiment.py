"""A sweep of one of the experiments of ``flatlm.experiments.paper``: the same trials that
``flatlm replicate`` runs locally, on Ray, named by the same rule.

``--scale`` and ``--protocol`` name them as ``flatlm replicate`` does, with the same defaults
(``flatlm.commands``).
"""

from __future__ import annotations

import argparse

from flatlm.commands import DEFAULT_PROTOCOL, DEFAULT_SCALE
from flatlm.core.config import parse_assignments
from flatlm.experiments.paper import Experiment, base_of, build
from flatlm.experiments.scales import scale as get_scale
from flatlm.runs.trial import TrialConfig
from sweeps.spec import Sweep


def scale_and_protocol(args: argparse.Namespace) -> tuple[str, str]:
    """(scale, protocol) of the command line, the shared defaults where not given."""
    return (getattr(args, "scale", None) or DEFAULT_SCALE,
            getattr(args, "protocol", None) or DEFAULT_PROTOCOL)


def base_of_args(args: argparse.Namespace) -> TrialConfig:
    """The base trial of the command line's scale, protocol and ``--source``: what a sweep
    script of one's own starts from."""
    scale, protocol = scale_and_protocol(args)
    return base_of(scale, protocol, getattr(args, "source", None))


def experiment_of(name: str, args: argparse.Namespace, **choices) -> Experiment:
    """Experiment ``name`` at the command line's scale and protocol, on its ``--source``;
    ``choices`` (seeds, models, algorithms) replace the experiment's defaults. The ``--set``
    overrides are applied by ``sweeps.cli.apply_arguments``, which also refuses one that names
    a varied key; one that names a linked setting (SGD's rate, a model's steps) wins over it,
    as in ``flatlm replicate``."""
    scale, protocol = scale_and_protocol(args)
    experiment = build(name, scale=scale, protocol=protocol,
                       source=getattr(args, "source", None), **choices)
    return experiment.without_linked(parse_assignments(getattr(args, "overrides", None) or []))


def grid_space(experiment: Experiment) -> dict:
    """``experiment``'s grid as Ray Tune grid searches, and its ``linked`` settings as values
    drawn from the point's own (a sizes grid's per-model schedule): the trials
    ``Experiment.trials`` lists."""
    from sweeps.rayenv import tune

    space = {key: tune.grid_search(list(values)) for key, values in experiment.grid.items()}
    for key, by_value in experiment.linked.items():
        named = {k for overrides in by_value.values() for k in overrides}
        for setting in sorted(named - set(experiment.grid)):  # a grid value wins (--lrs)
            base = getattr_dotted(experiment.base, setting)
            space[setting] = tune.sample_from(
                lambda spec, key=key, setting=setting, by_value=by_value, base=base:
                by_value.get(spec.config[key], {}).get(setting, base))
    return space


def getattr_dotted(cfg, dotted: str):
    """The value of ``train.steps``-style key ``dotted`` in a trial config (lists for tuples,
    as a config dict holds them)."""
    value = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return list(value) if isinstance(value, tuple) else value


def sweep_of(experiment: Experiment, name: str, **fields) -> Sweep:
    """The Ray sweep of ``experiment``: its grid as grid searches, its distributions as Ray
    Tune's, its scale's resources and saturation rule; ``fields`` set the rest of the Sweep."""
    from sweeps.rayenv import tune

    space = grid_space(experiment)
    space.update({key: getattr(tune, kind)(low, high)
                  for key, (kind, low, high) in experiment.space.items()})
    sc = get_scale(experiment.scale)
    return Sweep(**{"name": name, "scale": experiment.scale, "protocol": experiment.protocol,
                    "base": experiment.base, "space": space, "gpus_per_trial": sc.gpus,
                    "kl_threshold": sc.kl_threshold, **fields})
