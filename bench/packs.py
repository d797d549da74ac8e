"""K small trials as one packed model (flatlm.train.pack) against K separate trial processes.

Baseline (named in the JSON): K separate processes on the same cores, each ``train`` of one trial
(as Ray runs K trials of one CPU each), spawned together, each pinned to the same cores with one
thread; after a warm-up run they wait at a barrier, then each trains ``--steps`` updates.
Packed: one process with ``--threads`` threads on those cores runs ``train_pack`` of the same K
trials (after its own warm-up run); at 2 threads also "packed_split": 2 packs of one thread
each, the members split between them. All run the whole training loop: sampling, masking, the
update, the log read-outs. Throughput = K x steps / (last end - first start), in model-steps per
second, best of ``--repeats`` interleaved passes; the ratios are over the baseline measured in the
same run. The trials are the testbed's (its grammar, ``TESTBED_SOURCE``; its smallest sizes model
d64-h4-l2-i256; adamw, dropout 0.1), seeds 0..K-1, rates 1e-3 .. 3e-3. ``load_avg_1m`` records
how shared the machine was (other users' processes take the same cores).

``update_costs`` is the measurement that chose hand-batching over ``torch.func``: the time of
one update of K members, hand-batched (``packed_standard_step``), ``torch.func.vmap`` of
``functional_call`` over the stacked parameters (gradients by ``torch.func.grad``), and K
single-model updates in a row, in this process at one thread.

``optimizer_costs`` is the measurement that keeps the pack's optimizer hand-written
(``flatlm/train/packed_optim.py``): process CPU time of one optimizer step of K members,
hand-batched (``PackedOptimizer.step``, the baseline its ratios are over), torch's functional
AdamW / SGD once per member on the member's views (``PackedOptimizer.step_per_member``: the
single-tensor path, and foreach), and K ``torch.optim`` steps on K separate models (reference).
``--only-optimizer`` runs it alone (seconds): bench/results/packs_optimizer_cpu.json.

    python bench/packs.py                         # CPU: bench/results/packs_cpu.json
    python bench/packs.py --device cuda --sizes   # one GPU (bench/gpu_check.sh packs): packed
                                                  # vs separate, the sizes experiment packed
    python bench/packs.py --smoke --out DIR       # toy sizes (bench/gpu_check.sh smoke cpu)
    python bench/packs.py --only-optimizer        # bench/results/packs_optimizer_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

BASELINE = "K separate trial processes on the same cores (one thread each), started together"
OPTIMIZER_BASELINE = "hand-batched PackedOptimizer.step (the pack's optimizer), one thread"
MODEL = "d64-h4-l2-i256"


def trial_configs(k: int, batch_size: int, steps: int, algorithm: str = "adamw"):
    from flatlm.train import TrainConfig

    return [TrainConfig(algorithm=algorithm, steps=steps, batch_size=batch_size, warmup_steps=10,
                        seed=s, lr=1e-3 * (1 + s % 3), log_every=10) for s in range(k)]


def _setup(threads: int, cores: list[int] | None, device: str) -> None:
    torch.set_num_threads(threads)
    if cores is not None and device == "cpu" and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _source():
    from flatlm.experiments.scales import TESTBED_SOURCE
    from flatlm.sources import load

    return load(json.loads(TESTBED_SOURCE))


def one_trial(device, model, cfg, warmup, cores, barrier, results, index) -> None:
    """A separate trial's process: a warm-up run, the barrier, then the timed run."""
    from flatlm.train import train

    _setup(1, cores, device)
    source = _source()
    with tempfile.TemporaryDirectory() as tmp:
        train(dataclasses.replace(cfg, steps=warmup), source, model, Path(tmp) / "warm",
              device=device, progress=False)
        barrier.wait()
        start = time.perf_counter()
        train(cfg, source, model, Path(tmp) / "run", device=device, progress=False)
        _sync(device)
        results[index] = (start, time.perf_counter())


def packed_trials(device, model, cfgs, warmup, threads, cores, barrier, results,
                  index) -> None:
    """A pack's process: a warm-up pack, the barrier, then the timed one."""
    from flatlm.train.pack import train_pack

    _setup(threads, cores, device)
    source = _source()
    with tempfile.TemporaryDirectory() as tmp:
        warm = [dataclasses.replace(c, steps=warmup) for c in cfgs]
        train_pack(warm, source, model, [Path(tmp) / f"w{k}" for k in range(len(cfgs))],
                   device=device, progress=False)
        barrier.wait()
        start = time.perf_counter()
        train_pack(cfgs, source, model, [Path(tmp) / f"r{k}" for k in range(len(cfgs))],
                   device=device, progress=False)
        _sync(device)
        results[index] = (start, time.perf_counter())


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _span(results) -> float:
    return max(e for _, e in results.values()) - min(s for s, _ in results.values())


