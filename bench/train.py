"""Pre-training throughput: flatlm's update against stock transformers recipes, same batches.

For each preset, in the same run, on the same masked batches of the paper's PCFG (one masked word
per sentence, V = 200 words, 18 input positions, about 70% of them real tokens):

- flatlm, in each layout of ``--variants`` (``train.sequence_packing``): what ``flatlm.train``
  runs (``BatchPipeline.cpu_inputs`` then ``standard_step``, the adamw update), the MLM head only
  at the masked words, SDPA attention, AdamW; on CUDA also bf16 autocast, the fused AdamW kernel
  and torch.compile (``train.compile=auto``). ``padded``: every sentence at all 18 positions;
  ``unpadded`` (the default variant): each pass's sentences sorted by length into four
  micro-batches, each cut to its longest sentence; ``rows``: sentences end to end in rows of
  ``--row-length`` slots, one micro-batch (``flatlm.train.rows``).
- ``hf-fp32``: ``transformers.BertForMaskedLM`` as it used to be trained: float32, eager
  attention, logits at every position over the whole vocabulary, the loss through ``labels=``
  (-100 off the masked words), for-loop AdamW.
- ``hf-bf16``: the same model as transformers 5 trains it by default: SDPA attention, bf16
  autocast, torch's default (foreach) AdamW. The fair comparison for flatlm's bf16.
- ``flatlm-padded``: flatlm's update on the same batches without unpadding: what it alone gains
  (the same as the ``padded`` variant; kept for the earlier commands).

Every side accumulates gradients over micro-batches as training does: each starts at
``--micro-batch-size`` (default: the whole batch on CUDA; flatlm: a quarter of it, four length
groups each cut to its longest sentence) and halves it after an out-of-memory error, so the
paper's batch 4096 runs for every preset on one GPU; the micro-batch each side used is
recorded. Same shape, dropout (0.1) and initialisation on every side. ``first_step_s``: each
side's seconds from building its model to the end of its first update (compiling included).

``--prefetch 0,auto,2:processes`` (``train.prefetch[:train.prefetch_workers]``): the update of
the variant training runs on the device (unpadded on CUDA, padded on the CPU; else the first)
again with each batch built as training builds it (sampled, masked, laid out,
pinned and copied) at each setting, the same compiled model, ``--prefetch-steps`` updates each:
whether a GPU update waits on the host (``train_tokens_per_s_prefetch`` rows, against the first
setting; ``host_batch_s``: one batch built on the host alone).

Throughput is the best of ``--repeats`` interleaved passes over ``--batches`` batches, counted
two ways: real tokens ([CLS], the words, [SEP]: what the step must compute) and input positions
(batch x 18, padding included); ``flatlm_positions_per_batch`` is what flatlm's trimmed
micro-batches hold. On a GPU, model FLOPs utilisation is 6 x parameters x real
tokens / time / peak, with peak = 798 TFLOP/s, the dense bf16 matmul peak measured on the
project's H100 (8192^3; ``--peak-flops`` to change it); the same over input positions is kept
beside it (``mfu_positions``), comparable with earlier figures that counted padding. On a CPU a
second row divides by process CPU time instead of wall time, which other processes on a shared
machine disturb less; ``load_avg_1m`` records how shared it was.

    python bench/train.py             # CPU, small presets: bench/results/train_cpu.json
    python bench/train.py --variants padded,unpadded,rows --baselines hf-bf16  # each layout
    for p in bert-12.8m bert-41m bert-110m bert-234m bert-950m; do       # batch 4096
        python bench/train.py --device cuda --presets $p --merge; done   # -> train_cuda.json

Only the core library is imported (no Ray, MLflow or datasets).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import BertForMaskedLM

from flatlm.core.tokens import WORD_OFFSET
from flatlm.models import bert_config, build_model, count_parameters, parse_model
from flatlm.sources import load
from flatlm.train.algorithms import StepContext, build_optimizer, standard_step
from flatlm.train.compiled import loss_function
from flatlm.train.config import TrainConfig, resolve, sequence_packing_for, switch_on
from flatlm.train.data import BatchPipeline, FreshSamples, StepInputs, prefetch_depth
from flatlm.train.loop import autocast_for

PEAK_FLOPS = 798e12  # dense bf16 matmul (8192^3), measured on the project's H100 80 GB
PEAK_NAME = "dense bf16 matmul 8192^3 measured on the project's H100 (798 TFLOP/s)"
BASELINES = {
    "hf-fp32": "transformers BertForMaskedLM fp32, eager attention, full-sequence logits over "
               "the vocabulary + labels=-100 loss, for-loop AdamW",
    "hf-bf16": "transformers BertForMaskedLM bf16 autocast, SDPA attention (transformers 5's "
               "default), full-sequence logits over the vocabulary + labels=-100 loss, "
               "foreach AdamW (torch's default)",
    "flatlm-padded": "flatlm's own update without train.unpad: every micro-batch at all 18 "
                     "positions (what unpadding alone gains)",
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


VARIANTS = ("padded", "unpadded", "rows")  # train.sequence_packing, as flatlm sides


def train_config(args, micro: int | None, layout: str = "unpadded") -> TrainConfig:
    """flatlm's settings for the bench: the adamw update, constant rate, no warmup."""
    return resolve(TrainConfig(batch_size=args.batch_size, micro_batch_size=micro,
                               precision=args.dtype, compile=args.compile,
                               sequence_packing=layout, row_length=args.row_length,
                               warmup_steps=0))


