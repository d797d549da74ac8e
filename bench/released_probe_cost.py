"""What the released probe (``measure.probe.RELEASED``: run_lp.py as the released code runs it)
costs against the paper's, on one checkpoint of a scale's model.

The probe measurement (``measure_model`` with ``what=("probe",)``: features, every task's heads,
the ridge twin) of the scale's model, randomly initialised (the cost does not depend on the
weights), on the scale's downstream sentences, under:

- ``paper``: the scale's probe under the ``paper`` protocol (the defaults with the scale's budget);
- ``released``: the ``paper-code`` protocol's probe (``RELEASED``, the scale's seeds);
- ``released, encoder in eval mode``: the same with ``encoder_train_mode=False``, so that the
  difference is what the train-mode forward pass every epoch costs.

Each is timed ``--repeats`` times (the minimum is reported), after one untimed warm-up run.

    python bench/released_probe_cost.py --threads 1  # bench/results/released_probe_cost_cpu.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path

import torch

from flatlm.core.config import apply_overrides
from flatlm.experiments.protocols import protocol_overrides
from flatlm.experiments.scales import scale
from flatlm.measure.run import eval_data, measure_model
from flatlm.models import build_model, parse_model
from flatlm.sources import load


def probe_configs(scale_name: str) -> dict:
    """name -> the trial's MeasureConfig restricted to the probe."""
    base = scale(scale_name).base()
    paper = apply_overrides(base, {"measure.what": ["probe"]}).measure
    code = apply_overrides(base, {**protocol_overrides("paper-code"),
                                  "measure.what": ["probe"]}).measure
    eval_mode = code.with_settings(probe=dataclasses.replace(code.probe,
                                                             encoder_train_mode=False))
    return {"paper": paper, "released": code, "released, encoder in eval mode": eval_mode,
            "model": base.model, "source": base.source}


def timed(model, source, data, cfg, repeats: int) -> tuple[float, dict]:
    measure_model(model, source, data, cfg, "cpu")  # warm-up
    best, out = float("inf"), {}
    for _ in range(repeats):
        start = time.perf_counter()
        out = measure_model(model, source, data, cfg, "cpu")
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="bench/results/released_probe_cost_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs = probe_configs(args.scale)
    source = load(configs.pop("source"))
    model_name = str(configs.pop("model"))
    shape = parse_model(model_name)
    model = build_model(shape, source.V, source.max_length, seed=0)
    data = eval_data(source, configs["paper"])
    rows = []
    for name, cfg in configs.items():
        seconds, out = timed(model, source, data, cfg, args.repeats)
        probe_cfg = cfg.probe
        rows.append({"probe": name, "seconds": round(seconds, 3),
                     "seconds_per_epoch": round(seconds / probe_cfg.epochs, 4),
                     "settings": dataclasses.asdict(probe_cfg),
                     "acc_mean": {k: round(v, 4) for k, v in out.items()
                                  if k.startswith("probe/") and k.endswith("/acc_mean")}})
        print(f"{name}: {seconds:.2f} s ({probe_cfg.epochs} epochs, batch "
              f"{probe_cfg.batch_size}, {probe_cfg.seeds} seeds)", flush=True)
    result = {"scale": args.scale, "model": model_name, "threads": args.threads,
              "n_downstream": configs["paper"].n_downstream, "tasks": list(data.classes),
              "repeats": args.repeats, "load_average": os.getloadavg(), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
