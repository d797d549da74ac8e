"""Where an experiment runs: ``tiny`` (one CPU core, about a minute a trial) or ``gpu`` (the
paper's sizes and protocol, one GPU per trial). A scale fixes the source, the models, the
trial's base config and the lengths of runs; the protocol and the experiment adjust the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from flatlm.core.config import apply_overrides
from flatlm.runs.trial import TrialConfig

# A small random PCFG of the paper's layered shape: 30 words, sentences of 2..8 words. Its truth
# is cheap, so a CPU sweep spends its time on training and measuring.
TINY_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 30, "roots": 3, "nonterminals_per_level": 4, "depth": 3,
    "binary_per_nonterminal": 6, "words_per_nonterminal": 8}})
# The CPU sweeps' language (``presets``), chosen by measurement so that the tiny models
# reach the saturated regime in minutes: 12 words, sentences of exactly 8 words (no terminal
# rules above the last level), few rules. At 3000 steps (batch 128, lr 5e-3, linear decay, no
# dropout) the three TINY_MODELS end at KL 0.032 / 0.019 / 0.009 nats (entropy 1.85); on
# TINY_SOURCE the same budget leaves them at 0.26 / 0.21 / 0.15. Its task C is degenerate
# (majority class 93%): the sweeps measure A and B.
SWEEP_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 12, "roots": 3, "nonterminals_per_level": 3, "depth": 3,
    "binary_per_nonterminal": 3, "words_per_nonterminal": 6, "terminal_share": 0.0}})
# The tiny grammar one level deeper (sentences of 2..16 words): the diagnosis' grammar switch.
TINY_DEEP_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 30, "roots": 3, "nonterminals_per_level": 4, "depth": 4,
    "binary_per_nonterminal": 6, "words_per_nonterminal": 8}})
# Closer to the paper's description (A.1) than the shipped grammar: 200 words, 9 roots and 5
# levels of 8 nonterminals (49 symbols), sentences up to 32 words.
PAPER_LIKE_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "max_length": 32, "random": {
    "vocab": 200, "roots": 9, "nonterminals_per_level": 8, "depth": 5,
    "binary_per_nonterminal": 20, "words_per_nonterminal": 20}})

# The tiny models of the CPU sweeps, smallest first (d_model-heads-layers-d_inter); one head
# size (16), so that each grows into the largest without changing its function (Table 4).
TINY_MODELS = ("d16-h1-l1-i64", "d32-h2-l1-i128", "d64-h4-l2-i256")
# Table 3 presets the paper's PCFG sweeps span (bert-234m and up need a large GPU each).
PAPER_MODELS = ("bert-2m", "bert-4.8m", "bert-8.3m", "bert-12.8m", "bert-41m", "bert-110m")


@dataclass(frozen=True)
class Scale:
    """The sizes of one scale; ``base()`` is its trial config under the paper's text."""

    name: str
    source: str  # the language
    deep_source: str  # the diagnosis' deeper grammar
    models: tuple[str, ...]  # the sizes experiment's grid, smallest first
    model: str  # the steps / algorithms / sgd experiments' model
    steps: int  # a run of the sizes and algorithms experiments
    long_steps: int  # a run of the steps and sgd experiments (checkpointed densely)
    checkpoints: int  # checkpoints of a long run, evenly spaced, step 0 excluded
    seeds: tuple[int, ...]  # training seeds of every grid point
    gpus: float  # per trial, for the Ray sweeps
    sgd_lr: float  # the sgd experiment's constant rate after warmup
    adversarial: dict  # the adversary's settings in the algorithms experiment
    overrides: dict  # the rest of the base config

    def base(self) -> TrialConfig:
        return apply_overrides(TrialConfig(), {"source": self.source, "model": self.model,
                                               "train.steps": self.steps,
                                               "train.checkpoint_steps": [self.steps],
                                               **self.overrides})


TINY = Scale(
    name="tiny", source=TINY_SOURCE, deep_source=TINY_DEEP_SOURCE, models=TINY_MODELS,
    model=TINY_MODELS[-1], steps=1500, long_steps=3000, checkpoints=6, seeds=(0, 1, 2), gpus=0.0,
    # plain SGD at B.2's 1e-3 does not leave its initialisation in a CPU-sized run
    sgd_lr=0.3,
    # the adversary attacks task B (Table 1) through a small pool, for a CPU
    adversarial={"train.adversarial.task": "B", "train.adversarial.d1": 32,
                 "train.adversarial.d2": 32, "train.adversarial.pool": 256},
    overrides={
        "train.batch_size": 128, "train.lr": 3e-3, "train.warmup_steps": 100,
        "train.log_every": 50,
        # about a minute a trial on one core: 4000 labelled sentences (800 test: s.e. of an
        # accuracy ~1.5 points), Tr(F) on 1000 inputs
        "measure.n_eval": 1000, "measure.n_downstream": 4000,
        "measure.probe.epochs": 40, "measure.probe.seeds": 3, "measure.probe.batch_size": 256,
        "measure.flatness.batch_size": 128, "measure.flatness.hutchinson_batch_size": 64,
    })

GPU = Scale(
    name="gpu", source="pcfg:paper", deep_source=PAPER_LIKE_SOURCE, models=PAPER_MODELS,
    model="bert-41m", steps=30_000, long_steps=200_000, checkpoints=20, seeds=(0, 1, 2), gpus=1.0,
    sgd_lr=1e-3,  # B.2
    adversarial={"train.adversarial.task": "B"},  # Table 1 reports tasks A and B
    overrides={
        "train.batch_size": 4096, "train.micro_batch_size": 1024, "train.warmup_steps": 1000,
        "train.log_every": 100,
        # A.7: the loss on 10^6 sentences; A.1: 0.1M labelled sentences per task; B.1: Tr(F) on
        # 10^4 inputs (8 sampled labels each: s.e. ~2%)
        "measure.n_eval": 1_000_000, "measure.n_downstream": 100_000,
        "measure.flatness.n_inputs": 10_000, "measure.flatness.batch_size": 512,
    })

SCALES = {s.name: s for s in (TINY, GPU)}


def scale(name: str) -> Scale:
    if name not in SCALES:
        raise ValueError(f"scale {name!r}: use one of {', '.join(SCALES)}")
    return SCALES[name]