def batches(src, args, device: torch.device, layout: str = "padded",
            micro: int | None = None) -> list[StepInputs]:
    """``--batches`` masked batches of fresh sentences, prepared as training prepares them in
    ``layout`` (the same sentences and masks in every layout)."""
    cfg = train_config(args, micro, layout)
    pipeline = BatchPipeline(cfg, FreshSamples(src, args.batch_size, seed=1000), device)
    return [pipeline.cpu_inputs(i).to(device) for i in range(args.batches)]


def flatlm_step(model_cfg, src, device, args, micro: int, layout: str = "unpadded"):
    """flatlm's update in ``layout`` (padded: the stock sides' batches, their lengths unknown,
    so that no micro-batch is cut)."""
    cfg = train_config(args, micro, layout)
    model = build_model(model_cfg, src.V, src.max_length, seed=0).to(device).train()
    ctx = StepContext(cfg=cfg, model=model,
                      optimizer=build_optimizer(cfg, model, fused=device.type == "cuda"),
                      autocast=autocast_for(cfg, device), mlm_loss=loss_function(cfg, device))
    if layout == "padded":
        return model, lambda inputs: standard_step(
            ctx, StepInputs(dataclasses.replace(inputs.mlm, lengths=None)))
    return model, lambda inputs: standard_step(ctx, inputs)


def stock_step(model_cfg, src, device, baseline: str, micro: int):
    config = bert_config(model_cfg, src.V, src.max_length)
    bf16 = baseline == "hf-bf16"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = BertForMaskedLM._from_config(config,
                                             attn_implementation="sdpa" if bf16 else "eager")
    model = model.to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    loop = {} if bf16 else {"foreach": False, "fused": False}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.98), eps=1e-6, **loop)

    def autocast():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def step(inputs: StepInputs):
        opt.zero_grad(set_to_none=True)
        for b in inputs.mlm.split(micro):  # one masked word per sentence: mean = sum / batch
            labels = torch.full_like(b.input_ids, -100)
            rows = torch.arange(len(b), device=labels.device)
            labels[rows, b.positions + 1] = b.targets + WORD_OFFSET
            with autocast():
                out = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                            labels=labels)
            (out.loss * (len(b) / len(inputs.mlm))).backward()
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


def fitting_side(side, device, args, micro: int):
    """(step, its batches, (micro-batch, parameters, seconds to the first step)) of the side
    ``side = (build, data)`` (``build(micro)`` -> (model, step), ``data(micro)`` -> batches), at
    the largest micro-batch from ``micro`` down (halving) whose warm-up steps fit in memory."""
    build, data_for = side
    while True:
        try:
            data = data_for(micro)
            _sync(device)
            start = time.perf_counter()
            model, step = build(micro)
            for i in range(max(1, args.warmup)):
                step(data[i % len(data)])
                if i == 0:
                    _sync(device)
                    first = time.perf_counter() - start
            _sync(device)
            return step, data, (micro, count_parameters(model), first)
        except torch.OutOfMemoryError:
            if micro % 2 or micro == 1:
                raise
        model = step = data = None  # out of the handler: its traceback no longer holds them
        gc.collect()
        torch.cuda.empty_cache()
        micro //= 2
        print(f"  out of memory: trying micro-batch {micro}", flush=True)


