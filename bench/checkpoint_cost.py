"""What a checkpoint's measurements cost against the training between checkpoints, before and
after the measurement speed-ups (issue 24), in one run.

1. Trials. One real trial (``flatlm.runs.trial.run_trial``, the path every sweep takes) of a
   scale's base config (``flatlm.experiments.scales``: ``gpu`` is the paper's preset, bert-41m at
   batch 4096 with 10^6 loss sentences, 10^5 labelled sentences a task and Tr(F) on 10^4 inputs;
   ``tiny`` the CPU one; ``testbed`` the CPU scale where the models saturate) for ``2 x --steps``
   updates with checkpoints after ``--steps`` and ``2 x --steps``, three times: ``before`` (the
   previous path, still a setting: ``measure.probe.batched=false``,
   ``measure.probe.ridge=false``, no cache), ``after`` (the defaults, a fresh sweep cache) and
   ``after, cache warm`` (a second trial of the same sweep: evaluation data and reference rows
   read back). From each trial's own ``time/*`` metrics:

   - the step time: the second interval's training seconds over its updates (the first holds
     the compile and warm-up);
   - the recurring cost: the second checkpoint's measurement (``time/measure_s``, each part
     beside it: loss, flatness, probes);
   - the once-a-trial cost: what the first checkpoint spent more (evaluation data; the lookup
     table's and the random model's probes);
   - the share at the scale's checkpoint spacing (``long_steps / checkpoints`` updates: 10,000
     for the paper preset): recurring seconds / (step seconds x spacing), the goal being <= 0.1,
     and the same with the once-a-trial cost spread over the run's checkpoints.

2. ``flatlm measure``. A ``--measure-steps``-step checkpoint of ``--measure-model`` on
   ``--measure-source`` (``flatlm train``, batch 64), measured with ``flatlm measure CKPT --what
   --measure-what --json`` in this process (wall time of the command, imports excluded): before
   (``--set measure.probe.batched=false --set measure.probe.ridge=false --cache none``), after
   (the defaults: the run's eval_cache, cold) and after with the cache warm (what the run's next
   checkpoint pays). The rows also hold the largest difference between the before and after
   values of every probe key (the batched probe is the per-task one up to rounding) and, for
   early stopping (``--set measure.probe.patience=P``, opt-in), its time and how much each
   accuracy moves.

    python bench/checkpoint_cost.py --threads 1       # CPU, tiny scale: ..._cpu.json
    python bench/checkpoint_cost.py --threads 1 --scale testbed \
        --out bench/results/checkpoint_cost_testbed.json
    python bench/checkpoint_cost.py --threads 1 --scale testbed --protocol paper --skip measure \
        --out bench/results/checkpoint_cost_testbed_paper.json   # as the replication measures
    python bench/checkpoint_cost.py --device cuda --scale gpu \\
        --out bench/results/checkpoint_cost_gpu.json

Only the core library is imported (no Ray, MLflow or datasets).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from flatness import device_name  # bench/flatness.py

from flatlm.cli import main as flatlm
from flatlm.core.config import apply_overrides, parse_assignments
from flatlm.experiments.paper import base_of
from flatlm.experiments.scales import scale
from flatlm.runs.trial import run_trial

ONCE = ("time/eval_data_s", "time/lookup_s", "time/random_init_s")
# the previous measurement path, kept as settings: the probe task by task, no ridge probe
BEFORE_TRIAL = {"measure.probe.batched": False, "measure.probe.ridge": False}
BEFORE_MEASURE = ["--set", "measure.probe.batched=false", "--set", "measure.probe.ridge=false",
                  "--cache", "none"]
PROBE_STAGES = ("probe/", "random_init/", "lookup/")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", default="tiny", choices=["tiny", "testbed", "gpu"])
    p.add_argument("--protocol", default=None,
                   help="the trials' base under this protocol (paper: Tr(F) from 50 labels, "
                        "the probe's 100 epochs x 5 seeds), as the replication runs it; "
                        "default: the scale's own base config")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20, help="updates before each checkpoint")
    p.add_argument("--spacing", type=int, default=None,
                   help="updates between checkpoints to project to (default: the scale's long "
                        "runs, long_steps / checkpoints)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides of the scale's base config, e.g. model=bert-110m")
    p.add_argument("--measure-model", default="bert-2m")
    p.add_argument("--measure-source", default="pcfg:paper")
    p.add_argument("--measure-steps", type=int, default=20)
    p.add_argument("--measure-what", default="loss,fisher,probe")
    p.add_argument("--cli-default-what", action="store_true",
                   help="also time flatlm measure's own default --what (with hessian and "
                        "lookup), after only, cache cold and warm")
    p.add_argument("--measure-set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="flatlm measure --set pairs for every run, keys as in the trial config "
                        "(measure.probe.seeds=5; default: none)")
    p.add_argument("--patience", type=int, default=5,
                   help="early stopping's patience for its comparison row (0: no row)")
    p.add_argument("--skip", nargs="*", default=[], choices=["trials", "measure"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None,
                   help="default: bench/results/checkpoint_cost_<device type>.json")
    return p.parse_args(argv)


def trial_config(args, overrides=None):
    base = scale(args.scale).base() if args.protocol is None else base_of(args.scale,
                                                                            args.protocol)
    cfg = apply_overrides(base, {**parse_assignments(args.set), **(overrides or {})})
    return apply_overrides(cfg, {"train.steps": 2 * args.steps,
                                 "train.checkpoint_steps": [args.steps, 2 * args.steps]})


def cost_row(first: dict, second: dict, *, steps: int, spacing: int, checkpoints: int) -> dict:
    """The step time, the recurring and once-a-trial measurement seconds and the shares at
    ``spacing`` updates between checkpoints (``checkpoints`` of them in a run)."""
    step_s = second["time/train_s"] / steps
    recurring = second["time/measure_s"]
    once = max(first["time/measure_s"] - recurring, 0.0)
    interval_s = step_s * spacing
    return {
        "step_s": step_s, "measure_s": recurring, "once_per_trial_s": once,
        "once_per_trial_parts_s": {k: first[k] for k in ONCE if k in first},
        "measure_parts_s": {k: v for k, v in second.items()
                            if k.startswith("time/") and k.endswith("_s")
                            and k not in ("time/measure_s", "time/train_s")},
        "spacing_steps": spacing, "checkpoints": checkpoints,
        "training_between_checkpoints_s": interval_s,
        "measure_share": recurring / interval_s,
        "measure_share_with_once_spread": (recurring + once / checkpoints) / interval_s,
        "goal_share": 0.1,
    }


def trial_rows(args, tmp: Path) -> list[dict]:
    """The checkpoint share before, after, and after with the sweep's cache warm."""
    s = scale(args.scale)
    spacing = args.spacing or s.long_steps // s.checkpoints
    rows = []
    for path, overrides, cache in (("before", BEFORE_TRIAL, None),
                                   ("after", {}, tmp / "eval_cache"),
                                   ("after, cache warm", {}, tmp / "eval_cache")):
        cfg = trial_config(args, overrides)
        done = run_trial(cfg, tmp / path.replace(", ", "-").replace(" ", "-"),
                         device=args.device, eval_cache=cache)
        first, second = done[args.steps], done[2 * args.steps]
        rows.append({"metric": "checkpoint_measurement_share", "path": path,
                     "scale": args.scale, "protocol": args.protocol or "the scale's own",
                     "model": str(cfg.model),
                     "batch_size": cfg.train.batch_size,
                     "measure_what": list(cfg.measure.what), "n_eval": cfg.measure.n_eval,
                     "n_downstream": cfg.measure.n_downstream,
                     "flatness_inputs": cfg.measure.flatness.n_inputs,
                     **cost_row(first, second, steps=args.steps, spacing=spacing,
                                checkpoints=s.checkpoints)})
        _print_trial(rows[-1], s.checkpoints)
    return rows


