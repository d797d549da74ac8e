"""Where each value of a trial's config comes from: the layers it is built from, in order, and
for every key the last layer that changed it.

A trial config is built in these layers, each setting only what the ones below it do not
already give:

1. ``default``: flatlm's dataclass defaults (the paper's values where it has one: one masked
   word, a constant rate after warmup, lr 1e-3).
2. ``scale NAME`` (``flatlm/experiments/scales.py``): the language, the model, the run's length
   and checkpoints, the batch, the peak lr and warmup, how much is measured (the CPU scales
   share one table, ``CPU_SETTINGS``).
3. ``protocol NAME`` (``protocols.py``): how a claim is labelled, masked, scheduled and probed
   (``PAPER``, then its base's settings and switches), the pre-LN model under ``pre-ln``, the
   deep or second grammar under theirs. It owns the keys it sets: a scale's own value for one
   of them (the testbed's probe, a search candidate's schedule) does not reach a trial.
4. ``source ...`` (``presets.source_overrides``): with ``--source``, the source and its kind's
   settings (an HMM trains BiLSTMs and probes task-6 / task-10, Dyck probes g*, text masks 15%;
   a source other than a PCFG has its own label rule and spans); nothing without one.
5. ``experiment NAME`` (``paper.py``): the experiment's base (e.g. the long runs' checkpoints and
   constant rate, SGD's rate, the sizes experiment's grown measurements).
6. ``trial NAME``: the grid point (model, algorithm, seed, lr), and ``--set``: the command
   line's overrides (``flatlm config`` applies them last; ``flatlm replicate`` and the sweeps
   before the grid point, which no ``--set`` may vary).

``flatlm config`` prints the result with each key's layer. Every trial config that ``flatlm
replicate`` and the sweeps build is pinned by ``tests/experiments/test_trial_configs.py``;
``tests/experiments/layer_settings.py`` lists the settings that restate a lower layer.

>>> rows = provenance(config_layers("tiny", "paper"))
>>> rows["train.steps"]
(1500, 'scale tiny')
>>> rows["train.seed"][1]
'default'
"""

from __future__ import annotations

from flatlm.core.config import apply_overrides
from flatlm.experiments.paper import base_of, build, protocol_base
from flatlm.experiments.scales import scale as get_scale
from flatlm.runs.trial import TrialConfig, flat_settings

DEFAULT = "default"


def config_layers(scale: str, protocol: str = "paper", source: str | None = None, *,
                  experiment: str | None = None, trial: str | None = None,
                  overrides: dict | None = None) -> list[tuple[str, TrialConfig]]:
    """(layer name, the config after it) for each layer, in order (module docstring). With
    ``experiment``, its base and the grid point ``trial`` (a trial name; default: the first)."""
    sc = get_scale(scale)
    layers = base_layers(scale, protocol, source)
    if experiment is not None:
        exp = build(experiment, scale=scale, protocol=protocol, source=source,
                    seeds=sc.seeds_of(experiment))  # as flatlm replicate builds it
        layers.append((f"experiment {experiment}", exp.base))
        trials = dict(exp.trials())
        name = trial or next(iter(trials))
        if name not in trials:
            raise ValueError(f"--trial {name!r}: the {experiment} experiment has "
                             f"{', '.join(trials)}")
        layers.append((f"trial {name}", trials[name]))
    if overrides:
        layers.append(("--set", apply_overrides(layers[-1][1], overrides)))
    return layers


def base_layers(scale: str, protocol: str = "paper",
                source: str | None = None) -> list[tuple[str, TrialConfig]]:
    """The layers every trial of ``scale`` and ``protocol`` on ``source`` starts from: the
    defaults, the scale's, the protocol's and the source's kind's (module docstring)."""
    sc = get_scale(scale)
    return [(DEFAULT, TrialConfig()), (f"scale {scale}", sc.base()),
            (f"protocol {protocol}", protocol_base(sc, protocol)),
            (f"source {source}" if source else "source (the scale's)",
             base_of(scale, protocol, source))]


def grid_layers(head: list[tuple[str, TrialConfig]], given: TrialConfig,
                trials: list[tuple[str, TrialConfig]]) -> list[list[tuple[str, TrialConfig]]]:
    """Each trial's layers: ``head`` (down to the experiment's base), ``--set`` (``given``: that
    base with the command line's overrides; no grid point may vary one of them), then the trial's
    grid point (``trials``: (name, config) as the runner builds them)."""
    return [[*head, ("--set", given), (f"trial {name}", cfg)] for name, cfg in trials]


def provenance(layers: list[tuple[str, TrialConfig]]) -> dict[str, tuple[object, str]]:
    """key -> (its final value, the last layer that changed it); keys in the config's order."""
    changed_by: dict[str, str] = {}
    previous: dict = {}
    for name, cfg in layers:
        flat = flat_settings(cfg)  # a section at its defaults is not stored, but is read
        for key, value in flat.items():
            if key not in previous or previous[key] != value:
                changed_by[key] = name
        previous = flat
    return {key: (value, changed_by[key]) for key, value in previous.items()}
