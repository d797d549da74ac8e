"""Seconds to estimate Tr(F) (the paper's B.1 flatness) to 2% relative standard error.

One run per model, one partly trained model, the same masked inputs x_{-t} for every method:

1. flatlm: ``per_input_values`` (per-example squared gradient norms of one batched backward,
   ``measure.ghost``), with the output-space Rademacher probe (the default) and with sampled
   labels, each run on as many inputs as a pilot says reach the target: measured.
2. per-example backward loop (one forward and backward per input, the paper's B.1 procedure with
   sampled labels c ~ p_theta; and the same loop with the probe): timed on a subset, then seconds
   per input x the inputs that estimator needs. The loop computes the same per-example numbers as
   flatlm (checked on the subset: max relative difference reported), so its variance per input is
   the one flatlm measured on many more inputs.
3. curvlinops 3.0 (``GGNLinearOperator`` + ``hutchinson_trace``): Hutchinson on the GGN of the
   cross-entropy, which is exactly F; one operator per batch of fresh inputs (batches are the
   i.i.d. units), timed over some batches, projected with its own per-batch variance. Several
   batch sizes / probe counts are tried and the fastest is reported. Needs eager attention.

Before measuring, the model is trained a few hundred AdamW steps on the exact MLM loss (cross-
entropy against the source's true conditional at one masked word per sentence), so the
measurement is not taken at initialisation.

Defaults (CPU, ~6 min on 2 shared cores): the paper's PCFG (200 words, sentences of <= 16 words),
models bert-2m (the paper's smallest preset, d64-h1-l1-i256) and d128-h2-l2-i512. With
``--threads 1`` the timer is process CPU time, so that waiting for a core on a shared machine is
not charged to either method; otherwise wall time.

    python bench/flatness.py --threads 1                       # writes bench/results/...cpu.json
    python bench/flatness.py --device cuda --model bert-41m bert-110m --loop-inputs 50 \
        --paper-precision 10000 50 --out bench/results/flatness_gpu.json

Imports only the core library and curvlinops. Install the latter without its declared
dependencies (backpack-for-pytorch pulls torchvision, which has no CPU build and drags in a CUDA
torch): ``pip install --no-deps curvlinops-for-pytorch==3.0.1 einops linear_operator opt_einsum
einconv``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
from torch import nn

from flatlm.measure.curvature.common import (
    FlatnessConfig,
    grouped_mean_se,
    masked_inputs,
    selected_parameters,
)
from flatlm.measure.curvature.fisher import per_input_values
from flatlm.measure.curvature.hessian_trace import eager_attention
from flatlm.models import build_model, count_parameters, parse_model, word_logits
from flatlm.sources import load


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def clock(device):
    """Process CPU time on a single-threaded CPU run (the machine is shared: time spent waiting
    for a core is not the method's), wall time otherwise."""
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.process_time
    return time.perf_counter


def timed(fn, device):
    now = clock(device)
    sync(device)
    start = now()
    out = fn()
    sync(device)
    return out, now() - start


def train(model, src, args) -> list[float]:
    """AdamW on the exact MLM loss over a fixed pool; returns the loss every 50 steps."""
    tokens, lengths = src.sample(args.pool, seed=args.seed + 1)
    truth = src.conditionals(tokens, lengths, dtype=torch.float32)  # (pool, T, V)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(args.seed + 2)
    model.train()
    curve = []
    for step in range(args.train_steps):
        rows = torch.randint(0, args.pool, (args.train_batch,), generator=g)
        x = masked_inputs(tokens[rows], lengths[rows], seed=args.seed * 100_000 + step)
        q = truth[rows, x.positions].to(args.device)  # (B, V)
        logits = word_logits(model, x.input_ids.to(args.device), x.attention_mask.to(args.device),
                             x.positions.to(args.device))
        loss = -(q * logits.log_softmax(-1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == args.train_steps - 1:
            curve.append(round(loss.item(), 4))
    model.eval()
    return curve


def inputs_needed(values: torch.Tensor, target: float, groups: int) -> float:
    """Inputs for a relative s.e. of ``target``, from per-input values: n (rse / target)^2."""
    mean, se = grouped_mean_se(values, groups)
    return len(values) * (se / abs(mean) / target) ** 2


def flatlm_run(model, x, cfg, args):
    values, seconds = timed(lambda: per_input_values(model, x, cfg, device=args.device),
                            args.device)
    mean, se = grouped_mean_se(values, cfg.se_groups)
    return {"values": values, "seconds": seconds, "mean": mean, "se": se, "n": len(values)}


def curvlinops_run(model, x, cfg, args, B: int, n_probes: int):
    """Hutchinson on curvlinops' GGN (= F for cross-entropy), one operator per batch of B
    fresh inputs with ``n_probes`` Rademacher vectors."""
    from curvlinops import GGNLinearOperator, hutchinson_trace

    class Head(nn.Module):  # X (a dict of the batch) -> word logits (B, V)
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, X):
            return word_logits(self.m, X["input_ids"], X["attention_mask"], X["positions"])

    func = Head(model)
    params = list(selected_parameters(model, cfg.exclude).values())
    torch.manual_seed(args.seed + 3)  # curvlinops draws its probes from the global RNG
    estimates = []

    def run():
        for start in range(0, args.hutchinson_batches * B, B):
            b = x.batch(start, start + B, args.device)
            X = {"input_ids": b.input_ids, "attention_mask": b.attention_mask,
                 "positions": b.positions}
            op = GGNLinearOperator(func, nn.CrossEntropyLoss(), params, [(X, b.targets)],
                                   check_deterministic=False,
                                   batch_size_fn=lambda X: X["input_ids"].shape[0])
            estimates.append(float(hutchinson_trace(op, num_matvecs=n_probes)))

    with eager_attention(model), torch.no_grad():
        _, seconds = timed(run, args.device)
    mean, se = grouped_mean_se(estimates, len(estimates))
    needed_units = len(estimates) * (se / abs(mean) / args.target) ** 2
    return {"seconds": seconds, "mean": mean, "se": se, "n": len(estimates) * B,
            "seconds_to_target": seconds / len(estimates) * needed_units,
            "batch_size": B, "probes": n_probes}


def bench_model(name: str, src, args) -> list[dict]:
    """Train ``name`` briefly, then time every method on the same inputs; rows for the JSON."""
    mcfg = dataclasses.replace(parse_model(name), dropout=0.0)
    model = build_model(mcfg, src.V, src.max_length, seed=args.seed).to(args.device)
    curve, train_s = timed(lambda: train(model, src, args), args.device)
    print(f"[{name}] trained {args.train_steps} steps in {train_s:.0f} s, loss {curve}")

    tokens, lengths = src.sample(args.max_inputs, seed=args.seed + 10)
    x_all = masked_inputs(tokens, lengths, seed=args.seed + 11)
    probe = FlatnessConfig(n_inputs=10_000, batch_size=args.batch_size, estimator="probe",
                           seed=args.seed)
    sampled = dataclasses.replace(probe, estimator="sampled")

    def sub(n):
        return x_all.batch(0, n, "cpu")

    # flatlm: pilot, then as many inputs as the pilot says reach the target (measured)
    flatlm_run(model, sub(args.batch_size), probe, args)  # warm-up
    pilot = flatlm_run(model, sub(args.pilot), probe, args)
    n_fast = min(args.max_inputs, max(args.pilot, math.ceil(
        inputs_needed(pilot["values"], args.target, probe.se_groups) * 1.2)))
    fast = {"probe": flatlm_run(model, sub(n_fast), probe, args),
            "sampled": flatlm_run(model, sub(n_fast), sampled, args)}
    need = {k: inputs_needed(r["values"], args.target, probe.se_groups) for k, r in fast.items()}
    to_target = {k: r["seconds"] / r["n"] * need[k] for k, r in fast.items()}
    for k, r in fast.items():
        print(f"[{name}] flatlm {k}: Tr(F) = {r['mean']:.4g} +- {r['se']:.3g} on {r['n']} "
              f"inputs in {r['seconds']:.1f} s ({r['seconds'] / r['n'] * 1e3:.2f} ms/input); "
              f"to {args.target:.0%}: {to_target[k]:.1f} s")

    # per-example loop on a subset: seconds per input, and agreement with flatlm
    loop = {}
    for k, cfg in (("sampled", sampled), ("probe", probe)):
        xs = sub(args.loop_inputs)
        vals, sec = timed(lambda cfg=cfg, xs=xs: per_input_values(
            model, xs, cfg, device=args.device, method="loop"), args.device)
        ref = per_input_values(model, xs, cfg, device=args.device)  # ghost / vmap (LSTM)
        loop[k] = {"ms_per_input": sec / len(xs) * 1e3, "n": len(xs),
                   "max_rel_diff": float(((vals - ref).abs() / ref.abs()).max()),
                   "to_target": sec / len(xs) * need[k]}
        print(f"[{name}] loop {k}: {loop[k]['ms_per_input']:.2f} ms/input, to "
              f"{args.target:.0%}: {loop[k]['to_target']:.1f} s; max rel diff to flatlm "
              f"{loop[k]['max_rel_diff']:.1e}")

    runs = []
    settings = args.hutchinson if has_curvlinops() else []
    for setting in settings:  # the baseline gets its best batch size / probe count
        B, k = (int(v) for v in setting.split("x"))
        runs.append(curvlinops_run(model, x_all, probe, args, B, k))
        print(f"[{name}] curvlinops GGN Hutchinson {setting}: {runs[-1]['mean']:.4g} +- "
              f"{runs[-1]['se']:.3g}, to {args.target:.0%}: {runs[-1]['seconds_to_target']:.1f} s")
    cl = min(runs, key=lambda r: r["seconds_to_target"]) if runs else None

    best = min(to_target, key=to_target.get)
    common = {
        "model": name, "n_params": count_parameters(model),
        "n_params_counted": sum(p.numel() for p in selected_parameters(model, probe.exclude)
                                .values()),
        "source": args.source, "vocab": src.V, "max_length": src.max_length,
        "train_steps": args.train_steps, "train_loss_curve": curve,
        "target_rse": args.target,
        "trace_fisher": fast["probe"]["mean"], "trace_fisher_se": fast["probe"]["se"],
        "trace_fisher_sampled": fast["sampled"]["mean"],
        "trace_fisher_sampled_se": fast["sampled"]["se"],
        "inputs_to_target": {k: round(v) for k, v in need.items()},
        "flatlm_ms_per_input": {k: r["seconds"] / r["n"] * 1e3 for k, r in fast.items()},
        "flatlm_measured": {k: {"inputs": r["n"], "seconds": r["seconds"],
                                "rse": r["se"] / abs(r["mean"])} for k, r in fast.items()},
        "loop_ms_per_input": {k: v["ms_per_input"] for k, v in loop.items()},
        "timer": "process CPU time" if clock(args.device) is time.process_time else "wall",
        "torch": torch.__version__,
    }
    rows = [
        {"metric": "seconds_to_2pct_rse_trace_fisher", "flatlm": to_target["probe"],
         "flatlm_estimator": "probe (default)",
         "baseline": loop["sampled"]["to_target"],
         "baseline_name": "per-example backward loop, sampled labels (paper B.1)",
         "baseline_max_rel_diff": loop["sampled"]["max_rel_diff"]},
        {"metric": "seconds_to_2pct_rse_trace_fisher", "flatlm": to_target[best],
         "flatlm_estimator": f"{best} (the faster here)",
         "baseline": loop["sampled"]["to_target"],
         "baseline_name": "per-example backward loop, sampled labels (paper B.1)"},
        {"metric": "seconds_to_2pct_rse_trace_fisher_same_estimator", "flatlm": to_target["probe"],
         "flatlm_estimator": "probe", "baseline": loop["probe"]["to_target"],
         "baseline_name": "per-example backward loop, same Rademacher probe",
         "baseline_max_rel_diff": loop["probe"]["max_rel_diff"]},
        {"metric": "seconds_to_2pct_rse_trace_fisher_same_estimator",
         "flatlm": to_target["sampled"], "flatlm_estimator": "sampled",
         "baseline": loop["sampled"]["to_target"],
         "baseline_name": "per-example backward loop, same sampled labels"},
    ]
    if cl is not None:  # --hutchinson with no settings leaves curvlinops out (LSTMs)
        rows.append({
            "metric": "seconds_to_2pct_rse_trace_fisher", "flatlm": to_target[best],
            "flatlm_estimator": best, "baseline": cl["seconds_to_target"],
            "baseline_name": "curvlinops 3.0.1 GGNLinearOperator + hutchinson_trace "
                             "(GGN = F for cross-entropy; eager attention)",
            "baseline_estimate": cl["mean"], "baseline_estimate_se": cl["se"],
            "hutchinson_batch_size": cl["batch_size"],
            "hutchinson_probes_per_batch": cl["probes"],
            "hutchinson_settings_tried": {f"{r['batch_size']}x{r['probes']}":
                                          r["seconds_to_target"] for r in runs}})
    if args.paper_precision:
        rows.append(paper_precision_row(name, model, x_all, sampled, args))
    for row in rows:
        row["ratio"] = row["baseline"] / row["flatlm"]
        row["device"] = device_name(args.device)
        row["command"] = "python " + " ".join(sys.argv)
        row.update(common)
        print(f"[{name}] {row['metric']}: flatlm {row['flatlm_estimator']} "
              f"{row['flatlm']:.2f} s vs {row['baseline_name']} {row['baseline']:.2f} s: "
              f"{row['ratio']:.1f}x")
    return rows


def has_curvlinops() -> bool:
    """Whether curvlinops imports; without it (a GPU host with no package index) its rows are
    left out with a message, as bench/truth.py does for its baselines."""
    try:
        import curvlinops  # noqa: F401
    except ImportError:
        print("skipped: curvlinops is not installed (its baseline rows are left out)")
        return False
    return True


def paper_precision_row(name: str, model, x_all, sampled: FlatnessConfig, args) -> dict:
    """Seconds for Tr(F) at the paper's B.1 precision (``--paper-precision`` inputs x labels,
    10^4 x 50: sampled labels c ~ p_theta), measured for flatlm; the per-example loop's seconds
    per input at that label count, timed on ``--loop-inputs`` of them, times the inputs."""
    n, labels = args.paper_precision
    if n > len(x_all):
        raise ValueError(f"--paper-precision {n} inputs but --max-inputs is {len(x_all)}; raise "
                         "--max-inputs")
    cfg = dataclasses.replace(sampled, labels_per_input=labels)
    values, seconds = timed(lambda: per_input_values(model, x_all.batch(0, n, "cpu"), cfg,
                                                     device=args.device), args.device)
    mean, se = grouped_mean_se(values, cfg.se_groups)
    xs = x_all.batch(0, args.loop_inputs, "cpu")
    _, loop_s = timed(lambda: per_input_values(model, xs, cfg, device=args.device,
                                               method="loop"), args.device)
    print(f"[{name}] paper precision ({n} inputs x {labels} labels): flatlm "
          f"{seconds:.1f} s, Tr(F) = {mean:.4g} +- {se:.3g}")
    return {"metric": "seconds_trace_fisher_paper_precision", "flatlm": seconds,
            "flatlm_estimator": f"sampled, {labels} labels per input, {n} inputs",
            "baseline": loop_s / len(xs) * n,
            "baseline_name": f"per-example backward loop, same labels (timed on {len(xs)} "
                             "inputs, times the inputs)",
            "paper_precision_estimate": mean, "paper_precision_se": se,
            "paper_precision_rse": se / abs(mean)}


def device_name(device) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} thread(s))"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", nargs="+", default=["bert-2m", "d128-h2-l2-i512"],
                   help="presets or shape strings, each benchmarked in turn")
    p.add_argument("--source", default="pcfg:paper")
    p.add_argument("--train-steps", type=int, default=300)
    p.add_argument("--train-batch", type=int, default=128)
    p.add_argument("--pool", type=int, default=4096, help="training sentences")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=256, help="flatlm inputs per pass")
    p.add_argument("--pilot", type=int, default=2048, help="flatlm pilot inputs")
    p.add_argument("--max-inputs", type=int, default=30_000)
    p.add_argument("--loop-inputs", type=int, default=300)
    p.add_argument("--hutchinson-batches", type=int, default=40)
    p.add_argument("--hutchinson", nargs="*", default=["8x1", "32x1", "32x4", "32x16", "128x4"],
                   help="curvlinops settings tried, BATCHxPROBES; the fastest is reported "
                        "(none: no curvlinops rows, e.g. for the BiLSTMs)")
    p.add_argument("--target", type=float, default=0.02, help="relative standard error")
    p.add_argument("--paper-precision", type=int, nargs=2, metavar=("INPUTS", "LABELS"),
                   help="also time Tr(F) at B.1's precision, e.g. 10000 50 (sampled labels)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (1: time by process CPU time, robust on a shared "
                        "machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/flatness_cpu.json")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    src = load(args.source)
    rows = [row for name in args.model for row in bench_model(name, src, args)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