def _print_trial(row: dict, checkpoints: int) -> None:
    print(f"[{row['path']}] {row['scale']} scale, {row['model']}, batch {row['batch_size']}: "
          f"step {row['step_s'] * 1e3:.1f} ms; a checkpoint's measurements "
          f"{row['measure_s']:.1f} s (once a trial: {row['once_per_trial_s']:.1f} s more)")
    for k, v in sorted(row["measure_parts_s"].items(), key=lambda kv: -kv[1]):
        print(f"    {k:28s} {v:8.2f} s")
    print(f"  at {row['spacing_steps']} updates between checkpoints "
          f"({row['training_between_checkpoints_s']:.0f} s of training): measuring adds "
          f"{row['measure_share']:.1%} ({row['measure_share_with_once_spread']:.1%} with the "
          f"once-a-trial cost spread over {checkpoints} checkpoints); goal <= 10%", flush=True)


def measure_rows(args, tmp: Path) -> list[dict]:
    """``flatlm measure`` on one checkpoint: before, after (cache cold, then warm), the
    largest difference of the probe values, and early stopping's effect."""
    run = tmp / "measured-run"
    _quiet(["train", "--source", args.measure_source, "--model", args.measure_model,
            "--steps", str(args.measure_steps), "--batch-size", "64", "--out", str(run),
            "--device", args.device, "--no-progress"])
    ckpt = run / "checkpoints" / f"step-{args.measure_steps}"
    command = ["measure", str(ckpt), "--what", args.measure_what, "--json", "--no-progress",
               "--device", args.device, *[a for kv in args.measure_set for a in ("--set", kv)]]
    paths = [("before", BEFORE_MEASURE), ("after", []), ("after, cache warm", [])]
    early = f"after, early stopping (patience {args.patience})"
    if args.patience:
        paths.append((early, ["--set", f"measure.probe.patience={args.patience}",
                              "--cache", "none"]))
    if args.cli_default_what:
        default_what = ["--what", "loss,fisher,hessian,probe,lookup", "--cache",
                        str(tmp / "cache-default-what")]
        paths += [("after, default --what, cache cold", default_what),
                  ("after, default --what, cache warm", default_what)]
    rows, values = [], {}
    for i, (path, extra) in enumerate(paths):
        out = tmp / f"measure-{i}.json"
        start = time.perf_counter()
        _quiet([*command, "--out", str(out), *extra])
        wall = time.perf_counter() - start
        values[path] = json.loads(out.read_text())
        what = extra[extra.index("--what") + 1] if "--what" in extra else args.measure_what
        rows.append({"metric": "flatlm_measure_wall_s", "path": path, "wall_s": wall,
                     "model": args.measure_model, "source": args.measure_source,
                     "trained_steps": args.measure_steps, "what": what,
                     "flags": extra,
                     "parts_s": {k: v for k, v in values[path].items() if k.startswith("time/")},
                     "command": "flatlm " + " ".join([*command, *extra]).replace(str(tmp), "TMP")})
        print(f"[{path}] flatlm measure {what}: {wall:.1f} s", flush=True)
    rows.append(_difference("probe_equality", values["before"], values["after"]))
    if args.patience:
        rows.append(_difference("early_stopping_effect", values["after"], values[early]))
    return rows