def prefetch_times(step, src, device, args, micro: int, layout: str) -> dict[str, dict]:
    """{setting: {"seconds_per_step", "depth", "workers"}} of ``step`` (built, compiled and
    warm) with each update's batch built on the fly by a ``BatchPipeline`` at each
    ``--prefetch`` setting, and ``host_batch_s`` under the key "host" (one batch on the host)."""
    base = train_config(args, micro, layout)
    pipeline = BatchPipeline(base, FreshSamples(src, args.batch_size, seed=2000), device)
    start = time.perf_counter()
    pipeline.cpu_inputs(0)
    out = {"host": {"host_batch_s": time.perf_counter() - start}}
    for setting in args.prefetch:
        depth, _, workers = setting.partition(":")
        cfg = dataclasses.replace(base, prefetch=depth, prefetch_workers=workers or "threads")
        pipeline = BatchPipeline(cfg, FreshSamples(src, args.batch_size, seed=2000), device,
                                 prefetch=prefetch_depth(cfg, device),
                                 workers=cfg.prefetch_workers)
        try:
            warm = max(1, pipeline.depth + 1)  # its workers started and the queue full
            for i in range(warm):
                step(pipeline.inputs_at(i))
            _sync(device)
            start = time.perf_counter()
            for i in range(warm, warm + args.prefetch_steps):
                step(pipeline.inputs_at(i))
            _sync(device)
        finally:
            pipeline.close()
        out[setting] = {"seconds_per_step": (time.perf_counter() - start) / args.prefetch_steps,
                        "depth": pipeline.depth, "workers": cfg.prefetch_workers}
    return out


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def interleaved(builders, start, device, args, ahead_of):
    """({side: [(wall, cpu) per pass]}, {side: (micro-batch, parameters, first step s)},
    {side: ``ahead_of(side, step, micro)``}), every side built first and their passes
    interleaved, so that drifts in a shared machine's load hit all alike."""
    sides = {name: fitting_side(side, device, args, start[name])
             for name, side in builders.items()}
    times = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, (step, data, _) in sides.items():
            times[name].append(seconds_per_step(step, data, device, 0))
    ahead = {name: ahead_of(name, step, info[0]) for name, (step, _, info) in sides.items()}
    return times, {name: s[2] for name, s in sides.items()}, ahead


def one_at_a_time(builders, start, device, args, ahead_of):
    """As ``interleaved``, one side after the other, each freed before the next is built: a
    GPU is not shared, and four copies of bert-950m's AdamW state would not fit beside each
    other."""
    times, sides, ahead = {}, {}, {}
    for name, side in builders.items():
        step, data, sides[name] = fitting_side(side, device, args, start[name])
        times[name] = [seconds_per_step(step, data, device, 0) for _ in range(args.repeats)]
        ahead[name] = ahead_of(name, step, sides[name][0])
        del step, data
        fresh_device(device)
    return times, sides, ahead


