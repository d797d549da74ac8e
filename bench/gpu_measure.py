"""The measurement part of the GPU check (issue 40, items 2-4): a paper-scale checkpoint's
measurement timed per measurement, the speed settings against the defaults, and the PCFG truth.

For one model (a saved checkpoint, or the preset randomly initialised) under the gpu scale's
measurements (``flatlm.experiments``: 10^6 validation sentences, 10^5 labelled ones, Tr(F) on
10^4 inputs; ``--n-eval`` and friends cut them):

- ``checkpoint``: ``measure_model`` at two checkpoints of one trial with the defaults (fp32,
  one Hutchinson vector per product): the first pays the once-per-trial work (evaluation data,
  reference rows, the true conditionals), the second is what every later checkpoint costs; the
  ``time/*_s`` of each measurement.
- ``settings``: Tr(F), Tr(H) and the loss under each reduced-precision setting (tf32; bf16 where
  allowed) and with the Hutchinson vectors stacked, against the defaults: seconds and the
  relative difference, beside the tolerance the setting is documented with.
- ``truth``: the fused inside-outside on the paper's grammar at ``--truth-batch`` sentences a
  chart (goal >= 400k sentences/s at 16,384 on an H200), with rule evaluations per second.

    python bench/gpu_measure.py --device cuda --out bench/results/gpu       # ~5 min on an H200
    python bench/gpu_measure.py --smoke --out /tmp/m                        # toy sizes, a CPU

Writes ``<out>/measure_<device>.json``; only the core library is imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from functools import partial
from pathlib import Path

import torch
from truth import rules_per_sentence, timed_rate  # bench/truth.py, beside this script

from flatlm.experiments.paper import base_of
from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.measure.curvature.hessian_trace import trace_hessian
from flatlm.measure.loss import pretrain_loss
from flatlm.measure.run import eval_data, measure_model
from flatlm.models.checkpoint import load_checkpoint
from flatlm.models.masked_lm import build_model
from flatlm.models.presets import ModelConfig, parse_model
from flatlm.sources import load

WHAT = ("loss", "fisher", "hessian", "probe", "lookup")
# the tolerances the settings are documented with (flatlm.measure.precision, FlatnessConfig)
TOLERANCE = {"fisher_bf16": 0.01, "fisher_tf32": 0.01, "hessian_tf32": 0.01,
             "loss_tf32": 1e-4, "hessian_stack": 1e-5}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def measure_config(smoke: bool, n_eval: int | None):
    """The gpu scale's MeasureConfig (paper protocol), or toy sizes for ``smoke``."""
    cfg = base_of("gpu", "paper").measure
    if smoke:
        cfg = dataclasses.replace(cfg, n_eval=64, n_downstream=80).with_settings(
            probe=dataclasses.replace(cfg.probe, epochs=2, seeds=1),
            flatness=dataclasses.replace(cfg.flatness, n_inputs=32, batch_size=16,
                                         hutchinson_batch_size=16, labels_per_input=2))
    if n_eval is not None:
        cfg = dataclasses.replace(cfg, n_eval=n_eval)
    return dataclasses.replace(cfg, what=WHAT)


def the_model(args, source):
    if args.checkpoint:
        model, info = load_checkpoint(args.checkpoint)
        return model, ModelConfig(**info["model"])
    shape = parse_model(args.model)
    return build_model(shape, source.V, source.max_length, seed=0), shape


def checkpoint_rows(model, source, shape, cfg, device) -> list[dict]:
    """The defaults' measurement at a first and a second checkpoint of one trial."""
    start = time.perf_counter()
    data = eval_data(source, cfg, shape, device=device)
    rows = [{"part": "eval_data", "seconds": time.perf_counter() - start}]
    for which in ("first", "second"):
        start = time.perf_counter()
        metrics = measure_model(model, source, data, cfg, device)
        _sync(device)
        rows.append({"part": f"checkpoint_{which}", "seconds": time.perf_counter() - start,
                     "times": {k: v for k, v in metrics.items() if k.startswith("time/")},
                     "metrics": {k: metrics[k] for k in ("pretrain/loss", "pretrain/kl",
                                                         "flat/trace_fisher",
                                                         "flat/trace_hessian") if k in metrics}})
    return rows, data


def _timed(fn, device):
    _sync(device)
    start = time.perf_counter()
    value = fn()
    _sync(device)
    return value, time.perf_counter() - start


