"""The command line every sweep script shares: ``main(build)``.

A script defines ``build(args) -> Sweep`` (``sweeps.spec``) and calls
``sys.exit(main(build, doc))``::

    python sweeps/scaling.py                       # tiny CPU sweep on a local Ray instance
    python sweeps/scaling.py --scale gpu --address auto --gpus-per-trial 0.5
    python sweeps/scaling.py --set train.steps=400 --set train.checkpoint_steps=200,400
    python sweeps/scaling.py --source hmm:seed=0   # any source, with its kind's defaults
    python sweeps/scaling.py --resume              # continue an interrupted sweep

A bad sweep exits with code 2 and ``error: <what and the fix>`` before any trial starts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from flatlm.commands import DEFAULT_PROTOCOL, DEFAULT_SCALE
from flatlm.core.config import apply_overrides, parse_assignments, refuse_varied
from flatlm.core.flags import NON_NEGATIVE, POSITIVE, number_flag
from flatlm.core.registry import PLUGIN_HELP, load_command_plugins
from flatlm.runs.pack_size import CUDA_PACK, PACK_SIZE
from sweeps.delivery import TrackingIncomplete

if TYPE_CHECKING:
    from sweeps.signals import Interrupted
    from sweeps.spec import Sweep

# Nothing heavy at import: ``--help`` must not wait for Ray, torch or transformers; the
# sweep's modules are imported once the arguments are parsed.

# a negative count would reach Ray, which reads it as unlimited retries
MAX_FAILURES = number_flag(int, at_least=0, hint="Ray reads a negative one as unlimited retries")


def parse_overrides(pairs: list[str]) -> dict:
    """``--set`` pairs: the trial config's keys, the one key space of every command."""
    return parse_assignments(pairs)