def fresh_device(device: torch.device) -> None:
    """The previous preset's memory freed and its compiled graphs dropped (torch.compile keeps
    at most 8 per function: the presets after that would silently run eagerly)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch._dynamo.reset()


def side_builders(model_cfg, src, device, args) -> tuple[dict, dict]:
    """({side: (build(micro), data(micro))}, {side: the micro-batch it starts from}): flatlm in
    each of ``--variants`` (``flatlm-<layout>``), then each of ``--baselines`` on the padded
    batches."""
    padded = batches(src, args, device)
    builders, start = {}, {}
    for layout in args.variants:
        builders[f"flatlm-{layout}"] = (
            lambda m, layout=layout: flatlm_step(model_cfg, src, device, args, m, layout),
            (lambda m: padded) if layout == "padded" else
            (lambda m, layout=layout: batches(src, args, device, layout, m)))
        start[f"flatlm-{layout}"] = args.flatlm_micro[layout]
    for name in args.baselines:
        if name == "flatlm-padded":
            builders[name] = (lambda m: flatlm_step(model_cfg, src, device, args, m, "padded"),
                              lambda m: padded)
            start[name] = args.flatlm_micro["padded"]
        else:
            builders[name] = (lambda m, name=name: stock_step(model_cfg, src, device, name, m),
                              lambda m: padded)
            start[name] = args.micro_batch_size
    return builders, start


def positions_computed(src, args, layout: str, micro: int) -> float:
    """Input positions a flatlm variant computes per batch: padded 18 a sentence, unpadded its
    micro-batches cut to their longest sentence, rows every slot of every row."""
    data = batches(src, args, torch.device("cpu"), layout, micro)
    if layout == "padded":
        return float(data[0].mlm.input_ids.numel())
    return sum(m.trimmed().input_ids.numel() for b in data for m in b.mlm.split(micro)) / len(data)


def bench_preset(preset, src, device, args) -> list[dict]:
    fresh_device(device)
    model_cfg = dataclasses.replace(parse_model(preset), dropout=0.1)
    builders, start = side_builders(model_cfg, src, device, args)
    measure = interleaved if device.type == "cpu" else one_at_a_time
    trained = sequence_packing_for(TrainConfig(), device.type)  # what training runs here
    first = trained if trained in args.variants else args.variants[0]

    def ahead_of(name, step, micro):  # that variant, at each --prefetch setting
        if name != f"flatlm-{first}" or not args.prefetch:
            return None
        return prefetch_times(step, src, device, args, micro, first)

    times, sides, ahead = measure(builders, start, device, args, ahead_of)
    assert len({s[1] for s in sides.values()}) == 1  # the same model on every side
    wall = {name: min(t[0] for t in ts) for name, ts in times.items()}
    cpu = {name: min(t[1] for t in ts) for name, ts in times.items()}
    data = batches(src, args, torch.device("cpu"))
    real = sum(int(b.mlm.attention_mask.sum()) for b in data) / len(data)  # per batch
    positions = args.batch_size * (src.max_length + 2)
    n_params, cfg = next(iter(sides.values()))[1], train_config(args, None)
    common = {
        "device": device_name(device), "command": args.command, "torch": torch.__version__,
        "preset": preset,
        "params": n_params, "batch": args.batch_size, "positions": src.max_length + 2,
        "real_tokens_per_batch": real, "real_fraction": real / positions, "vocab": src.V,
        "dtype": "bf16" if isinstance(autocast_for(cfg, device)(), torch.autocast) else "fp32",
        "compile": switch_on(cfg.compile, device.type), "row_length": args.row_length,
        "batches": args.batches, "repeats": args.repeats,
        "micro_batch": {name: s[0] for name, s in sides.items()},
        "first_step_s": {name: s[2] for name, s in sides.items()}}
    rows = []
    for layout in args.variants:
        side = f"flatlm-{layout}"
        computed = positions_computed(src, args, layout, sides[side][0])
        for name in [b for b in args.baselines if b != side]:
            base = {**common, "variant": layout, "flatlm_positions_per_batch": computed,
                    "baseline_name": f"{name}: {BASELINES[name]}"}
            rows += metric_rows(side, name, wall, cpu, real, positions, n_params, device, args,
                                base)
    if ahead[f"flatlm-{first}"]:
        rows += prefetch_rows(ahead[f"flatlm-{first}"], real, {**common, "variant": first})
    return rows


def prefetch_rows(times: dict, real: float, common: dict) -> list[dict]:
    """Real tokens per second with batches built on the fly at each ``--prefetch`` setting,
    against the first setting."""
    host = times.pop("host")["host_batch_s"]
    (reference, ref), *_ = times.items()
    return [{"metric": "train_tokens_per_s_prefetch", "prefetch": setting,
             "prefetch_depth": t["depth"], "prefetch_workers": t["workers"],
             "flatlm": real / t["seconds_per_step"], "baseline": real / ref["seconds_per_step"],
             "ratio": ref["seconds_per_step"] / t["seconds_per_step"],
             "seconds_per_step": t["seconds_per_step"], "host_batch_s": host,
             "baseline_name": f"prefetch {reference}: the same update, batches built at the "
                              "first --prefetch setting", **common}
            for setting, t in times.items()]


def metric_rows(side, name, wall, cpu, real, positions, n_params, device, args, base):
    """Throughput of ``side`` against baseline ``name``: tokens/s; on the CPU also per CPU
    second, on CUDA model FLOPs utilisation."""
    rows = [{"metric": "train_tokens_per_s", "flatlm": real / wall[side],
             "baseline": real / wall[name], "ratio": wall[name] / wall[side],
             "flatlm_positions_per_s": positions / wall[side],
             "baseline_positions_per_s": positions / wall[name], **base}]
    if device.type == "cpu":
        rows.append({"metric": "train_tokens_per_cpu_s", "flatlm": real / cpu[side],
                     "baseline": real / cpu[name], "ratio": cpu[name] / cpu[side],
                     "load_avg_1m": round(os.getloadavg()[0], 2), **base})
    else:
        mfu = {k: 6 * n_params * real / wall[k] / args.peak_flops for k in (side, name)}
        rows.append({"metric": "mfu", "flatlm": mfu[side], "baseline": mfu[name],
                     "ratio": mfu[side] / mfu[name],
                     "mfu_positions": {k: v * positions / real for k, v in mfu.items()},
                     "peak_flops": args.peak_flops, "peak_name": args.peak_name, **base})
    return rows


def print_rows(rows: list[dict]) -> None:
    for r in rows:
        print(f"{r['preset']:>10} {r['variant']:>8} {r['metric']:>22} vs "
              f"{r['baseline_name'].split(':')[0]}: "
              f"flatlm {r['flatlm']:,.4g}  baseline {r['baseline']:,.4g}  "
              f"ratio {r['ratio']:.2f}x", flush=True)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--presets", default="bert-2m,bert-4.8m,bert-8.3m")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sentences per update (default: 4096 on CUDA, 256 on the CPU)")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="sentences per pass the baselines start from, halved on out-of-memory "
                        "(default: the whole batch on CUDA, 64 on the CPU)")
    p.add_argument("--flatlm-micro-batch-size", type=int, default=None,
                   help="the same for flatlm's variants (and flatlm-padded); default: a "
                        "quarter of the batch unpadded (four length groups, each cut to its "
                        "longest sentence), the whole batch in rows (one pass), else as "
                        "--micro-batch-size")
    p.add_argument("--variants", default="unpadded",
                   help=f"flatlm's layouts (train.sequence_packing), comma-separated, of "
                        f"{', '.join(VARIANTS)}")
    p.add_argument("--row-length", type=int, default=TrainConfig.row_length,
                   help="train.row_length of the rows variant")
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                   help="flatlm's precision (train.precision; auto: bf16 on CUDA)")
    p.add_argument("--compile", default="auto", help="train.compile: true, false, auto")
    p.add_argument("--baselines", default="hf-fp32,hf-bf16,flatlm-padded",
                   help=f"comma-separated, of {', '.join(BASELINES)}")
    p.add_argument("--source", default="pcfg:paper")
    p.add_argument("--batches", type=int, default=4, help="distinct batches per timed pass")
    p.add_argument("--warmup", type=int, default=3, help="steps per side before timing "
                   "(on CUDA: enough for torch.compile to see the micro-batch shapes)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per side (best kept)")
    p.add_argument("--prefetch", default="",
                   help="comma-separated train.prefetch[:train.prefetch_workers] settings, e.g. "
                        "0,auto,2:processes: the update training runs on the device, with "
                        "batches built on the fly at each (default: none)")
    p.add_argument("--prefetch-steps", type=int, default=20,
                   help="timed updates per --prefetch setting")
    p.add_argument("--peak-flops", type=float, default=PEAK_FLOPS)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads for torch (default 1: OpenMP threads that wait on cores "
                        "held by other processes make shared-machine timings erratic; 0 = "
                        "torch's default)")
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/train_<cpu|cuda>.json")
    p.add_argument("--merge", action="store_true",
                   help="replace only these presets' rows in --out (run presets one at a "
                        "time, e.g. within a time limit per command)")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.batch_size = args.batch_size or (4096 if cuda else 256)
    if args.micro_batch_size is None:
        args.micro_batch_size = args.batch_size if cuda else min(64, args.batch_size)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not args.variants or set(args.variants) - set(VARIANTS):
        p.error(f"--variants {','.join(args.variants)}: use some of {', '.join(VARIANTS)}")
    quarter = (min(args.micro_batch_size, args.batch_size // 4) if args.batch_size % 4 == 0
               else args.micro_batch_size)
    args.flatlm_micro = {layout: args.flatlm_micro_batch_size or {
        "unpadded": quarter, "rows": args.batch_size}.get(layout, args.micro_batch_size)
        for layout in VARIANTS}
    args.baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    unknown = [b for b in args.baselines if b not in BASELINES]
    if unknown:
        p.error(f"--baselines: unknown {unknown}; use {', '.join(BASELINES)}")
    args.peak_name = PEAK_NAME if args.peak_flops == PEAK_FLOPS else "--peak-flops"
    args.command = " ".join(["python", "bench/train.py", *(argv if argv is not None
                                                           else sys.argv[1:])])
    for layout in args.variants:  # bad settings: the config's message, now
        train_config(args, args.flatlm_micro[layout], layout)
    args.prefetch = [x.strip() for x in args.prefetch.split(",") if x.strip()]
    for setting in args.prefetch:
        depth, _, workers = setting.partition(":")
        try:
            TrainConfig(prefetch=depth, prefetch_workers=workers or "threads")
        except ValueError as e:
            p.error(f"--prefetch {setting}: {e}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 baseline stays true fp32
    src = load(args.source)
    rows = []
    for preset in args.presets.split(","):
        new = bench_preset(preset.strip(), src, device, args)
        print_rows(new)
        rows += new
    out = args.out or Path(__file__).parent / "results" / f"train_{device.type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.merge and out.exists():  # keep the other presets' rows: one preset per command
        done = {r["preset"] for r in rows}
        rows = [r for r in json.loads(out.read_text()) if r["preset"] not in done] + rows
    out.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
