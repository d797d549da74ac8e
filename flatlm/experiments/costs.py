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
    train = _step_seconds(cfg, device)
    measure = checkpoint_seconds(cfg, device)
    if train is None or measure is None:
        return Estimate(math.nan, f"no committed {device} benchmark of {model}")
    seconds = (cfg.train.steps * train[0]
               + len(cfg.train.checkpoint_steps) * measure[0])
    how = max((train[1], measure[1]), key=HOW_ORDER.index)
    return Estimate(seconds / 60, how)


HOW_ORDER = ("measured", "nearest row", "extrapolated")


def _step_seconds(cfg, device: str) -> tuple[float, str] | None:
    """(seconds a training step of ``cfg`` takes on ``device``, how), from the train rows."""
    return _rate(cost_table()["train"], device, str(cfg.model), cfg.train.batch_size,
                 {"algorithm": cfg.train.algorithm, "batch_size": cfg.train.batch_size})


def _device_kind(device) -> str:
    """The table's device kind of a torch device or its name: CUDA reads the GPU rows."""
    return "gpu" if str(device).startswith("cuda") else "cpu"


def checkpoint_seconds(cfg, device: str = "cpu") -> tuple[float, str] | None:
    """(seconds one checkpoint's measurements of ``cfg`` take on ``device``, how the figure was
    reached), or None. Only a row of the same measurement set is read (the sets' costs differ
    a hundredfold: the loss alone takes seconds, the probes minutes); one measured on another
    downstream-set size is scaled by the ratio of sizes (the probe, which reads every
    downstream sentence each epoch, dominates) and is the "nearest row"."""
    what, size = sorted(cfg.measure.what), cfg.measure.n_downstream
    rows = [r for r in cost_table()["measure"]
            if r["measure_what"] is None or sorted(r["measure_what"]) == what]
    rate = _rate(rows, device, str(cfg.model), 1, {"n_downstream": size})  # not per batch
    if rate is None or rate[1] == "measured":
        return rate
    row_size = _nearest_row(rows, device, str(cfg.model)).get("n_downstream")
    return (rate[0] * size / row_size, rate[1]) if row_size else rate


def budget_line(cfg, device) -> str | None:
    """What the trial is expected to cost and how much of it is measuring, from the table, or
    None where it has no row: 'about 12 min on this CPU: 3 min training, 9 min measuring 5
    checkpoints (75%) (nearest row of flatlm/experiments/data/trial_costs.json)'."""
    kind = _device_kind(device)
    train, measure = _step_seconds(cfg, kind), checkpoint_seconds(cfg, kind)
    if train is None or measure is None:
        return None
    n = len(cfg.train.checkpoint_steps)
    train_min, measure_min = cfg.train.steps * train[0] / 60, n * measure[0] / 60
    share = measure_min / (train_min + measure_min) if train_min + measure_min > 0 else 0.0
    how = max((train[1], measure[1]), key=HOW_ORDER.index)
    return (f"about {_minutes(train_min + measure_min)} on this {kind.upper()}: "
            f"{_minutes(train_min)} training, {_minutes(measure_min)} measuring {n} "
            f"checkpoint{'s' * (n != 1)} ({share:.0%}) ({how} of flatlm/experiments/data/"
            f"{COSTS_FILE}, from runs of one torch thread each, two on a 2-core machine)")


def _minutes(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes >= 1 else f"{minutes * 60:.0f} s"


def measure_prior_s(cfg, device) -> float | None:
    """``checkpoint_seconds`` of ``cfg`` on ``device`` (a torch device or its name: CUDA reads
    the GPU rows), or None where the table has no row for it: what a trial's progress line
    counts for the measurements before it has timed one."""
    rate = checkpoint_seconds(cfg, _device_kind(device))
    return None if rate is None else rate[0]


def _nearest_row(rows: list[dict], device: str, model: str) -> dict:
    """The row ``_rate`` falls back to for ``model`` on ``device`` (its first), or {}."""
    same = [r for r in rows if r["device"] == device and r["model"] == model]
    return same[0] if same else {}


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
