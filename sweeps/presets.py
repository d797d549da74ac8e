"""Named trial configs: a preset is a function, a variant is a small diff (``dataclasses.replace``
or ``apply_overrides`` on a base)."""

from __future__ import annotations

import json

from flatlm.config import apply_overrides
from flatlm.measure.probe import RELEASED
from flatlm.trial import TrialConfig

# A small random PCFG of the paper's layered shape: 30 words, sentences of 2..8 words. Its truth
# is cheap, so a CPU sweep spends its time on training and measuring.
TINY_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 30, "roots": 3, "nonterminals_per_level": 4, "depth": 3,
    "binary_per_nonterminal": 6, "words_per_nonterminal": 8}})

# The tiny models of the CPU sweeps, smallest first (d_model-heads-layers-d_inter); one head
# size (16), so that each grows into the largest without changing its function (Table 4).
TINY_MODELS = ("d16-h1-l1-i64", "d32-h2-l1-i128", "d64-h4-l2-i256")
# Table 3 presets the paper's PCFG sweeps span (bert-234m and up need a large GPU each).
PAPER_MODELS = ("bert-2m", "bert-4.8m", "bert-8.3m", "bert-12.8m", "bert-41m", "bert-110m")


def tiny_cpu() -> TrialConfig:
    """A trial that runs in about a minute on one CPU core."""
    return apply_overrides(TrialConfig(), {
        "source": TINY_SOURCE, "model": TINY_MODELS[1],
        "train.steps": 150, "train.batch_size": 64, "train.warmup_steps": 15,
        "train.checkpoint_steps": [50, 100, 150], "train.log_every": 25,
        # small for minutes on a CPU: 300 test sentences, s.e. of an accuracy ~2.5 points
        "measure.n_eval": 256, "measure.n_downstream": 1500, "measure.tasks": ["B"],
        "measure.probe.epochs": 40, "measure.probe.seeds": 3,
        "measure.flatness.batch_size": 64, "measure.flatness.hutchinson_batch_size": 32,
    })


def paper_pcfg() -> TrialConfig:
    """The paper's PCFG protocol (sections 2.2, A.1, A.4, A.5, B.1) for a GPU node."""
    return apply_overrides(TrialConfig(), {
        "source": "pcfg:paper", "model": "bert-41m",
        "train.steps": 30_000, "train.batch_size": 4096, "train.micro_batch_size": 1024,
        "train.warmup_steps": 1000, "train.checkpoint_steps": [10_000, 20_000, 30_000],
        "train.log_every": 100,
        # A.7: the loss on 10^6 sentences; A.1: 0.1M labelled sentences per task; B.1: Tr(F) on
        # 10^4 inputs (8 sampled labels each: s.e. ~2%); the released code's probe schedule,
        # on standardised features
        "measure.n_eval": 1_000_000, "measure.n_downstream": 100_000,
        "measure.flatness.n_inputs": 10_000, "measure.flatness.batch_size": 512,
        **{f"measure.probe.{k}": v for k, v in RELEASED.items() if k != "standardize"},
    })


def base_for(preset: str) -> TrialConfig:
    return {"tiny": tiny_cpu, "paper": paper_pcfg}[preset]()
