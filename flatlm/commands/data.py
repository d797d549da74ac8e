"""``flatlm data make`` (write a corpus) and ``flatlm data entropy`` (the loss floor of a source).

SOURCE is a short form (``pcfg:paper``, ``pcfg:path/to/rules.txt``, ``hmm:seed=0``, ``dyck:8``)
or a JSON spec (see ``flatlm.sources``). Progress bars go to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from flatlm.commands import COMMANDS, DEFAULT_DEVICE
from flatlm.core.devices import resolve_device
from flatlm.core.flags import COUNT, SEED, number_flag
from flatlm.core.stats import ratio_mean_se
from flatlm.sources import load


def register(subparsers) -> None:
    """Adds ``data make`` and ``data entropy`` to the top-level subparsers."""
    data = subparsers.add_parser("data", help=COMMANDS["data"],
                                 description=__doc__.splitlines()[0])
    sub = data.add_subparsers(dest="data_command", required=True)

    make = sub.add_parser("make", help="write train / validation / downstream Arrow splits "
                                       "and metadata.json")
    _source_args(make)
    make.add_argument("--n", type=COUNT, required=True, help="training sentences")
    make.add_argument("--seed", type=SEED, default=0, help="corpus seed (default 0)")
    make.add_argument("--out", required=True, help="output directory (new or empty)")
    make.add_argument("--n-validation", type=COUNT, help="validation sentences (default n/10)")
    make.add_argument("--n-downstream", type=COUNT, help="labelled sentences (default n/10)")
    make.add_argument("--n-entropy", type=number_flag(int, at_least=0, hint="0: skip"),
                      default=20_000,
                      help="validation sentences whose exact conditionals give the recorded "
                           "entropy (default 20000; 0 = skip)")
    make.add_argument("--tasks", help="comma-separated downstream tasks (default: all)")
    make.add_argument("--label-rule", help="downstream label rule (default: the source's; "
                                           "pcfg: inside|posterior, hmm: sampled|posterior)")
    make.set_defaults(run=run_make)

    entropy = sub.add_parser("entropy", help="per-token mean conditional entropy (nats) with "
                                             "its standard error")
    _source_args(entropy)
    entropy.add_argument("--n", type=COUNT, required=True, help="sentences to average over")
    entropy.add_argument("--seed", type=SEED, default=0, help="sampling seed (default 0)")
    entropy.add_argument("--json", action="store_true", help="print one JSON object")
    entropy.add_argument("--batch-size", type=COUNT, default=2048,
                         help="sentences per exact-conditional batch (default 2048)")
    entropy.set_defaults(run=run_entropy)


def _source_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="e.g. pcfg:paper, hmm:seed=0, dyck:8, or a JSON spec")
    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help="device for exact conditionals and labels: auto (cuda if "
                             f"available), cpu, cuda[:i] (default: {DEFAULT_DEVICE})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def _load_source(text: str):
    """The source SOURCE names; any failure to build it becomes a ValueError naming SOURCE."""
    try:
        return load(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"source {text!r} is not valid JSON: {e}") from e
    except OSError as e:  # e.g. a grammar file that cannot be read
        raise ValueError(f"source {text!r}: {e}") from e


def _device(name: str | None) -> str:

    return str(resolve_device(name))


def run_make(args) -> int:
    from flatlm.corpus import CorpusConfig, make_corpus

    src = _load_source(args.source)
    cfg = CorpusConfig(
        n_train=args.n, n_validation=args.n_validation, n_downstream=args.n_downstream,
        seed=args.seed, label_rule=args.label_rule, n_entropy=args.n_entropy,
        tasks=tuple(t.strip() for t in args.tasks.split(",")) if args.tasks else None)
    start = time.perf_counter()
    out = make_corpus(src, cfg, args.out, device=_device(args.device),
                      progress=not args.no_progress)
    meta = json.loads((out / "metadata.json").read_text())
    sizes = ", ".join(f"{s}={v['n']}" for s, v in meta["splits"].items())
    print(f"wrote {out} ({sizes}; label rule {meta['label_rule']}; "
          f"{time.perf_counter() - start:.1f} s)")
    if meta["entropy"] is not None:
        print(f"entropy {_pm(meta['entropy'], meta['entropy_se'])} nats/token over "
              f"{meta['entropy_n_sentences']} validation sentences")
    return 0


def _pm(mean: float, se: float | None) -> str:
    return f"{mean:.4f} ± {se:.4f}" if se is not None and se == se else f"{mean:.4f}"


def run_entropy(args) -> int:

    src = _load_source(args.source)
    device = _device(args.device)
    start = time.perf_counter()
    sums, counts = src.entropy_terms(args.n, args.seed, batch_size=args.batch_size,
                                     device=device, progress=not args.no_progress)
    mean, se = ratio_mean_se(sums, counts)
    seconds = time.perf_counter() - start
    n_tokens = int(counts.sum())
    if args.json:
        print(json.dumps({
            "entropy": mean, "entropy_se": se, "n_sentences": args.n, "n_tokens": n_tokens,
            "unit": "nats/token", "seed": args.seed, "source": src.spec,
            "fingerprint": src.fingerprint(), "device": device, "seconds": round(seconds, 3)}))
    else:
        print(f"entropy {_pm(mean, se)} nats/token (n_sentences={args.n}, n_tokens={n_tokens}, "
              f"source={args.source})")
    sys.stdout.flush()
    return 0
