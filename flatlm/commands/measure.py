"""``flatlm measure CHECKPOINT``: every measurement of one saved model, as one JSON object.

    flatlm measure out/checkpoints/step-1000 --what loss,fisher,hessian,probe,lookup --json
    flatlm measure CKPT --source pcfg:paper --n-eval 10000 --set measure.probe.seeds=5
    flatlm measure --follow t/       # a trial's checkpoints, as they appear (flatlm.runs.follow)

The source defaults to the one recorded in the checkpoint's ``flatlm.json``. The object is printed
(``--json``: only it) and saved as ``measure.json`` next to the checkpoint (or ``--out``). The
evaluation data and the reference rows (random-init probe, lookup table) are kept in ``--cache``
(default: ``eval_cache`` in the run directory of a checkpoint under ``RUN/checkpoints/``), so
the next checkpoint of the run, or another run of the same shape and source, reads them back.
A progress bar shows on a terminal (``--no-progress``: none).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flatlm.commands import COMMANDS, DEFAULT_DEVICE
from flatlm.commands.trial import eval_cache_dir
from flatlm.core.config import apply_overrides, section_assignments
from flatlm.core.devices import resolve_device
from flatlm.core.flags import COUNT, SEED
from flatlm.core.safe_io import write_atomic
from flatlm.measure.registry import measurement_names
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models.checkpoint import check_language, load_checkpoint
from flatlm.models.presets import ModelConfig
from flatlm.sources import SourceSpec, load


def register(sub) -> None:
    p = sub.add_parser("measure", help=COMMANDS["measure"],
                       description=__doc__)
    p.add_argument("checkpoint", nargs="?", help="a checkpoint directory (with flatlm.json)")
    p.add_argument("--follow", metavar="TRIAL_DIR", type=Path,
                   help="instead of one checkpoint: measure a trial's checkpoints as its "
                        "training saves them, with the trial's own config, into its "
                        "metrics.jsonl (flatlm trial --measure-in background starts this); "
                        "--device and --cache apply, the other options do not")
    p.add_argument("--source", help="source spec; default: the checkpoint's")
    p.add_argument("--what", default="loss,fisher,hessian,probe,lookup",
                   help=f"comma-separated, from {', '.join(measurement_names())}")
    p.add_argument("--n-eval", type=COUNT,
                   help="validation sentences (measure.n_eval: the loss, and what each "
                        "measurement draws its inputs from; Tr(F)'s own count is "
                        "--set measure.flatness.n_inputs=N)")
    p.add_argument("--n-inputs", help=argparse.SUPPRESS)  # renamed: an error naming the new one
    p.add_argument("--n-downstream", type=COUNT, help="labelled sentences per task")
    p.add_argument("--tasks", help="comma-separated downstream tasks (default: all)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any measure.* key of the trial config, as in the sweeps, e.g. "
                        "measure.probe.seeds=5")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help=f"auto, cpu, cuda or cuda:i (default: {DEFAULT_DEVICE})")
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--out", help="where to save the JSON (default CHECKPOINT/measure.json; "
                                 "files a measurement writes stay in CHECKPOINT)")
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--cache", help="directory for the evaluation data and reference rows; "
                                   "'none': no cache (default: RUN/eval_cache for a checkpoint "
                                   "in RUN/checkpoints/, else none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def _config(args):
    """The MeasureConfig of the options: the named flags first, then ``--set`` (same path as
    ``flatlm.core.config.apply_overrides``, so ``--set measure.tasks=B,C`` and ``--tasks B,C``
    agree)."""
    overrides = {"what": args.what, "seed": args.seed}
    if args.n_inputs is not None:  # it set n_eval, not flatness.n_inputs: renamed
        raise ValueError(f"--n-inputs {args.n_inputs}: renamed --n-eval (it sets measure.n_eval;"
                         f" Tr(F)'s inputs are --set measure.flatness.n_inputs={args.n_inputs})")
    if args.n_eval is not None:
        overrides["n_eval"] = args.n_eval
    if args.n_downstream is not None:
        overrides["n_downstream"] = args.n_downstream
    if args.tasks:
        overrides["tasks"] = args.tasks
    overrides.update(section_assignments(args.overrides, "measure"))
    return apply_overrides(MeasureConfig(), overrides)


def run(args) -> int:
    if args.follow is not None:
        return _follow(args)
    if args.checkpoint is None:
        raise ValueError("flatlm measure: give a CHECKPOINT directory, or --follow TRIAL_DIR")
    ckpt = Path(args.checkpoint)
    if not (ckpt / "flatlm.json").is_file():
        raise ValueError(f"{ckpt} is not a flatlm checkpoint (no flatlm.json)")
    cfg = _config(args)  # bad options fail before the model loads
    device = resolve_device(args.device)
    model, info = load_checkpoint(ckpt)
    source = load(SourceSpec(args.source) if args.source else info["source"])
    _check_vocabulary(ckpt, info, source)
    check_language(ckpt, info, source, "measure")  # same words, another grammar: refused
    model = model.to(device)
    data = eval_data(source, cfg, ModelConfig(**info["model"]),  # random-features reference
                     cache_dir=_cache_dir(args.cache, ckpt))
    path = Path(args.out) if args.out else ckpt / "measure.json"
    # the checkpoint's directory, as in a trial: precond and critical read its optimizer state
    # there, and the spectral density is written beside it whatever --out says
    metrics = measure_model(model, source, data, cfg, device, artifact_dir=ckpt,
                            progress=not args.no_progress and sys.stderr.isatty())
    out = {"checkpoint": str(ckpt.absolute()), "source": source.spec, **metrics}
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_replacing(path, json.dumps(out, indent=2) + "\n")
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in metrics.items():
            if not key.startswith("time/"):
                print(f"{key:32s} {value:.6g}")
        print(f"saved {path}")
    return 0


def _follow(args) -> int:
    """``--follow``: the trial's checkpoints measured as they appear (``flatlm.runs.follow``),
    its evaluation data in ``--cache`` (default: ``eval_cache/`` beside the trial, as
    ``flatlm trial``'s)."""
    from flatlm.runs.follow import follow_trial

    if args.checkpoint is not None:
        raise ValueError("flatlm measure: give a CHECKPOINT or --follow TRIAL_DIR, not both")
    cache = eval_cache_dir(args.cache, args.follow)
    rows = follow_trial(args.follow, device=resolve_device(args.device), eval_cache=cache,
                        say=None if args.json else lambda line: print(line, flush=True))
    print(f"{args.follow}: {len(rows)} checkpoints measured (metrics.jsonl)", flush=True)
    return 0


def _cache_dir(given: str | None, ckpt: Path) -> Path | None:
    """``--cache``, or the run's ``eval_cache`` for a checkpoint in ``RUN/checkpoints/``."""
    if given is not None:
        return None if given.lower() == "none" else Path(given)
    run = ckpt.absolute().parent
    return run.parent / "eval_cache" if run.name == "checkpoints" else None


def _check_vocabulary(ckpt: Path, info: dict, source) -> None:
    """A model measured on a language of another vocabulary would fail deep in a forward pass
    (or, worse, run on the wrong words): say so first."""
    words = info.get("tokens", {}).get("n_words")
    if words is not None and words != source.V:
        raise ValueError(f"{ckpt} was trained on a language of {words} words ({info['source']}),"
                         f" but --source has {source.V}; measure it on its own source (omit "
                         "--source) or one with the same vocabulary")


def _write_replacing(path: Path, text: str) -> None:
    """Writes ``path`` as a new file renamed into place: a symbolic link there is replaced, not
    followed (a checkpoint from elsewhere could point its measure.json at any file)."""
    write_atomic(path, text, replace_link=True)
