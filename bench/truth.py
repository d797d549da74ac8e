"""Throughput of the exact truth: all-position conditionals Pr(x_t = c | x_{-t}) per second.

Compares, in the same run and on the same sentences:

- PCFG (the paper's grammar): flatlm's batched inside-outside against NLTK's exhaustive
  probabilistic parser (``ViterbiParser``, one sentence at a time, the released code's route) and
  against flatlm's own slow route of paper A.3 (one inside pass per candidate word). NLTK's parse
  yields one best tree, not the conditionals, so that ratio understates the gap: getting the
  conditionals from a per-sentence parser takes T x V parses per sentence.
- PCFG, side by side with torch-struct (``bench/torch_struct_peer.py``: its CKY in the log
  semiring, marginals by autograd) on the same sentences, each grouped by length, on the same
  device and in the same dtype; the largest absolute difference of the conditionals is reported
  and must stay below ``AGREEMENT`` (float32: 1e-4; float64 agrees to ~1e-14).
- Every PCFG row also gives ``rule_evaluations_per_s``: sentences/s times the binary-rule
  applications per sentence (``rules_per_sentence``: (rule, split, span start) triples, once
  inside and twice outside, over the charts as grouped), which compares grammars of other sizes.
- HMM (the default 200 words / 100 states / length 16): flatlm's forward-backward conditionals
  against hmmlearn's forward-backward state posteriors (``predict_proba``), which is less work.

    python bench/truth.py                      # CPU, writes bench/results/truth_cpu.json
    python bench/truth.py --device cuda --n-nltk 10 --n 65536 --batch-size 65536 \
        --min-group 1024 4096 16384 --fused --out bench/results/truth_gpu.json

Only the core library is imported (torch-struct, NLTK and hmmlearn when baselines run), so it
runs on a GPU host without Ray, MLflow or datasets; a baseline whose package is missing is
skipped with a message. torch-struct is pure Python: for a host without a package index,
``pip download torch-struct --no-deps -d wheels/`` here and ``pip install --no-index --no-deps
wheels/torch_struct-*.whl`` there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch_struct_peer import TorchStructPCFG  # noqa: E402

from flatlm.sources import load
from flatlm.sources.pcfg import FUSED, MIN_GROUP, length_groups
from flatlm.sources.reference import slow_conditionals

AGREEMENT = 1e-4  # float32 conditionals, flatlm vs torch-struct: largest absolute difference


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed_rate(fn, n_items: int, device, repeats: int = 3) -> float:
    """Best-of-``repeats`` items per second of ``fn()`` after one warm-up call."""
    fn()
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return n_items / best


def flatlm_rate(src, n, device, batch_size, repeats: int = 3, **options) -> float:
    tokens, lengths = src.sample(n, seed=0)
    tokens, lengths = tokens.to(device), lengths.to(device)
    return timed_rate(lambda: src.conditionals(tokens, lengths, batch_size=batch_size, **options),
                      n, device, repeats)


def rules_per_sentence(src, n, device, min_group=None) -> float:
    """Binary-rule applications per sentence of inside-outside on ``flatlm_rate``'s sentences
    as ``conditionals`` groups them (each chart as wide as its group's longest sentence): the
    inside pass's (``Plan.rule_applications``) and twice those in the outside pass. Sentences
    per second times this is rule evaluations per second, comparable across grammars."""
    if not hasattr(src, "plan"):
        return float("nan")
    _, lengths = src.sample(n, seed=0)
    lengths = lengths.to(device)
    total = sum(len(rows) * 3 * src.plan(L, lengths.device, torch.float32).rule_applications()
                for rows, L in length_groups(lengths, min_group))
    return total / n


def fused_rows(src, n, device, batch_size, min_groups, repeats=3, **common) -> list[dict]:
    """flatlm's fused inside-outside (``flatlm.sources.inside_outside_fused``) against its
    split-by-split route, same sentences and length groups, for each min_group."""
    rows = []
    for m in min_groups or [None]:
        fast = flatlm_rate(src, n, device, batch_size, repeats, min_group=m, fused=True)
        plain = flatlm_rate(src, n, device, batch_size, repeats, min_group=m, fused=False)
        rows.append(row("pcfg_paper_conditionals", fast, plain,
                        "flatlm split by split (inside_outside), same length groups", device,
                        fused=True, min_group=m, n_sentences=n, batch_size=batch_size, **common))
    return rows


def min_group_rows(src, n, device, batch_size, values, repeats=3, **common) -> list[dict]:
    """flatlm with neighbouring lengths merged into charts of >= min_group sentences, against one
    chart per length (min_group=1), in the same run (``flatlm.sources.pcfg.MIN_GROUP``)."""
    per_length = flatlm_rate(src, n, device, batch_size, repeats, min_group=1)
    return [row("pcfg_paper_conditionals",
                flatlm_rate(src, n, device, batch_size, repeats, min_group=m),
                per_length, "flatlm, one chart per length (min_group=1)", device, min_group=m,
                n_sentences=n, batch_size=batch_size, **common) for m in values]


def by_length(fn, tokens, lengths, batch_size, V):
    """fn(tokens [b, L], lengths [b]) -> [b, L, V] over groups of one length, written in place."""
    out = torch.zeros(*tokens.shape, V, device=tokens.device)
    for L in lengths.unique().tolist():
        for rows in (lengths == L).nonzero().squeeze(-1).split(batch_size):
            out[rows, :L] = fn(tokens[rows, :L], lengths[rows]).to(out.dtype)
    return out


def torch_struct_row(src, n, device, batch_size, repeats=3, **common) -> dict:
    """flatlm and torch-struct on the same n sentences, same device, float32; agreement
    checked."""
    peer = TorchStructPCFG(src.grammar, device=device)
    tokens, lengths = src.sample(n, seed=1)
    tokens, lengths = tokens.to(device), lengths.to(device)
    ours = src.conditionals(tokens, lengths, batch_size=batch_size)
    theirs = by_length(peer.conditionals, tokens, lengths, batch_size, src.V)
    gap = float((ours - theirs).abs().max())
    if not gap < AGREEMENT:
        raise SystemExit(f"flatlm and torch-struct disagree: max |diff| {gap:.3g} >= {AGREEMENT}")
    fast = timed_rate(lambda: src.conditionals(tokens, lengths, batch_size=batch_size), n,
                      device, repeats)
    slow = timed_rate(lambda: by_length(peer.conditionals, tokens, lengths, batch_size, src.V),
                      n, device, repeats=1)
    return row("pcfg_paper_conditionals", fast, slow,
               "torch-struct CKY (log semiring, marginals by autograd), same sentences",
               device, agreement_max_abs=gap, agreement_tolerance=AGREEMENT, n_sentences=n,
               batch_size=batch_size, **common)


def nltk_grammar(src):
    import nltk

    g = src.grammar
    nt = {a: nltk.Nonterminal(name) for a, name in enumerate(g.nonterminals)}
    prods = [nltk.ProbabilisticProduction(nltk.Nonterminal("S"), [nt[a]], prob=float(g.root[a]))
             for a in g.root_symbols()]
    prods += [nltk.ProbabilisticProduction(nt[a], [nt[b], nt[c]], prob=float(p)) for a, b, c, p
              in zip(g.binary_parent, g.binary_left, g.binary_right, g.binary_prob, strict=True)]
    prods += [nltk.ProbabilisticProduction(nt[a], [g.words[w]], prob=float(g.emission[a, w]))
              for a, w in zip(*np.nonzero(g.emission), strict=True)]
    return nltk.PCFG(nltk.Nonterminal("S"), prods)


def nltk_rate(src, n) -> float:
    import nltk

    parser = nltk.ViterbiParser(nltk_grammar(src))
    tokens, lengths = src.sample(n, seed=0)
    sentences = [[src.vocab[c] for c in t[:L]] for t, L in zip(tokens.tolist(), lengths.tolist(),
                                                                 strict=True)]
    start = time.perf_counter()
    for words in sentences:
        next(iter(parser.parse(words)))
    return n / (time.perf_counter() - start)


def slow_route_rate(src, n) -> float:
    tokens, lengths = src.sample(n, seed=0)
    start = time.perf_counter()
    slow_conditionals(src, tokens, lengths)
    return n / (time.perf_counter() - start)


def hmmlearn_rate(src, n) -> float:
    from hmmlearn.hmm import CategoricalHMM

    model = CategoricalHMM(n_components=src.S, n_features=src.V)
    model.startprob_, model.transmat_, model.emissionprob_ = (
        src.initial, src.transition, src.emission)
    tokens, lengths = src.sample(n, seed=0)
    X = tokens.numpy().reshape(-1, 1)
    return timed_rate(lambda: model.predict_proba(X, lengths.numpy()), n, "cpu", repeats=1)


def installed(package: str) -> bool:
    """Whether a baseline's package imports; says so when it does not."""
    if importlib.util.find_spec(package) is None:
        print(f"skipped: {package} is not installed (its baseline rows are left out)")
        return False
    return True


def row(metric, flatlm, baseline, name, device, **extra) -> dict:
    out = {"metric": metric, "flatlm": flatlm, "baseline": baseline, "baseline_name": name,
           "ratio": flatlm / baseline, "device": device}
    return {**out, **extra}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n", type=int, default=16384, help="sentences for flatlm's timing")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--n-nltk", type=int, default=40, help="sentences NLTK parses")
    ap.add_argument("--n-slow", type=int, default=2, help="sentences for the slow route")
    ap.add_argument("--n-torch-struct", type=int, default=64,
                    help="sentences for the torch-struct comparison (flatlm timed on the same)")
    ap.add_argument("--torch-struct-batch", type=int, default=256,
                    help="sentences per torch-struct call (its dense rule tensor is per sentence)")
    ap.add_argument("--min-group", type=int, nargs="*", default=[],
                    help="also time charts merged to >= this many sentences (several values: a "
                         "row each, against min_group=1)")
    ap.add_argument("--fused", action="store_true",
                    help="also time the fused inside-outside against the split-by-split route "
                         "(at 1 and each --min-group)")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed calls of flatlm after its warm-up, best kept (1: a smoke run)")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    ap.add_argument("--out", default="bench/results/truth_cpu.json")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = str(torch.device(args.device))
    desc = (torch.cuda.get_device_name() if device.startswith("cuda")
            else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()} threads")
    pcfg, hmm = load("pcfg:paper"), load("hmm:seed=0")
    unit = "sentences/s, all-position conditionals, float32"
    pcfg_fast = flatlm_rate(pcfg, args.n, device, args.batch_size, args.repeats)
    hmm_fast = flatlm_rate(hmm, args.n, device, args.batch_size, args.repeats)
    rows = []
    common = {"unit": unit, "hardware": desc, "torch": torch.__version__,
              "command": "python bench/truth.py " + " ".join(sys.argv[1:]),
              "load_average_1min": os.getloadavg()[0],
              "defaults": {"fused": FUSED.get(torch.device(device).type, False),
                           "min_group": MIN_GROUP.get(torch.device(device).type, 1)}}
    if args.skip_baselines:
        rows += [row("pcfg_paper_conditionals", pcfg_fast, float("nan"), "none", device, **common),
                 row("hmm_default_conditionals", hmm_fast, float("nan"), "none", device, **common)]
    else:
        if installed("torch_struct"):
            rows.append(torch_struct_row(pcfg, args.n_torch_struct, device,
                                         args.torch_struct_batch, args.repeats, **common))
        if installed("nltk"):
            rows.append(row("pcfg_paper_conditionals", pcfg_fast, nltk_rate(pcfg, args.n_nltk),
                            "nltk.ViterbiParser (one best parse per sentence)", device, **common))
        rows.append(row("pcfg_paper_conditionals", pcfg_fast, slow_route_rate(pcfg, args.n_slow),
                        "flatlm slow route (one inside pass per candidate word, float64)",
                        device, **common))
        if installed("hmmlearn"):
            rows.append(row("hmm_default_conditionals", hmm_fast, hmmlearn_rate(hmm, args.n),
                            "hmmlearn CategoricalHMM.predict_proba (forward-backward)", device,
                            **common))
    rows += min_group_rows(pcfg, args.n, device, args.batch_size, args.min_group, args.repeats,
                           **common)
    if args.fused:
        rows += fused_rows(pcfg, args.n, device, args.batch_size, [1, *args.min_group],
                           args.repeats, **common)
    for r in rows:
        if r["metric"].startswith("pcfg"):  # rule evaluations per second, as grouped
            per = rules_per_sentence(pcfg, args.n, device, r.get("min_group"))
            r.update(rules_per_sentence=per, rule_evaluations_per_s=r["flatlm"] * per)
        print(f"{r['metric']:26s} flatlm {r['flatlm']:10.0f}/s  {r['baseline_name']}: "
              f"{r['baseline']:10.1f}/s  ratio {r['ratio']:8.1f}x"
              + (f"  {r['rule_evaluations_per_s']:.3g} rules/s" if "rules_per_sentence" in r
                 else ""))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
