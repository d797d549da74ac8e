"""``flatlm grow CHECKPOINT --to SHAPE --out DIR``: embed a small BERT into a larger one (B.4).

Width grows by replication (d_model and d_inter by integer factors, each head duplicated, head size
kept), depth by added blocks whose attention-output and MLP-output projections are zero. The grown
checkpoint computes the same logits as CHECKPOINT (see ``flatlm.models.growth``); ``--check``
measures that on random sentences. ``--construction`` picks where the factor 1/m goes: "paper"
(default; B.4.2 and the released enlarge.py: the input embeddings, added blocks all zero) or
"head-norm" (the MLM head's LayerNorm; added blocks' free parameters from ``--seed``). The two
grown checkpoints compute the same function but have different Tr(F); ``flatlm.json`` records
which (``extra.grown_from.construction``).
"""

from __future__ import annotations

from pathlib import Path

from flatlm.commands import COMMANDS
from flatlm.core.flags import SEED, number_flag
from flatlm.models.checkpoint import load_checkpoint
from flatlm.models.constructions import CONSTRUCTIONS, DEFAULT_CONSTRUCTION


def register(subparsers) -> None:
    """Adds ``grow`` to the top-level subparsers."""
    p = subparsers.add_parser("grow", help=COMMANDS["grow"],
                              description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", metavar="CHECKPOINT", type=Path,
                   help="a BERT checkpoint directory (save_checkpoint / flatlm train)")
    p.add_argument("--to", required=True, metavar="PRESET_OR_SHAPE",
                   help="target preset (bert-950m) or shape (d128-h2-l6-i512)")
    p.add_argument("--out", required=True, type=Path, help="output directory (new or empty)")
    p.add_argument("--construction", default=DEFAULT_CONSTRUCTION, choices=tuple(CONSTRUCTIONS),
                   help="where the width factor 1/m goes: 'paper' (B.4.2 / enlarge.py: input "
                        "embeddings / m, added blocks zero) or 'head-norm' (the MLM head's "
                        f"LayerNorm / m); default {DEFAULT_CONSTRUCTION!r}")
    p.add_argument("--seed", type=SEED, default=0,
                   help="initialises the free parameters of added blocks under 'head-norm' "
                        "(default 0)")
    p.add_argument("--check", type=number_flag(int, at_least=0, hint="0: no check"), default=0,
                   metavar="N",
                   help="compare logits on N random sentences and print the largest difference "
                        "(default 0: no check)")
    p.set_defaults(run=run)


def run(args) -> int:
    from flatlm.models.growth import grow_checkpoint, max_logit_difference

    if not args.checkpoint.is_dir():
        raise ValueError(f"CHECKPOINT {args.checkpoint} is not a directory")
    out = grow_checkpoint(args.checkpoint, args.to, args.out, seed=args.seed,
                          construction=args.construction)
    big, info = load_checkpoint(out)
    g = info["extra"]["grown_from"]
    print(f"grew {g['shape']} -> {info['shape']} (width x{g['width']}, d_inter x{g['inter']}, "
          f"+{g['added_layers']} layers; {info['n_parameters']:,} parameters; construction "
          f"{g['construction']}): wrote {out}")
    if args.check:
        small, _ = load_checkpoint(args.checkpoint)
        diff = max_logit_difference(small, big, n=args.check, seed=args.seed)
        print(f"max |logit difference| on {args.check} random sentences: {diff:.3g}")
    return 0
