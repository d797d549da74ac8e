"""``flatlm train``: pre-train one masked LM and write its checkpoints.

    flatlm train --source pcfg:paper --model bert-12.8m --algorithm adamw --steps 30000 \\
        --checkpoint-steps 0,10000,20000,30000 --batch-size 4096 --seed 0 --out runs/a
    flatlm train ... --out runs/a --steps 60000 --resume      # continue the same run

Every ``TrainConfig`` field is an option (``--warmup-proportion`` for ``warmup_proportion``);
checkpoints go to ``OUT/checkpoints/step-<N>/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from flatlm.train.config import ALGORITHMS, TrainConfig

# Fields with their own parsing or spelled differently on the command line.
_SPECIAL = {"checkpoint_steps", "mask", "compile"}


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use comma-separated steps, e.g. 0,100,200")\
            from None


_TYPES = {"int": int, "float": float, "str": str}


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="pre-train a masked LM",
                              description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", help="source spec: 'pcfg:paper', 'hmm:seed=0', a JSON object ... "
                                    "(default with --data DIR: the corpus's source)")
    p.add_argument("--model", required=True,
                   help="preset (bert-12.8m, lstm-h256-l4, ...) or shape (d64-h1-l1-i256)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in --out up to --steps")
    p.add_argument("--checkpoint-steps", type=_int_list, default=None,
                   help="comma-separated updates after which to save (default: the last)")
    p.add_argument("--mask", default="one",
                   help="'one' masked word per sentence (default) or a rate such as 0.15")
    p.add_argument("--compile", action="store_true", help="torch.compile the loss (CUDA)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda[:i]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    for f in dataclasses.fields(TrainConfig):
        if f.name in _SPECIAL:
            continue
        kind = str(f.type).split(" |")[0]
        help_text = f"train.{f.name} (default: {f.default})"
        if f.name == "algorithm":
            help_text += ": " + ", ".join(ALGORITHMS)
        p.add_argument("--" + f.name.replace("_", "-"), type=_TYPES[kind], default=f.default,
                       help=help_text)
    p.set_defaults(run=run)


def config_from_args(args) -> TrainConfig:
    """The ``TrainConfig`` the options describe (raises ValueError naming a bad field)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
              if f.name != "checkpoint_steps"}
    steps = args.checkpoint_steps if args.checkpoint_steps is not None else (args.steps,)
    return TrainConfig(**values, checkpoint_steps=steps)


def run(args) -> int:
    cfg = config_from_args(args)  # before anything slow: a bad field fails at once
    import torch
    from transformers.utils import logging as hf_logging

    from flatlm.models.presets import describe, parse_model
    from flatlm.sources import load
    from flatlm.train.data import corpus_source_spec
    from flatlm.train.loop import train

    model_cfg = parse_model(args.model)
    if args.source is None and cfg.data == "fresh":
        raise ValueError("--source is required unless --data names a corpus directory")
    source = load(args.source if args.source is not None else corpus_source_spec(cfg.data))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") \
        if args.device == "auto" else torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    hf_logging.disable_progress_bar()  # save_pretrained's per-checkpoint bar
    print(f"{describe(model_cfg, source.V, source.max_length)}; {cfg.algorithm} for "
          f"{cfg.steps} steps on {device}")
    result = train(cfg, source, model_cfg, args.out, device=device, resume=args.resume,
                   progress=not args.no_progress)
    last = result.history[-1] if result.history else {}
    print(json.dumps({"step": result.step, **last,
                      "checkpoints": [str(p) for p in result.checkpoints.values()]}))
    return 0
