"""What a checkpoint's measurements cost against the training between checkpoints.

Runs one real trial (``flatlm.runs.trial.run_trial``, the path every sweep takes) of a scale's base
config (``flatlm.experiments.scales``: ``gpu`` is the paper's preset, bert-41m at batch 4096 with
10^6 loss sentences, 10^5 labelled sentences a task and Tr(F) on 10^4 inputs; ``tiny`` the CPU
one) for ``2 x --steps`` updates with checkpoints after ``--steps`` and ``2 x --steps``. From the
trial's own ``time/*`` metrics:

- the step time: the second interval's training seconds over its updates (the first holds the
  compile and warm-up);
- the recurring cost: the second checkpoint's measurement (``time/measure_s``, each part beside
  it: loss, flatness, probes);
- the once-a-trial cost: what the first checkpoint spent more (evaluation data: drawing and
  labelling with the exact truth; the lookup table's and the random model's probes);
- the share at the scale's checkpoint spacing (``long_steps / checkpoints`` updates: 10,000 for
  the paper preset): recurring seconds / (step seconds x spacing), the goal being <= 0.1, and the
  same with the once-a-trial cost spread over the run's checkpoints.

    python bench/checkpoint_cost.py                   # CPU, tiny scale: ..._cpu.json
    python bench/checkpoint_cost.py --device cuda --scale gpu \\
        --out bench/results/checkpoint_cost_gpu.json

Only the core library is imported (no Ray, MLflow or datasets).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch
from flatness import device_name  # bench/flatness.py

from flatlm.core.config import apply_overrides, parse_assignments
from flatlm.experiments.scales import scale
from flatlm.runs.trial import run_trial

ONCE = ("time/eval_data_s", "time/lookup_s", "time/random_init_s")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", default="tiny", choices=["tiny", "gpu"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20, help="updates before each checkpoint")
    p.add_argument("--spacing", type=int, default=None,
                   help="updates between checkpoints to project to (default: the scale's long "
                        "runs, long_steps / checkpoints)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides of the scale's base config, e.g. model=bert-110m")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, default=None,
                   help="default: bench/results/checkpoint_cost_<device type>.json")
    return p.parse_args(argv)


def trial_config(args):
    s = scale(args.scale)
    cfg = apply_overrides(s.base(), parse_assignments(args.set))
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


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    s = scale(args.scale)
    cfg = trial_config(args)
    spacing = args.spacing or s.long_steps // s.checkpoints
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_trial(cfg, tmp, device=args.device, progress=True)
    first, second = rows[args.steps], rows[2 * args.steps]
    row = {"metric": "checkpoint_measurement_share", "scale": args.scale, "model": str(cfg.model),
           "batch_size": cfg.train.batch_size, "measure_what": list(cfg.measure.what),
           "n_eval": cfg.measure.n_eval, "n_downstream": cfg.measure.n_downstream,
           "flatness_inputs": cfg.measure.flatness.n_inputs,
           **cost_row(first, second, steps=args.steps, spacing=spacing,
                      checkpoints=s.checkpoints),
           "device": device_name(args.device), "torch": torch.__version__,
           "command": "python " + " ".join(sys.argv)}
    print(f"{args.scale} scale, {cfg.model!s}, batch {cfg.train.batch_size}: step "
          f"{row['step_s'] * 1e3:.1f} ms; a checkpoint's measurements {row['measure_s']:.1f} s "
          f"(once a trial: {row['once_per_trial_s']:.1f} s more)")
    for k, v in sorted(row["measure_parts_s"].items(), key=lambda kv: -kv[1]):
        print(f"    {k:28s} {v:8.2f} s")
    print(f"at {spacing} updates between checkpoints ({row['training_between_checkpoints_s']:.0f}"
          f" s of training): measuring adds {row['measure_share']:.1%} "
          f"({row['measure_share_with_once_spread']:.1%} with the once-a-trial cost spread over "
          f"{s.checkpoints} checkpoints); goal <= 10%")
    out = args.out or Path(__file__).parent / "results" / \
        f"checkpoint_cost_{torch.device(args.device).type}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([row], indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
