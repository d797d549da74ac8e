"""All measurements of one model at one checkpoint: ``MeasureConfig`` -> one flat metrics dict.

The evaluation data (validation sentences for the pre-training loss and flatness, labelled
downstream sentences for the probes) are drawn once per trial by ``eval_data``, so every
checkpoint of a run is measured on the same sentences and differences between checkpoints are not
sampling noise. The lookup-table accuracy depends on the source only: computed once and cached.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from flatlm.measure.curvature import FlatnessConfig
from flatlm.measure.finetune import FinetuneConfig, finetune_accuracy
from flatlm.measure.flatness import measure_flatness
from flatlm.measure.lookup import lookup_table_accuracy
from flatlm.measure.loss import LossConfig, pretrain_loss
from flatlm.measure.probe import ProbeConfig, probe
from flatlm.sources.base import Source

log = logging.getLogger(__name__)

WHAT = ("loss", "fisher", "hessian", "probe", "finetune", "lookup")


@dataclass(frozen=True, kw_only=True)
class MeasureConfig:
    """What to measure at each checkpoint, and on how much data."""

    # measurements to run, from WHAT: loss (pretrain/*), fisher (Tr F), hessian (Tr H and the
    # gap to Tr F; implies fisher), probe, finetune, lookup
    what: tuple[str, ...] = ("loss", "fisher", "hessian", "probe", "lookup")
    n_eval: int = 2000  # validation sentences for pretrain/* and the flatness inputs; >= 2
    n_downstream: int = 2000  # labelled downstream sentences per task (80/20 train/test); >= 10
    tasks: tuple[str, ...] = ()  # downstream tasks; () = all of the source's
    label_rule: str | None = None  # downstream label rule; None = the source's default
    seed: int = 0  # draws the evaluation data; the estimators have their own seeds
    loss: LossConfig = field(default_factory=LossConfig)
    flatness: FlatnessConfig = field(default_factory=lambda: FlatnessConfig(n_inputs=None))
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    finetune: FinetuneConfig = field(default_factory=lambda: FinetuneConfig(seeds=2))
    # also measure flatness in this BERT shape (flat/*_grown; ``measure.grown``): the common shape
    # of a sweep over sizes, shape_string(lcm_shape(models)); None = native shape only
    grow_to: str | None = None

    def __post_init__(self):
        unknown = set(self.what) - set(WHAT)
        if unknown:
            raise ValueError(f"measure.what: unknown measurement(s) {sorted(unknown)}; use any "
                             f"of {', '.join(WHAT)}")
        if self.n_eval < 2:
            raise ValueError(f"measure.n_eval={self.n_eval}: use at least 2 sentences")
        if self.n_downstream < 10:
            raise ValueError(f"measure.n_downstream={self.n_downstream}: use at least 10")
        if self.grow_to is not None:
            from flatlm.measure.grown import check_grow_to

            check_grow_to(self.grow_to)


@dataclass
class EvalData:
    """The sentences every checkpoint of a trial is measured on."""

    tokens: torch.Tensor  # (n_eval, T) validation sentences
    lengths: torch.Tensor
    downstream: dict  # task -> (tokens, lengths, raw labels)
    lookup: dict = field(default_factory=dict)  # cached lookup-table metrics


def check_tasks(source: Source, cfg: MeasureConfig) -> tuple[str, ...]:
    tasks = cfg.tasks or tuple(source.tasks)
    bad = [t for t in tasks if t not in source.tasks]
    if bad:
        raise ValueError(f"measure.tasks: {bad} are not tasks of this source; it has "
                         f"{', '.join(source.tasks)}")
    return tasks


def eval_data(source: Source, cfg: MeasureConfig) -> EvalData:
    """Draws the validation and downstream sentences from seeds derived from ``cfg.seed``."""
    from flatlm.corpus import label_rules, labelled_sample

    seeds = np.random.SeedSequence(cfg.seed, spawn_key=(7,)).generate_state(2)
    tokens, lengths = source.sample(cfg.n_eval, int(seeds[0]))
    tasks = check_tasks(source, cfg)
    rule = cfg.label_rule or label_rules(source)[0]
    dtok, dlen, labels = labelled_sample(source, cfg.n_downstream, int(seeds[1]), rule, tasks)
    return EvalData(tokens, lengths, {t: (dtok, dlen, labels[t]) for t in tasks})


def measure_model(model: nn.Module, source: Source, data: EvalData, cfg: MeasureConfig,
                  device) -> dict[str, float]:
    """Every metric ``cfg.what`` asks for (keys as in ``flatlm.measure``), plus timings."""
    what, out = set(cfg.what), {}
    model.eval()
    if "loss" in what:
        with timer(out, "loss"):
            out.update(pretrain_loss(model, source, data.tokens, data.lengths, cfg.loss,
                                     device=device))
    if "fisher" in what or "hessian" in what:
        with timer(out, "flatness"):
            out.update(_flatness(model, source, data, cfg, device, what))
        if cfg.grow_to is not None:
            from flatlm.measure.grown import grown_flatness

            with timer(out, "flatness_grown"):
                out.update(grown_flatness(model, cfg.grow_to, source, data.tokens, data.lengths,
                                          cfg.flatness, device, hessian="hessian" in what))
    for task, (tok, ln, y) in data.downstream.items():
        if "probe" in what:
            with timer(out, f"probe_{task}"):
                out.update(probe(model, source, tok, ln, y, task, cfg.probe, device))
        if "finetune" in what:
            with timer(out, f"finetune_{task}"):
                out.update(finetune_accuracy(model, source, tok, ln, y, task, cfg.finetune,
                                             device))
        if "lookup" in what and task not in data.lookup:
            data.lookup[task] = lookup_table_accuracy(source, tok, ln, y, task, cfg.probe,
                                                      device)
        out.update(data.lookup.get(task, {}))
    return out


def _flatness(model, source, data, cfg, device, what) -> dict[str, float]:
    if "hessian" in what:
        return measure_flatness(model, source, data.tokens, data.lengths, cfg.flatness, device)
    from flatlm.measure import TRACE_FISHER, se_key
    from flatlm.measure.fisher import trace_fisher

    fisher = trace_fisher(model, data.tokens, data.lengths, cfg.flatness, device=device)
    return {TRACE_FISHER: fisher["mean"], se_key(TRACE_FISHER): fisher["se"]}


@contextmanager
def timer(out: dict, name: str):
    """Records the wall time of the block as ``time/<name>_s``."""
    start = time.perf_counter()
    yield
    out[f"time/{name}_s"] = time.perf_counter() - start