def parser(doc: str, *, trial_options: bool = True) -> argparse.ArgumentParser:
    """The shared options, described by the script's docstring ``doc`` (its first paragraph;
    the rest, the examples, after the options). ``trial_options=False`` leaves out --scale,
    --protocol, --set and --name for a script that chooses its trials and names its
    experiments itself (``replicate.py``, which takes flatlm replicate's)."""
    first, _, rest = doc.strip().partition("\n\n")
    p = argparse.ArgumentParser(description=" ".join(first.split()), epilog=rest or None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    if trial_options:
        p.add_argument("--scale", default=DEFAULT_SCALE,
                       help="where it runs, as in flatlm replicate: sweep (these CPU sweeps; "
                            f"default {DEFAULT_SCALE}), tiny (the replication's CPU scale), "
                            "testbed (a CPU scale where the models saturate), gpu (the paper's "
                            "sizes), or one a --plugin registers")
        p.add_argument("--protocol", default=DEFAULT_PROTOCOL,
                       help="how it is run and measured, as in flatlm replicate: paper "
                            "(default), paper-code, or paper+switch "
                            "(flatlm.experiments.protocols)")
        p.add_argument("--preset", help=argparse.SUPPRESS)  # renamed: an error naming --scale
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a trial config key for every trial "
                       "(repeatable), e.g. train.steps=400")
        p.add_argument("--quick", action="store_true",
                       help="measure the loss and KL only (as --set measure.what=loss, which a "
                            "later --set replaces): no flatness, no probes, no references; "
                            "seconds a checkpoint instead of minutes, and no accuracy to "
                            "conclude on")
        p.add_argument("--source", metavar="SPEC",
                       help="the language (as --set source=SPEC), with its kind's defaults: an "
                            "hmm trains BiLSTMs and probes task-6 / task-10, dyck probes g_star "
                            "(flatlm.experiments.presets.source_overrides); default: the "
                            "scale's PCFG")
        p.add_argument("--name", help="the MLflow and Ray experiment name (default: the "
                       "script's, e.g. scaling); letters, digits and . _ + -")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help=PLUGIN_HELP + " (the Ray workers import it before building a trial)")
    p.add_argument("--print-config", action="store_true",
                   help="print every trial's resolved config, each key with the layer that set "
                        "it (as flatlm config), and stop: no Ray, no MLflow")
    p.add_argument("--workdir", default=".", help="where mlflow.db, mlruns/, ray_results/ and "
                   "trials/ go (default: the current directory)")
    p.add_argument("--tracking-uri", help="MLflow tracking server (default: sqlite in workdir)")
    p.add_argument("--address", help="attach to a Ray cluster ('auto' on a cluster node)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted sweep")
    p.add_argument("--trust-state", action="store_true",
                   help="with --resume: accept a sweep whose state has no digest recorded on "
                        "this machine (copied or moved here); Ray unpickles it")
    p.add_argument("--cpus-per-trial", type=POSITIVE,
                   help="CPUs Ray reserves for each trial")
    p.add_argument("--gpus-per-trial", type=NON_NEGATIVE,
                   help="GPUs per trial; a fraction packs several small trials on one GPU, "
                        "a whole N > 1 trains each trial data-parallel on N (train.world_size)")
    p.add_argument("--pack", type=PACK_SIZE, metavar="K",
                   help="train up to K grid points of one shape as one model in one Ray trial, "
                        "each still its own MLflow run (flatlm.runs.pack; 1: each alone); "
                        f"default: 1 (off) without GPUs, {CUDA_PACK} where --gpus-per-trial > "
                        "0 (a GPU is launch-bound on small trials; bench/packs.py found no gain "
                        "on a CPU at the testbed's batch)")
    p.add_argument("--max-failures", type=MAX_FAILURES,
                   help="retries of a failed trial from its last checkpoint (default 3)")
    p.add_argument("--verbose", action="store_true",
                   help="keep Ray's per-checkpoint log lines (off by default; FLATLM_VERBOSE=1) "
                        "and end with the correlation table and the model-selection verdict")
    p.add_argument("--kl-threshold", type=POSITIVE,
                   help="saturation rule of the closing summary: checkpoints with "
                        "pretrain/kl below this (default: the scale's, e.g. 0.05 nats for "
                        "--scale sweep, whose models get below it; 0.1 for gpu)")
    p.add_argument("--loss-tolerance", type=NON_NEGATIVE,
                   help="the summary's rule instead: pretrain/loss within this of the entropy "
                        "(a source without a truth, e.g. text: of the lowest loss reached)")
    return p


# The retired ``--preset`` names, each as the --scale / --protocol that replace it.
PRESET_RENAMED = {"tiny": "--scale sweep", "paper": "--scale gpu",
                  "paper-code": "--scale gpu --protocol paper-code"}


def check_scale_and_protocol(args: argparse.Namespace) -> None:
    """``--scale`` and ``--protocol`` name a known scale and protocol; the retired ``--preset``
    (whose ``tiny`` was the ``sweep`` scale, not ``--scale tiny``) is an error naming them."""
    preset = getattr(args, "preset", None)
    if preset is not None:
        instead = PRESET_RENAMED.get(preset, "--scale NAME --protocol NAME")
        raise ValueError(f"--preset {preset}: --preset was renamed; use {instead} (the scales "
                         "and protocols of flatlm replicate)")
    if getattr(args, "scale", None) is not None:
        from flatlm.experiments.scales import scale

        scale(args.scale)  # a registered one: the built-ins, or a plug-in's
    if getattr(args, "protocol", None) is not None:
        from flatlm.experiments.protocols import parse_protocol

        parse_protocol(args.protocol)


def resolve_source(args: argparse.Namespace) -> None:
    """Sets ``args.source`` to the sweep's language: ``--source``, else ``--set source=`` (the two
    are one setting, so either gets the kind's defaults), else None. Both, naming different
    sources, is an error naming both."""
    from flatlm.sources import SourceSpec

    given = {flag: value for flag, value in (
        ("--source", getattr(args, "source", None)),
        ("--set source", parse_overrides(getattr(args, "overrides", [])).get("source")))
        if value is not None}
    specs = {}
    for flag, value in given.items():
        try:
            specs[flag] = SourceSpec(value)
        except ValueError as e:
            raise ValueError(f"{flag} {value!r}: {e}") from None
    if len(set(specs.values())) > 1:
        first, second = given["--source"], given["--set source"]
        raise ValueError(f"--source {first!r} and --set source={second!r} name different "
                         "sources; give one of them")
    args.source = next(iter(given.values()), None)