def _difference(metric: str, a: dict, b: dict) -> dict:
    """The largest |b - a| over the probe keys both have, and every accuracy's change."""
    keys = [k for k in a if k.startswith(PROBE_STAGES) and k in b]
    diffs = {k: b[k] - a[k] for k in keys}
    accs = {k: d for k, d in diffs.items() if k.endswith("/acc_mean")}
    return {"metric": metric, "keys": len(keys),
            "max_abs_difference": max((abs(d) for d in diffs.values()), default=0.0),
            "max_abs_acc_mean_difference": max((abs(d) for d in accs.values()), default=0.0),
            "acc_mean_changes": accs}


def _quiet(argv: list[str]) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        if flatlm(argv) != 0:
            raise SystemExit(f"flatlm {' '.join(argv)} failed")


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if "trials" not in args.skip:
            rows += trial_rows(args, Path(tmp))
        if "measure" not in args.skip:
            rows += measure_rows(args, Path(tmp))
    context = {"device": device_name(args.device), "torch": torch.__version__,
               "command": "python " + " ".join(sys.argv),
               "scales": "flatlm.experiments.scales (tiny, testbed, gpu)"}
    rows = [{**row, **context} for row in rows]
    out = args.out or Path(__file__).parent / "results" / \
        f"checkpoint_cost_{torch.device(args.device).type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
