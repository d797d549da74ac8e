"""Small trials sharing one device: aggregate training throughput of K concurrent trials vs one.

What ``--gpus-per-trial 0.25`` does in a sweep: Ray starts four trial processes on one GPU. Here,
in the same run, K = 1 and K = ``--trials`` processes (spawned, as Ray's are separate workers)
each train the same small model on the same kind of batches (the sweeps' PCFG,
``flatlm.experiments.scales.SWEEP_SOURCE``; the tiny sweep's d32 BERT; fresh sentences masked by
``BatchPipeline``, the adamw update ``standard_step``): after ``--warmup`` updates they wait at a
barrier, then each times ``--steps`` updates. Aggregate throughput = all trials' input
positions (batch x (T + 2)) / (last trial's end - first trial's start); the ratio is K trials'
aggregate over one trial's (best of ``--repeats`` interleaved passes of each). Each trial uses
``--threads`` CPU threads (OMP_NUM_THREADS and torch's, as Ray sets them: 1 by default), so on a
CPU the ratio is bounded by the cores; ``load_avg_1m`` records how shared the machine was.

    python bench/shared_gpu.py                       # CPU: bench/results/shared_gpu_cpu.json
    python bench/shared_gpu.py --device cuda         # one GPU: bench/results/shared_gpu_cuda.json

Only the core library is imported (no Ray, MLflow or datasets).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

BASELINE = "one trial alone on the device (same model, batch and steps)"


def trial(device: str, model: str, batch_size: int, steps: int, warmup: int, threads: int,
          seed: int, barrier, results) -> None:
    """One trial's process: ``warmup`` updates, the barrier, then ``steps`` timed updates."""
    from flatlm.experiments.scales import SWEEP_SOURCE
    from flatlm.models import build_model, parse_model
    from flatlm.sources import load
    from flatlm.train.algorithms import StepContext, build_optimizer, mlm_loss_sum, standard_step
    from flatlm.train.config import TrainConfig, resolve
    from flatlm.train.data import BatchPipeline, FreshSamples
    from flatlm.train.loop import autocast_for

    torch.set_num_threads(threads)
    dev, src = torch.device(device), load(SWEEP_SOURCE)
    cfg = resolve(TrainConfig(batch_size=batch_size, warmup_steps=0, seed=seed))
    net = build_model(parse_model(model), src.V, src.max_length, seed=seed).to(dev).train()
    ctx = StepContext(cfg=cfg, model=net, optimizer=build_optimizer(cfg, net,
                                                                    fused=dev.type == "cuda"),
                      autocast=autocast_for(cfg, dev), mlm_loss=mlm_loss_sum)
    pipeline = BatchPipeline(cfg, FreshSamples(src, batch_size, seed), dev,
                             prefetch=dev.type == "cuda")
    for i in range(warmup):
        standard_step(ctx, pipeline.inputs_at(i))
    _sync(dev)
    barrier.wait()
    start = time.time()
    for i in range(warmup, warmup + steps):
        loss = standard_step(ctx, pipeline.inputs_at(i))["train/loss"]
    float(loss)  # waits for the device
    results.put((start, time.time(), steps * batch_size * (src.max_length + 2)))
    pipeline.close()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def aggregate_throughput(k: int, args) -> float:
    """Input positions per second of ``k`` concurrent trials, all together."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(k), ctx.SimpleQueue()
    procs = [ctx.Process(target=trial, args=(args.device, args.model, args.batch_size,
                                             args.steps, args.warmup, args.threads, seed,
                                             barrier, results)) for seed in range(k)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError("a trial process failed (its traceback is above)")
    rows = [results.get() for _ in procs]
    return sum(n for _, _, n in rows) / (max(e for _, e, _ in rows) - min(s for s, _, _ in rows))


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (one device, shared)")
    p.add_argument("--trials", type=int, default=4, help="concurrent trials (default 4)")
    p.add_argument("--model", default="d32-h2-l1-i128", help="each trial's model")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=150, help="timed updates per trial")
    p.add_argument("--warmup", type=int, default=5, help="untimed updates per trial first")
    p.add_argument("--threads", type=int, default=1, help="CPU threads per trial (Ray: its CPUs)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved passes; best of each")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this machine has no CUDA device")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # as Ray sets them per trial; inherited by the trials
    one, shared = 0.0, 0.0
    for _ in range(args.repeats):  # interleaved, best of each: a shared machine's load varies
        one = max(one, aggregate_throughput(1, args))
        shared = max(shared, aggregate_throughput(args.trials, args))
    row = {"metric": "aggregate_train_positions_per_s", "flatlm": shared, "baseline": one,
           "baseline_name": BASELINE, "ratio": shared / one,
           "device": device_name(args.device), "trials": args.trials, "model": args.model,
           "batch": args.batch_size, "steps": args.steps, "threads_per_trial": args.threads,
           "repeats": args.repeats,
           "load_avg_1m": round(os.getloadavg()[0], 2),
           "command": shlex.join(["python", "bench/shared_gpu.py", *(argv or sys.argv[1:])])}
    print(f"{args.trials} trials on one {row['device']}: {shared:,.0f} positions/s together, "
          f"1 trial: {one:,.0f}; ratio {row['ratio']:.2f}")
    kind = "cuda" if args.device.startswith("cuda") else "cpu"
    out = args.out or Path(__file__).parent / "results" / f"shared_gpu_{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(row, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