def apply_arguments(sweep: Sweep, args: argparse.Namespace) -> Sweep:
    """The sweep with the command line's ``--set`` overrides and resource flags applied."""
    from flatlm.runs.trial import validate_trial

    quick = ["measure.what=loss"] if getattr(args, "quick", False) else []
    overrides = parse_overrides([*quick, *getattr(args, "overrides", [])])
    if getattr(args, "source", None) is not None:  # --source is --set source (resolve_source)
        overrides["source"] = args.source
    sweep = replace(sweep, base=apply_overrides(sweep.base, overrides),
                    **{k: v for k, v in (("name", getattr(args, "name", None)),
                                         ("cpus_per_trial", args.cpus_per_trial),
                                         ("gpus_per_trial", args.gpus_per_trial),
                                         ("max_failures", args.max_failures),
                                         ("kl_threshold", args.kl_threshold),
                                         ("loss_tolerance", getattr(args, "loss_tolerance", None)))
                       if v is not None})
    pack = getattr(args, "pack", None)
    sweep = replace(sweep, pack=default_pack(sweep) if pack is None else pack)
    if set(overrides) & set(sweep.space):  # the search space would replace the value
        validate_trial(sweep.base)  # a bad value is named as such first
        refuse_varied(overrides, sweep.space, "this sweep (its search space)",
                      "or use a sweep script that does not vary it")
    return with_ranks_per_gpu(sweep, overrides)


def default_pack(sweep: Sweep) -> int:
    """``--pack``'s default (``flatlm.runs.pack.DEFAULT_RULE``): ``CUDA_PACK`` where the trials
    get a GPU and the sweep is a grid whose algorithms all pack; else 1."""
    from sweeps.spec import check_pack, grid_points

    if sweep.gpus_per_trial <= 0:
        return 1
    try:
        check_pack(replace(sweep, pack=CUDA_PACK), grid_points(sweep))
    except ValueError:  # a searcher, a distribution or an unpackable algorithm: unpacked
        return 1
    return CUDA_PACK


def with_ranks_per_gpu(sweep: Sweep, overrides: dict) -> Sweep:
    """A trial given N > 1 GPUs trains data-parallel on them: ``train.world_size`` = N (one
    process per GPU, ``flatlm.train.distributed``); a fraction of one GPU shares it."""

    gpus = sweep.gpus_per_trial
    if gpus <= 1:
        return sweep
    if gpus != int(gpus):
        raise ValueError(f"--gpus-per-trial {gpus:g}: above 1 use a whole number (one "
                         "data-parallel process per GPU), or at most 1 to share GPUs")
    asked = overrides.get("train.world_size")
    if asked is not None and str(asked) != str(int(gpus)):
        raise ValueError(f"--set train.world_size={asked} with --gpus-per-trial {gpus:g}: a "
                         "trial trains on one process per GPU; drop the --set")
    return replace(sweep, base=apply_overrides(sweep.base, {"train.world_size": int(gpus)}))