def _timed(ctx, target, jobs) -> float:
    """Seconds from the first job's start to the last one's end; ``jobs`` = args lists, each
    completed with (barrier, results, index), all started together."""
    with ctx.Manager() as manager:
        results, barrier = manager.dict(), ctx.Barrier(len(jobs))
        procs = [ctx.Process(target=target, args=(*a, barrier, results, i))
                 for i, a in enumerate(jobs)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise RuntimeError(f"bench/packs.py: a {target.__name__} process failed")
        return _span(dict(results))


def compare(device, model, k, batch_size, steps, warmup, threads, repeats) -> dict:
    """One row: model-steps per second of K separate processes (one thread each), of one pack
    at ``threads`` threads, and of ``threads`` packs of one thread each (the members split
    between them), all on the same ``threads`` cores; best of ``repeats`` interleaved passes."""
    ctx = mp.get_context("spawn")
    cores = list(range(threads)) if device == "cpu" else None
    cfgs = trial_configs(k, batch_size, steps)
    ways = {
        "separate": (one_trial, [(device, model, c, warmup, cores) for c in cfgs]),
        "packed": (packed_trials, [(device, model, cfgs, warmup, threads, cores)]),
    }
    if threads > 1:
        ways["packed_split"] = (packed_trials, [(device, model, cfgs[i::threads], warmup, 1,
                                                 cores) for i in range(threads)])
    best = {name: 0.0 for name in ways}
    for _ in range(repeats):
        for name, (target, jobs) in ways.items():
            best[name] = max(best[name], k * steps / _timed(ctx, target, jobs))
    row = {"threads": threads, "batch_size": batch_size, "members": k, "steps": steps}
    row.update({f"{name}_model_steps_per_s": round(v, 2) for name, v in best.items()})
    row["ratio_packed_over_separate"] = round(best["packed"] / best["separate"], 3)
    if threads > 1:
        row["ratio_packed_split_over_separate"] = round(best["packed_split"]
                                                        / best["separate"], 3)
    return row


def update_costs(model, k, batch_size, repeats, device="cpu") -> dict:
    """Seconds per update of K members (fastest of ``repeats``): hand-batched
    (``packed_standard_step``), ``torch.func.vmap`` over ``functional_call`` (its gradient only:
    the optimizer step is left out, in its favour) and K single-model ``standard_step`` in a
    row. vmap shares one batch across members: transformers' mask code branches on the mask's
    values (``padding_mask.all()``), which vmap cannot batch, so members with their own data
    would need the model rewritten, which is what hand-batching is."""
    from torch.func import functional_call, grad, vmap

    from flatlm.models.bert import build_model, word_logits
    from flatlm.models.packed import PackedBert
    from flatlm.models.presets import parse_model
    from flatlm.train.algorithms import StepContext, build_optimizer, mlm_loss_sum, standard_step
    from flatlm.train.config import resolve
    from flatlm.train.pack_steps import PackContext, packed_standard_step, stack_inputs
    from flatlm.train.packed_optim import PackedOptimizer
    from flatlm.train.run import autocast_for, build_pipeline

    source = _source()
    cfgs = [resolve(c) for c in trial_configs(k, batch_size, steps=100)]
    shape = dataclasses.replace(parse_model(model), dropout=cfgs[0].dropout)
    models = [build_model(shape, source.V, source.max_length, seed=c.seed).to(device)
              for c in cfgs]
    inputs = [build_pipeline(c, source, torch.device(device), None)[0].inputs_at(0)
              for c in cfgs]
    batch = stack_inputs(inputs)
    pack = PackedBert(models).to(device)
    ctx = PackContext(cfgs=cfgs, model=pack,
                      optimizer=PackedOptimizer(list(pack.params), cfgs, "adamw"),
                      generators=[torch.Generator(device).manual_seed(c.seed) for c in cfgs],
                      autocast=autocast_for(cfgs[0], torch.device(device)))
    singles = [StepContext(cfg=c, model=m, optimizer=build_optimizer(c, m),
                           autocast=ctx.autocast, mlm_loss=mlm_loss_sum)
               for c, m in zip(cfgs, models, strict=True)]

    class Logits(torch.nn.Module):  # functional_call swaps parameters inside a forward
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, pos):
            return word_logits(self.m, ids, mask, pos)

    wrapper = Logits(models[0])
    params = {f"m.{name}": p.detach() for name, p in zip(pack.names, pack.params, strict=True)}

    def loss(p, ids, mask, pos, targets):
        logits = functional_call(wrapper, p, (ids, mask, pos))
        return torch.nn.functional.cross_entropy(logits, targets, reduction="sum") / len(ids)

    vmapped = vmap(grad(loss), in_dims=(0, None, None, 0, 0), randomness="different")
    first = inputs[0].mlm
    timed = {
        "hand_batched": lambda: packed_standard_step(ctx, batch, [1e-3] * k),
        "torch_func_vmap_gradient": lambda: vmapped(params, first.input_ids,
                                                    first.attention_mask, batch.positions,
                                                    batch.targets),
        "k_single_models": lambda: [standard_step(c, x) for c, x in zip(singles, inputs,
                                                                         strict=True)],
    }
    row = {"members": k, "batch_size": batch_size, "threads": torch.get_num_threads()}
    best = dict.fromkeys(timed, float("inf"))
    for fn in timed.values():
        fn()  # warm-up
    for _ in range(repeats):  # interleaved, the fastest kept: others' load only slows a pass
        for name, fn in timed.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            best[name] = min(best[name], time.perf_counter() - start)
    row.update({f"{name}_s": round(v, 5) for name, v in best.items()})
    row["speedup_hand_batched"] = round(row["k_single_models_s"] / row["hand_batched_s"], 3)
    row["speedup_vmap"] = round(row["k_single_models_s"] / row["torch_func_vmap_gradient_s"], 3)
    return row