def setting_rows(model, source, data, cfg, device) -> list[dict]:
    """Each speed setting's value and time against the default's, on the same inputs."""
    flat, n = cfg.flatness, min(cfg.n_eval, 20_000)
    tokens, lengths = data.tokens[:n], data.lengths[:n]

    def fisher(**kw):
        return trace_fisher(model, tokens, lengths, dataclasses.replace(flat, **kw),
                            device=device)["mean"]

    probes = FlatnessConfig(**{**dataclasses.asdict(flat), "hutchinson_probes": 4,
                               "n_inputs": min(flat.n_inputs or n, 2048)})

    def hessian(**kw):
        return trace_hessian(model, tokens, lengths, dataclasses.replace(probes, **kw),
                             device=device)["mean"]

    def loss(**kw):
        return pretrain_loss(model, source, tokens, lengths,
                             dataclasses.replace(cfg.loss, **kw), device=device)["pretrain/loss"]

    cases = [("fisher_bf16", fisher, {"fisher_precision": "bf16"}),
             ("fisher_tf32", fisher, {"fisher_precision": "tf32"}),
             ("hessian_tf32", hessian, {"hessian_precision": "tf32"}),
             ("hessian_stack", hessian, {"hutchinson_stack": 4}),
             ("loss_tf32", loss, {"precision": "tf32"})]
    rows, defaults = [], {}
    for name, fn, kw in cases:
        if fn not in defaults:
            defaults[fn] = _timed(fn, device)
        (ref, ref_s), (value, seconds) = defaults[fn], _timed(partial(fn, **kw), device)
        rel = abs(value - ref) / abs(ref) if ref else float("nan")
        rows.append({"setting": name, "default": ref, "value": value, "relative_difference": rel,
                     "tolerance": TOLERANCE[name], "within": rel <= TOLERANCE[name],
                     "default_s": ref_s, "seconds": seconds, "speedup": ref_s / seconds})
    return rows


def truth_rows(device, batch: int, n: int) -> list[dict]:
    """The fused inside-outside on the paper's grammar at ``batch`` sentences a call."""
    src = load("pcfg:paper")
    tokens, lengths = src.sample(n, seed=0)
    tokens, lengths = tokens.to(device), lengths.to(device)
    rows = []
    for fused in (True, False):
        rate = timed_rate(lambda f=fused: src.conditionals(tokens, lengths, batch_size=batch,
                                                          fused=f), n, device)
        per = rules_per_sentence(src, n, device)
        rows.append({"fused": fused, "batch_size": batch, "n_sentences": n,
                     "sentences_per_s": rate, "rule_evaluations_per_s": rate * per,
                     "goal_sentences_per_s": 400_000 if batch == 16_384 else None})
    return rows


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True, help="folder for measure_<device>.json")
    ap.add_argument("--model", default="bert-41m", help="preset or shape (random init)")
    ap.add_argument("--checkpoint", help="a saved checkpoint to measure instead")
    ap.add_argument("--n-eval", type=int, help="validation sentences (default: the scale's)")
    ap.add_argument("--truth-batch", type=int, default=16_384)
    ap.add_argument("--truth-n", type=int, default=65_536)
    ap.add_argument("--smoke", action="store_true", help="toy sizes: that it runs, not timing")
    args = ap.parse_args(argv)
    if args.smoke:
        args.model, args.truth_batch, args.truth_n = "d16-h2-l1-i32", 64, 128
    device = str(torch.device(args.device))
    source = load("pcfg:paper")
    model, shape = the_model(args, source)
    model = model.to(device)
    cfg = measure_config(args.smoke, args.n_eval)
    command = "python bench/gpu_measure.py " + " ".join(sys.argv[1:] if argv is None else argv)
    checkpoints, data = checkpoint_rows(model, source, shape, cfg, device)
    out = {"command": command, "hardware": (torch.cuda.get_device_name() if "cuda" in device
                                            else f"{platform.processor() or 'cpu'}"),
           "torch": torch.__version__, "model": args.checkpoint or args.model,
           "n_eval": cfg.n_eval, "n_downstream": cfg.n_downstream,
           "checkpoint": checkpoints, "settings": setting_rows(model, source, data, cfg, device),
           "truth": truth_rows(device, args.truth_batch, args.truth_n)}
    path = Path(args.out) / f"measure_{device.replace(':', '')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    for row in out["checkpoint"]:
        print(f"{row['part']:18s} {row['seconds']:8.2f} s")
    for row in out["settings"]:
        print(f"{row['setting']:14s} {row['speedup']:5.2f}x  rel diff "
              f"{row['relative_difference']:.2e} (tolerance {row['tolerance']:g})")
    for row in out["truth"]:
        print(f"truth fused={row['fused']!s:5s} {row['sentences_per_s']:10.0f} sentences/s  "
              f"{row['rule_evaluations_per_s']:.3g} rules/s")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
