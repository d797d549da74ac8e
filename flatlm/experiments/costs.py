"""What a trial costs before it runs: CPU- (and, where measured, GPU-) minutes estimated from
the committed benchmarks (``flatlm/experiments/data/trial_costs.json``, written by
``bench/trial_costs.py`` from the committed trials' own ``time/train_s`` and
``time/measure_s``).

A trial's estimate is its training steps times the seconds a step of its model, algorithm and
batch took, plus its checkpoints times the seconds a checkpoint's measurements of its model and
``measure.what`` took. Where the table has the model but not the algorithm or the measurement
set, the model's first row is used (scaled by the batch) and the estimate says "nearest row";
where it lacks the model, a CPU row of another BERT is scaled by compute per step
(``compute_weight``: the non-embedding weights, times the batch) and the estimate says
"extrapolated". A GPU estimate is never extrapolated (a small model's GPU step is bound by
kernel launches, not by its compute), and a table without a row of the model's kind gives no
estimate: never a guess. The rows carry the load of the runs they came from (two trials on two
cores, one torch thread each).

>>> round(compute_weight("d64-h4-l2-i256"), -3)
111000.0
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from importlib import resources

from flatlm.models.presets import parse_model

COSTS_FILE = "trial_costs.json"
PAPER_VOCAB = 200  # the output layer's width in the weight below (the testbed's is 128-200)


@cache
def cost_table() -> dict:
    """The committed table: ``{"train": [...], "measure": [...], "devices": {...}}``."""
    text = resources.files("flatlm.experiments").joinpath("data", COSTS_FILE).read_text()
    return json.loads(text)


def compute_weight(model: str) -> float:
    """Weights a step multiplies per token, the embeddings but for the output layer aside: a
    BERT's blocks plus a ``PAPER_VOCAB``-word output layer (NaN for another architecture)."""
    cfg = parse_model(model)
    if cfg.arch != "bert":
        return math.nan
    d, i = cfg.d_model, cfg.d_inter
    return float(cfg.n_layers * (4 * d * d + 2 * d * i) + d * PAPER_VOCAB)


@dataclass(frozen=True)
class Estimate:
    """One trial's estimated minutes on one device kind, and how it was reached."""

    minutes: float
    how: str  # "measured", "nearest row", "extrapolated", or why there is none


def trial_estimate(cfg, device: str = "cpu") -> Estimate:
    """The minutes ``cfg`` (a ``TrialConfig``) takes on ``device`` ("cpu": one thread; "gpu":
    the committed GPU rows), from ``cost_table``."""
    model = str(cfg.model)  # a preset name or a shape string
    train = _rate(cost_table()["train"], device, model, cfg.train.batch_size,
                  {"algorithm": cfg.train.algorithm, "batch_size": cfg.train.batch_size})
    what = sorted(cfg.measure.what)
    measure = _rate(cost_table()["measure"], device, model, 1,  # not per batch
                    {"measure_what": what})
    if train is None or measure is None:
        return Estimate(math.nan, f"no committed {device} benchmark of {model}")
    seconds = (cfg.train.steps * train[0]
               + len(cfg.train.checkpoint_steps) * measure[0])
    how = max((train[1], measure[1]), key=HOW_ORDER.index)
    return Estimate(seconds / 60, how)


HOW_ORDER = ("measured", "nearest row", "extrapolated")


def _rate(rows: list[dict], device: str, model: str, batch: int, want: dict
          ) -> tuple[float, str] | None:
    """(seconds, how) from the rows of ``device``: the row of ``model`` matching every field of
    ``want``; else a row of ``model``; else a row of another model scaled by compute (times
    ``batch`` over the row's ``batch_size``; measurement rows have batch 1)."""
    mine = [r for r in rows if r["device"] == device]
    same = [r for r in mine if r["model"] == model]
    exact = [r for r in same if all(r.get(k) == v for k, v in want.items())]
    if exact:
        return exact[0]["seconds"], "measured"
    if same:
        return same[0]["seconds"] * batch / same[0]["batch_size"], "nearest row"
    if device != "cpu":  # a GPU step is launch-bound at these sizes: compute does not scale it
        return None
    weight = compute_weight(model) * batch
    scaled = [(r, compute_weight(r["model"]) * r["batch_size"]) for r in mine
              if math.isfinite(compute_weight(r["model"]))]
    if not math.isfinite(weight) or not scaled:
        return None
    row, theirs = min(scaled, key=lambda rw: abs(math.log(rw[1] / weight)))
    return row["seconds"] * weight / theirs, "extrapolated"


def experiment_minutes(trials, device: str = "cpu") -> tuple[float, str, int]:
    """(total minutes over ``trials``, the weakest ``how`` among them, trials without an
    estimate) for (name, cfg) pairs."""
    estimates = [trial_estimate(cfg, device) for _, cfg in trials]
    known = [e for e in estimates if math.isfinite(e.minutes)]
    how = max((e.how for e in known), key=HOW_ORDER.index, default="none")
    return sum(e.minutes for e in known), how, len(estimates) - len(known)
