"""Pre-training throughput: flatlm's update against the stock transformers recipe, same batches.

For each preset, in the same run, on the same masked batches of the paper's PCFG (one masked word
per sentence, V = 200 words, 18 input positions):

- flatlm: ``flatlm.train.algorithms.standard_step`` (the adamw update the loop runs): the MLM head
  only at the masked words (``word_logits(..., positions=)``), SDPA attention, AdamW; on CUDA also
  bf16 autocast (``--dtype bf16``), the fused AdamW kernel and, with ``--compile``, torch.compile.
- baseline: ``transformers.BertForMaskedLM`` as usually trained: float32, eager attention, logits
  at every position over the whole vocabulary, the loss through ``labels=`` (-100 off the masked
  words), unfused (for-loop) AdamW.

Both models have the same shape, dropout (0.1) and initialisation. Tokens per second count input
positions (batch x 18), over the best of ``--repeats`` interleaved passes. On a GPU, model FLOPs
utilisation is 6 x parameters x tokens / time / peak (peak: bf16 dense tensor-core FLOP/s of the
device, ``PEAK_FLOPS``). On a CPU a second row divides by process CPU time instead of wall time,
which other processes on a shared machine disturb less; ``load_avg_1m`` records how shared it was.

    python bench/train.py                      # CPU, small presets: bench/results/train_cpu.json
    python bench/train.py --device cuda --presets bert-41m,bert-110m --dtype bf16 \\
        --batch-size 256 --out bench/results/train_cuda.json

Only the core library is imported (no Ray, MLflow or datasets).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import torch
from transformers import BertForMaskedLM

from flatlm.models import bert_config, build_model, count_parameters, parse_model
from flatlm.sources import load
from flatlm.tokens import WORD_OFFSET
from flatlm.train.algorithms import StepContext, build_optimizer, mlm_loss_sum, standard_step
from flatlm.train.config import TrainConfig, resolve
from flatlm.train.data import StepInputs, generator, mask_batch
from flatlm.train.loop import autocast_for

PEAK_FLOPS = {"H100": 989e12, "H200": 989e12}  # bf16 dense, per GPU (SXM)
BASELINE = ("transformers BertForMaskedLM fp32 eager attention, full-sequence logits over the "
            "vocabulary + labels=-100 loss, unfused AdamW")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def batches(src, n: int, batch_size: int, device: torch.device) -> list[StepInputs]:
    """``n`` masked batches of fresh sentences, on ``device``."""
    out = []
    for i in range(n):
        tokens, lengths = src.sample(batch_size, seed=1000 + i)
        out.append(StepInputs(mask_batch(tokens, lengths, "one", generator(0, "mask", i))))
    return [b.to(device) for b in out]


def flatlm_step(model_cfg, src, device, dtype: str, compile_: bool):
    cfg = resolve(TrainConfig(batch_size=1, precision=dtype, compile=compile_, warmup_steps=0))
    model = build_model(model_cfg, src.V, src.max_length, seed=0).to(device).train()
    ctx = StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model,
                                                                      fused=device.type == "cuda"),
                      autocast=autocast_for(cfg, device),
                      mlm_loss=torch.compile(mlm_loss_sum) if compile_ else mlm_loss_sum)
    return model, lambda inputs: standard_step(ctx, inputs)


def stock_step(model_cfg, src, device):
    config = bert_config(model_cfg, src.V, src.max_length)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForMaskedLM._from_config(config, attn_implementation="eager")
    model = model.to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.98), eps=1e-6, foreach=False, fused=False)

    def step(inputs: StepInputs):
        b = inputs.mlm
        labels = torch.full_like(b.input_ids, -100)
        rows = torch.arange(len(b), device=labels.device)
        labels[rows, b.positions + 1] = b.targets + WORD_OFFSET
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=b.input_ids, attention_mask=b.attention_mask, labels=labels).loss
        loss.backward()
        opt.step()

    return model, step


def seconds_per_step(step, data, device, warmup: int) -> tuple[float, float]:
    """(wall, process CPU) seconds per step over one pass over ``data``, after ``warmup`` steps.

    On a shared CPU the process time is the steadier of the two: it leaves out the time other
    processes hold the cores (with several threads it sums them).
    """
    for i in range(warmup):
        step(data[i % len(data)])
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for inputs in data:
        step(inputs)
    _sync(device)
    return (time.perf_counter() - wall) / len(data), (time.process_time() - cpu) / len(data)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def bench_preset(preset, src, device, args) -> list[dict]:
    model_cfg = dataclasses.replace(parse_model(preset), dropout=0.1)
    data = batches(src, args.batches, args.batch_size, device)
    ours, our_step = flatlm_step(model_cfg, src, device, args.dtype, args.compile)
    stock, stock_step_fn = stock_step(model_cfg, src, device)
    assert count_parameters(ours) == count_parameters(stock)
    t_ours, t_stock = [], []
    for _ in range(args.repeats):  # interleaved, so drifts in machine load hit both alike
        t_ours.append(seconds_per_step(our_step, data, device, args.warmup))
        t_stock.append(seconds_per_step(stock_step_fn, data, device, args.warmup))
    s_ours, s_stock = min(t[0] for t in t_ours), min(t[0] for t in t_stock)
    tokens = args.batch_size * (src.max_length + 2)
    n_params = count_parameters(ours)
    common = {"device": device_name(device), "preset": preset, "batch": args.batch_size,
              "positions": src.max_length + 2, "vocab": src.V, "params": n_params,
              "dtype": args.dtype if args.dtype != "auto" else
              ("bf16" if device.type == "cuda" else "fp32"),
              "compile": args.compile, "baseline_name": BASELINE,
              "batches": args.batches, "repeats": args.repeats}
    rows = [{"metric": "train_tokens_per_s", "flatlm": tokens / s_ours,
             "baseline": tokens / s_stock, "ratio": s_stock / s_ours, **common}]
    if device.type == "cpu":
        c_ours, c_stock = min(t[1] for t in t_ours), min(t[1] for t in t_stock)
        rows.append({"metric": "train_tokens_per_cpu_s", "flatlm": tokens / c_ours,
                     "baseline": tokens / c_stock, "ratio": c_stock / c_ours,
                     "load_avg_1m": round(os.getloadavg()[0], 2), **common})
    peak = peak_flops(device)
    if peak:
        mfu = [6 * n_params * tokens / s / peak for s in (s_ours, s_stock)]
        rows.append({"metric": "mfu", "flatlm": mfu[0], "baseline": mfu[1],
                     "ratio": mfu[0] / mfu[1], "peak_flops": peak, **common})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--presets", default="bert-2m,bert-4.8m,bert-8.3m")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                   help="flatlm's precision (auto: bf16 on CUDA); the baseline is always fp32")
    p.add_argument("--compile", action="store_true", help="torch.compile flatlm's loss")
    p.add_argument("--source", default="pcfg:paper")
    p.add_argument("--batches", type=int, default=4, help="distinct batches per timed pass")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="timed passes per side (best kept)")
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1: OpenMP threads that wait on cores "
                        "held by other processes make shared-machine timings erratic; 0 = "
                        "torch's default)")
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/train_<cpu|cuda>.json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the baseline stays true fp32
    src = load(args.source)
    rows = []
    for preset in args.presets.split(","):
        rows += bench_preset(preset.strip(), src, device, args)
        for r in rows[-2:]:
            print(f"{r['preset']:>10} {r['metric']:>18}: flatlm {r['flatlm']:,.4g}  "
                  f"baseline {r['baseline']:,.4g}  ratio {r['ratio']:.2f}x", flush=True)
    out = args.out or Path(__file__).parent / "results" / f"train_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
