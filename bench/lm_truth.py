"""Throughput of the LM source's exact truth: all-position conditionals Pr(x_t = c | x_{-t}) per
second, against the plain route measured in the same run on the same sentences.

flatlm: ``CausalLM.conditionals``, all V T candidate sentences of a batch as one tensor, scored by
batched forwards with only the V restricted logits computed. Baseline: the plain route, one full
forward (all LM logits) per candidate sentence, the joint by the chain rule, normalised over the
candidates (a Python loop over positions and words). Both routes cost V T forwards per sentence;
the ratio is what batching buys. Their results are compared (max abs difference, reported).

No download: the LM is a random model of OPT's vocabulary (50,272 tokens) and a chosen width,
built from ``OPTConfig``; ``--model DIR_OR_HUB_ID`` times a real one instead.

    python bench/lm_truth.py                 # CPU, writes bench/results/lm_truth_cpu.json
    python bench/lm_truth.py --device cuda --vocab 2000 --length 24 --hidden 768 --layers 12 \\
        --out bench/results/lm_truth_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from flatlm.sources import load


def random_opt(path: str, hidden: int, layers: int) -> str:
    """A random OPT of OPT's vocabulary and the given width / depth, saved to ``path``."""
    from transformers import AutoModelForCausalLM, OPTConfig

    torch.manual_seed(0)
    cfg = OPTConfig(hidden_size=hidden, ffn_dim=4 * hidden, num_hidden_layers=layers,
                    num_attention_heads=max(1, hidden // 64), word_embed_proj_dim=hidden)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


@torch.no_grad()
def plain_conditionals(src, tokens, device) -> torch.Tensor:
    """One full-vocabulary forward per candidate sentence: [n, T, V] float64."""
    lm = src._lm(torch.device(device)).lm
    ids, bos = src.ids.to(device), lm.config.bos_token_id
    n, T = tokens.shape
    out = torch.zeros(n, T, src.V, dtype=torch.float64)
    for i in range(n):
        for t in range(T):
            scores = torch.zeros(src.V, dtype=torch.float64)
            for c in range(src.V):
                words = tokens[i].clone()
                words[t] = c
                inputs = torch.cat([torch.tensor([bos]), src.ids[words]])[None].to(device)
                logp = lm(input_ids=inputs).logits[0, :-1, ids].float().log_softmax(-1)
                scores[c] = logp[torch.arange(T), words.to(device)][t:].sum().double()
            out[i, t] = scores.softmax(-1)
    return out


def timed(fn, device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", help="a causal LM (directory or hub id); default a random OPT")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32, help="V, the source's words")
    ap.add_argument("--length", type=int, default=8, help="T")
    ap.add_argument("--n", type=int, default=8, help="sentences flatlm scores")
    ap.add_argument("--n-plain", type=int, default=1, help="sentences the plain route scores")
    ap.add_argument("--batch", type=int, default=1024, help="candidate sentences per forward")
    ap.add_argument("--out", default="bench/results/lm_truth_cpu.json")
    args = ap.parse_args()
    device = str(torch.device(args.device))
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or random_opt(os.path.join(tmp, "opt"), args.hidden, args.layers)
        src = load({"kind": "lm", "model": model, "vocab": args.vocab, "length": args.length,
                    "rule": "bos", "batch": args.batch, "device": device})
        tokens, lengths = src.sample(args.n, seed=0)
        fast, seconds = timed(lambda: src.conditionals(tokens.to(device), lengths.to(device),
                                                       dtype=torch.float64).cpu(), device)
        plain, plain_seconds = timed(lambda: plain_conditionals(src, tokens[: args.n_plain],
                                                                device), device)
    gap = float((fast[: args.n_plain] - plain).abs().max())
    desc = (torch.cuda.get_device_name() if device.startswith("cuda")
            else f"{platform.processor() or 'cpu'} x{torch.get_num_threads()} threads")
    flatlm, baseline = args.n / seconds, args.n_plain / plain_seconds
    result = {"metric": "lm_conditionals", "flatlm": flatlm, "baseline": baseline,
              "baseline_name": "plain route: one full-logit forward per candidate sentence",
              "ratio": flatlm / baseline, "device": device,
              "unit": "sentences/s, all-position conditionals, float32 LM",
              "forwards_per_sentence": args.vocab * args.length,
              "candidate_forwards_per_s": flatlm * args.vocab * args.length,
              "max_abs_difference": gap, "model": args.model or
              f"random OPT d{args.hidden} x{args.layers} layers, 50272 tokens",
              "hardware": desc, "torch": torch.__version__,
              "command": "python bench/lm_truth.py " + " ".join(sys.argv[1:]),
              "load_average_1min": os.getloadavg()[0]}
    print(f"lm conditionals: flatlm {flatlm:.3g}/s, plain {baseline:.3g}/s, ratio "
          f"{result['ratio']:.1f}x ({result['forwards_per_sentence']} forwards per sentence; "
          f"max |difference| {gap:.1e})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps([result], indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