def main(build: Callable[[argparse.Namespace], Sweep], doc: str,
         add_arguments: Callable[[argparse.ArgumentParser], None] | None = None) -> int:
    """Parses the command line (``doc``: the script's docstring), builds and runs the sweep,
    then prints its summary; returns the exit code."""
    try:  # before the parser: a sweep script's choices may read the registries
        load_command_plugins(sys.argv[1:], os.environ)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    p = parser(doc)
    if add_arguments:
        add_arguments(p)
    args = p.parse_args()
    if args.verbose:  # read by the trials (local Ray workers inherit the environment)
        os.environ["FLATLM_VERBOSE"] = "1"
    workdir = Path(args.workdir).absolute()
    try:  # before Ray and MLflow are imported: a bad source is an error in seconds
        check_scale_and_protocol(args)
        resolve_source(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from sweeps.driver import TrialsFailed, run_sweep
    from sweeps.signals import Interrupted
    from sweeps.spec import shown_metrics
    from sweeps.summary import TrackingUnreachable, summarise
    from sweeps.trust import StateUnverified

    try:
        built = build(args)
        sweep = apply_arguments(built, args)
        if args.print_config:
            print(config_text(sweep, built.base, args.source))
            return 0
        if args.resume:
            check_resumable(sweep.name, workdir)
        run_sweep(sweep, workdir=workdir, tracking_uri=args.tracking_uri, address=args.address,
                  resume=args.resume, show=shown_metrics(sweep), trust_state=args.trust_state)
    except StateUnverified as e:
        print(f"error: {e}. If this sweep is yours, accept its state explicitly:\n"
              f"    {resume_command('--trust-state')}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Interrupted as e:
        return interrupted(e)
    except TrackingIncomplete as e:
        return tracking_lags(f"{e}.", e.uri)
    except TrialsFailed as e:  # one line, no traceback; the records of the others stand
        print(f"error: {e}", file=sys.stderr)
        return TRIALS_FAILED
    try:
        summarise(sweep, workdir, args.tracking_uri, verbose=args.verbose)
    except TrackingUnreachable as e:
        return tracking_lags(f"every run ended, but {e}.", None)
    return 0


def config_text(sweep: Sweep, built, source: str | None) -> str:
    """``--print-config``: each trial's resolved config with its keys' layers, and the keys a
    searcher draws per trial (shown at the base's value)."""
    from flatlm.commands.config import trial_config_lines
    from sweeps.spec import drawn_keys, trial_layers

    drawn = drawn_keys(sweep)
    note = ([f"# drawn per trial (shown at the base's value): {', '.join(drawn)}; "
             f"{sweep.num_samples} trial(s) per grid point"] if drawn else [])
    return "\n".join([*note, *trial_config_lines(trial_layers(sweep, built, source))])


def check_resumable(name: str, workdir: Path) -> None:
    """``--resume`` of a sweep that was never started here (a typo in --name or --workdir)
    would silently start a new one: an error naming the sweeps there instead."""
    if (workdir / "ray_results" / name).exists() or (workdir / "trials" / name).exists():
        return
    there = sorted(p.name for p in (workdir / "ray_results").glob("*") if p.is_dir())
    raise ValueError(f"--resume: no sweep named {name!r} in {workdir} (sweeps there: "
                     f"{', '.join(there) or 'none'}); check --name and --workdir, or drop "
                     "--resume to start it")


def resume_command(*extra: str) -> str:
    """The command that continues this sweep, quoted so that it works when pasted (a value such
    as measure.what=["loss","fisher"] keeps its quotes)."""
    argv = [a for a in sys.argv if a not in ("--resume", *extra)]
    return shlex.join(["python", *argv, "--resume", *extra])


TRACKING_LAGS = 3  # exit code: the trials ran, MLflow does not have all of it yet
TRIALS_FAILED = 1  # exit code: trials failed after their retries (said in one line)


def tracking_lags(what: str, uri: str | None) -> int:
    """Says that MLflow lags behind the finished trials and how to catch it up."""
    print(f"\nThe sweep's trials ran, but {what} No summary. Once MLflow is back, "
          f"this sends what is missing and prints the summary (it trains nothing):\n"
          f"    {resume_command()}", file=sys.stderr, flush=True)
    return TRACKING_LAGS


def interrupted(e: Interrupted) -> int:
    """Says what was stopped and how to go on; no summary over partial data."""
    print(f"\n{e}: {e.unfinished} trial(s) unfinished; their MLflow runs are marked KILLED "
          f"({', '.join(e.killed) or 'none reachable'}). Nothing is lost: continue with\n"
          f"    {resume_command()}", file=sys.stderr, flush=True)
    return e.exit_code
