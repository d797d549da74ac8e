"""``flatlm config``: a trial's resolved config, each key with the layer that set it.

    flatlm config                                          # the sweeps' base trial
    flatlm config --scale testbed --protocol paper-code --changed
    flatlm config --scale testbed --experiment sgd --trial seed1 --set train.lr=0.1
    flatlm config --scale tiny --json                      # the config.json a trial would write

The layers, in order (``flatlm.experiments.layers``): flatlm's defaults, the scale, the protocol,
the source's kind, the experiment's base and its grid point (with ``--experiment``), ``--set``.
A key shows the last layer that changed it. The same options as ``flatlm trial`` build the same
trial; nothing runs.
"""

from __future__ import annotations

import json

from flatlm.commands import DEFAULT_PROTOCOL, DEFAULT_SCALE, add_command
from flatlm.core.config import parse_assignments, to_dict
from flatlm.experiments.layers import DEFAULT, config_layers, provenance
from flatlm.runs.trial import validate_trial


def register(subparsers) -> None:
    p = add_command(subparsers, "config", __doc__)
    p.add_argument("--scale", default=DEFAULT_SCALE,
                   help=f"sweep, tiny, testbed or gpu (default {DEFAULT_SCALE})")
    p.add_argument("--protocol", default=DEFAULT_PROTOCOL,
                   help=f"paper, paper-code, or paper+switch (default {DEFAULT_PROTOCOL})")
    p.add_argument("--source", help="the language, with its kind's settings")
    p.add_argument("--experiment", help="an experiment of flatlm replicate: its base and one "
                                        "grid point")
    p.add_argument("--trial", help="the grid point's trial name (default: the first)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any trial config key (repeatable)")
    p.add_argument("--changed", action="store_true", help="only the keys a layer set")
    p.add_argument("--json", action="store_true", help="the resolved config as JSON, no layers")
    p.set_defaults(run=run)


def run(args) -> int:
    if args.trial and not args.experiment:
        raise ValueError("--trial names a grid point: give --experiment too")
    layers = config_layers(args.scale, args.protocol, args.source, experiment=args.experiment,
                           trial=args.trial, overrides=parse_assignments(args.overrides))
    cfg = layers[-1][1]
    validate_trial(cfg)  # a bad value is an error here as in flatlm trial
    if args.json:
        print(json.dumps(to_dict(cfg), indent=2))
        return 0
    print(f"# layers: {' -> '.join(name for name, _ in layers)}")
    print("\n".join(config_lines(provenance(layers), changed_only=args.changed)))
    return 0


def config_lines(rows: dict[str, tuple[object, str]], *, changed_only: bool = False) -> list[str]:
    """``key = value  # layer`` per key, aligned; ``changed_only``: not the defaults.

    >>> config_lines({"train.lr": (0.001, "scale tiny"), "train.seed": (0, "default")})
    ['train.lr   = 0.001  # scale tiny', 'train.seed = 0      # default']
    """
    shown = {k: v for k, v in rows.items() if not changed_only or v[1] != DEFAULT}
    if not shown:
        return []
    width = max(map(len, shown))
    values = {k: _plain(v) for k, (v, _) in shown.items()}
    value_width = min(VALUE_WIDTH, max(map(len, values.values())))  # a long spec runs over
    return [f"{k.ljust(width)} = {values[k].ljust(value_width)}  # {layer}"
            for k, (_, layer) in shown.items()]


VALUE_WIDTH = 24  # the layer column's place, unless a value is longer


def trial_config_lines(trials) -> list[str]:
    """``--print-config`` of flatlm replicate and the sweeps: for each (trial, its layers), a
    header naming the trial and its layers, then every key of its resolved config with the
    layer that set it (``flatlm.experiments.layers``)."""
    lines = []
    for name, layers in trials:
        validate_trial(layers[-1][1])  # a bad value is an error here as in a run
        lines += [f"# trial {name}; layers: {' -> '.join(n for n, _ in layers)}",
                  *config_lines(provenance(layers)), ""]
    return lines


def _plain(value) -> str:
    """As ``--set`` takes it: lists and dicts as JSON, the rest as written."""
    if isinstance(value, list | tuple | dict):
        return json.dumps(list(value) if isinstance(value, tuple) else value)
    return "None" if value is None else str(value)