def optimizer_costs(model, k, kind, repeats) -> dict:
    """Process CPU seconds of one optimizer step of K members on the CPU (fastest of
    ``repeats`` interleaved passes), and each way's ratio over the hand-batched step. The
    gradients are fixed random tensors: a step's cost does not depend on their values."""
    from flatlm.models.bert import build_model
    from flatlm.models.packed import PackedBert
    from flatlm.models.presets import parse_model
    from flatlm.train.algorithms import build_optimizer
    from flatlm.train.config import resolve
    from flatlm.train.packed_optim import PackedOptimizer

    source = _source()
    cfgs = [resolve(c) for c in trial_configs(k, 16, steps=100, algorithm=kind)]
    models = [build_model(parse_model(model), source.V, source.max_length, seed=c.seed)
              for c in cfgs]
    hand, stock = (PackedOptimizer(list(PackedBert(models).params), cfgs, kind)
                   for _ in range(2))
    for p, q in zip(hand.params, stock.params, strict=True):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    for member, m in enumerate(models):  # the pack's parameter order is the single model's
        for q, p in zip(m.parameters(), hand.params, strict=True):
            q.grad = p.grad[member].clone()
    singles = [build_optimizer(c, m) for c, m in zip(cfgs, models, strict=True)]
    lrs = [c.lr for c in cfgs]
    timed = {
        "hand_batched": lambda: hand.step(lrs),
        "stock_per_member": lambda: stock.step_per_member(lrs),
        "stock_per_member_foreach": lambda: stock.step_per_member(lrs, foreach=True),
        "k_single_optimizers": lambda: [o.step() for o in singles],
    }
    best = _fastest_cpu_seconds(timed, repeats)
    row = {"kind": kind, "members": k, "threads": torch.get_num_threads(), "repeats": repeats}
    row.update({f"{name}_s": round(v, 6) for name, v in best.items()})
    row.update({f"ratio_{name}_over_hand_batched": round(v / best["hand_batched"], 3)
                for name, v in best.items() if name != "hand_batched"})
    return row


