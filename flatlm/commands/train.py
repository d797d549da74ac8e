"""``flatlm train``: pre-train one masked LM and write its checkpoints.

    flatlm train --source pcfg:paper --model bert-12.8m --algorithm adamw --steps 30000 \\
        --checkpoint-steps 0,10000,20000,30000 --batch-size 4096 --seed 0 --out runs/a
    flatlm train ... --algorithm sam --sam-rho 0.1 --compile false --set train.adversarial.task=C
    flatlm train ... --out runs/a --steps 60000 --resume      # continue the same run
    flatlm train ... --world-size 2     # data-parallel: 2 processes (GPUs), the same global batch

Every ``TrainConfig`` field is an option, generated from its type (``flatlm.core.config``): nested
settings join with '-' (``--sam-rho`` is ``sam.rho``, ``--adversarial-lambda`` is
``adversarial.lambda``), a bool is ``--x/--no-x`` (the true / false / auto switches take a
value: ``--compile false``), a tuple is comma-separated
(``--checkpoint-steps 0,100``) and ``none`` clears an optional field. ``--set KEY=VALUE`` takes
the trial config's keys, as the sweeps do (``--set train.sam.rho=0.1``). Checkpoints go to
``OUT/checkpoints/step-<N>/`` (default: only the last step).

Exit status: 0 trained; 2 bad input (a message naming the field, or an unusable --out); 3
training diverged (a non-finite loss, or one above --divergence-factor times the initial loss
log V or the first logged loss): the message on stderr names the step and the loss, and no
checkpoint after the divergence is written; 5 a checkpoint or the training log could not be
written (a full disk): the earlier checkpoints are intact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flatlm.commands import COMMANDS, DEFAULT_DEVICE
from flatlm.core.config import (
    add_arguments,
    apply_overrides,
    overrides_from_args,
    section_assignments,
)
from flatlm.core.devices import resolve_device
from flatlm.core.safe_io import check_output_dir
from flatlm.models.presets import ModelSpec, describe
from flatlm.sources import SourceSpec, load
from flatlm.train.config import TrainConfig
from flatlm.train.data import corpus_source_spec


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help=COMMANDS["train"],
                              description=__doc__.split("\n\n")[0],
                              epilog=__doc__.split("\n\n")[-1],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="source spec: 'pcfg:paper', 'hmm:seed=0', a JSON object ... "
                                    "(default with --data DIR: the corpus's source)")
    p.add_argument("--model", required=True,
                   help="preset (bert-12.8m, lstm-h256-l4, ...) or shape (d64-h1-l1-i256)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out up to --steps")
    p.add_argument("--device", default=DEFAULT_DEVICE,
                   help=f"auto (cuda if available), cpu, cuda[:i] (default: {DEFAULT_DEVICE})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="any train.* key of the trial config, as in the sweeps, e.g. "
                        "train.sam.rho=0.1 (the options below set the same fields)")
    add_arguments(p.add_argument_group("training (TrainConfig)"), TrainConfig)
    p.set_defaults(run=run, resume_hint="the same command with --resume")


def config_from_args(args) -> TrainConfig:
    """The ``TrainConfig`` the options describe (raises ValueError naming a bad field)."""
    given = section_assignments(args.overrides, "train")
    flags = overrides_from_args(args)
    _check_no_conflict(given, flags)
    overrides = {**given, **flags}
    if "checkpoint_steps" not in overrides:  # default: a checkpoint at the last step only
        steps = apply_overrides(TrainConfig(), {k: v for k, v in overrides.items()
                                                if k == "steps"}).steps
        overrides["checkpoint_steps"] = [steps]
    return apply_overrides(TrainConfig(), overrides)


def _check_no_conflict(given: dict, flags: dict) -> None:
    """``--set train.lr=0.5 --lr 0.001`` names one field twice: an error, not a silent pick."""
    both = sorted(k for k in set(given) & set(flags) if str(given[k]) != str(flags[k]))
    if both:
        key = both[0]
        flag = "--" + key.replace(".", "-").replace("_", "-")
        raise ValueError(f"--set train.{key}={given[key]} and {flag} {flags[key]} set the same "
                         f"field train.{key} to different values; give one of them")


def run(args) -> int:
    cfg = config_from_args(args)  # before anything slow: a bad field fails at once

    model = ModelSpec(args.model)
    if args.source is None and cfg.data == "fresh":
        raise ValueError("--source is required unless --data names a corpus directory")
    if args.source is not None:
        spec = SourceSpec(args.source)
    else:

        spec = SourceSpec(corpus_source_spec(cfg.data))

    from flatlm.train.loop import train

    source = load(spec)
    device = resolve_device(args.device)  # no global TF32: fp32 stays fp32, as in the sweeps

    args.out = check_output_dir(args.out)  # a link, a file or an unwritable place: a message
    print(f"{describe(model.config, source.V, source.max_length)}; {cfg.algorithm} for "
          f"{cfg.steps} steps on {device}")
    # a divergence or a failed checkpoint write ends in flatlm.cli's exit statuses (3, 5)
    result = train(cfg, source, model.config, args.out, device=device, resume=args.resume,
                   progress=not args.no_progress)
    last = result.history[-1] if result.history else {}
    print(json.dumps({"step": result.step, **last,
                      "checkpoints": [str(p) for p in result.checkpoints.values()]}))
    return 0