def _fastest_cpu_seconds(timed, repeats) -> dict[str, float]:
    """Each callable's fastest process CPU time (``time.process_time``: other users' processes
    on the shared cores do not count), over ``repeats`` interleaved passes after a warm-up."""
    best = dict.fromkeys(timed, float("inf"))
    for fn in timed.values():
        fn()
    for _ in range(repeats):
        for name, fn in timed.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--steps", type=int, nargs="+", default=[60, 12],
                        help="timed updates per member, one per batch size")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved passes, best kept")
    parser.add_argument("--sizes", action="store_true",
                        help="also train the testbed's sizes experiment packed (a GPU check)")
    parser.add_argument("--sizes-steps", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="toy sizes, seconds")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only-optimizer", action="store_true",
                        help="only optimizer_costs (the CPU's optimizer step, seconds)")
    args = parser.parse_args(argv)
    if args.only_optimizer and args.device != "cpu":
        parser.error("--only-optimizer times the CPU's optimizer step: use --device cpu")
    model = "d16-h1-l1-i64" if args.smoke else MODEL
    if args.smoke:
        args.members, args.threads, args.batch_sizes, args.steps = 2, [1], [8], [4]
        args.warmup, args.sizes_steps, args.repeats = 1, 3, 1
    if args.device != "cpu":
        args.threads = [1]
    torch.set_num_threads(1)
    out = args.out or Path(__file__).parent / "results"
    optimizer = None
    if args.device == "cpu":  # a CPU measurement: on a GPU it would time the launches only
        optimizer = [optimizer_costs(model, args.members, kind, 3 if args.smoke else 200)
                     for kind in ("adamw", "sgd")]
        for row in optimizer:
            print(json.dumps(row), flush=True)
    if args.only_optimizer:
        _write(out, "packs_optimizer_smoke.json" if args.smoke else "packs_optimizer_cpu.json",
               {"baseline": OPTIMIZER_BASELINE, **_header(args, model, argv),
                "timer": "time.process_time", "optimizer_costs": optimizer})
        return
    costs = [update_costs(model, args.members, b, 3 if args.smoke else 15, args.device)
             for b in args.batch_sizes]
    for row in costs:
        print(json.dumps(row), flush=True)
    rows = []
    for t in args.threads:
        for b, s in zip(args.batch_sizes, args.steps, strict=True):
            rows.append(compare(args.device, model, args.members, b, s, args.warmup, t,
                                args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    sizes = sizes_packed(args.device, args.members, args.sizes_steps, args.smoke) \
        if args.sizes else None
    name = "packs_smoke.json" if args.smoke else f"packs_{args.device.split(':')[0]}.json"
    _write(out, name, {"baseline": BASELINE, **_header(args, model, argv), "rows": rows,
                       "update_costs": costs, "optimizer_baseline": OPTIMIZER_BASELINE,
                       "optimizer_costs": optimizer, "sizes_packed": sizes})


def _header(args, model: str, argv) -> dict:
    """What a report says of its run; the load average as the run ends."""
    return {"model": model, "device": args.device, "device_name": _device_name(args.device),
            "torch": torch.__version__, "python": platform.python_version(),
            "load_avg_1m": os.getloadavg()[0],
            "command": " ".join(["python", "bench/packs.py", *(argv or sys.argv[1:])])}


def _write(out: Path, name: str, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out / name}")


def sizes_packed(device, k, steps, smoke) -> list[dict]:
    """The testbed's sizes experiment (``flatlm.experiments.paper.build("sizes",
    scale="testbed")``), seeds 0..K-1, each model's K trials one pack, ``steps`` updates each
    (training only; the measurements are the trial's, not the pack's): model-steps per second
    and each member's last logged loss."""
    from flatlm.experiments.paper import build
    from flatlm.sources import load
    from flatlm.train.pack import train_pack

    exp = build("sizes", scale="testbed", seeds=tuple(range(k)))
    by_model: dict[str, list] = {}
    for _, trial in exp.trials():
        by_model.setdefault(str(trial.model), []).append(trial)
    rows = []
    for model, trials in by_model.items():
        source = load(trials[0].source)
        cfgs = [dataclasses.replace(t.train, steps=steps, checkpoint_steps=(steps,))
                for t in trials]
        trained = model
        if smoke:  # the grid's trials, on a toy model and batch
            trained = "d16-h1-l1-i64"
            cfgs = [dataclasses.replace(c, batch_size=8) for c in cfgs]
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            results = train_pack(cfgs, source, trained, [Path(tmp) / f"m{i}" for i in range(k)],
                                 device=device, progress=False)
            _sync(device)
            seconds = time.perf_counter() - start
        rows.append({"model": model, "trained": trained, "members": k, "steps": steps,
                     "model_steps_per_s": round(k * steps / seconds, 2),
                     "last_loss": [r.history[-1]["train/loss"] if hasattr(r, "history")
                                   else str(r) for r in results]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
