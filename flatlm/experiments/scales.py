"""Where an experiment runs. A scale fixes the source, the models, the lengths of runs, the batch,
the peak lr and warmup, and how much data is measured; the protocol (``protocols``: labels,
masking, the schedule's shape, the probe's settings) and the experiment (``paper``) set the rest.

- ``sweep``: the Ray sweeps' CPU scale (``python sweeps/scaling.py`` with no arguments): the
  testbed's grammar and models at a 10-minute budget, near saturation (KL < 0.05).
- ``tiny``: the replication's CPU scale (``flatlm replicate``), about a minute a trial.
- ``gpu``: the paper's sizes (Table 3), one GPU per trial.
- ``testbed``: a CPU scale chosen by a search (bench/testbed_search.py) so that the models
  saturate (KL <= 0.02 nats) and the tasks are not solved by random features.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from flatlm.core.config import apply_overrides
from flatlm.core.registry import Registry
from flatlm.experiments.protocols import parse_protocol
from flatlm.measure import SATURATED_KL
from flatlm.runs.trial import TrialConfig

# A small random PCFG of the paper's layered shape: 30 words, sentences of 2..8 words. Its truth
# is cheap, so a CPU sweep spends its time on training and measuring.
TINY_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 30, "roots": 3, "nonterminals_per_level": 4, "depth": 3,
    "binary_per_nonterminal": 6, "words_per_nonterminal": 8}})
# The CPU sweeps' language until issue 23 (bench/shared_gpu.py's results were measured on it):
# 12 words, sentences of exactly 8 words (no terminal rules above the last level), few rules;
# every tiny model saturates on it in minutes, but its tasks are nearly free (random-init
# features probe A at 0.89-0.94, and task C's majority class is 93-96%), so the sweeps now run
# on the testbed's grammar (``SWEEP`` below).
SWEEP_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 12, "roots": 3, "nonterminals_per_level": 3, "depth": 3,
    "binary_per_nonterminal": 3, "words_per_nonterminal": 6, "terminal_share": 0.0}})
# The tiny grammar one level deeper (sentences of 2..16 words): the diagnosis' grammar switch.
TINY_DEEP_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "random": {
    "vocab": 30, "roots": 3, "nonterminals_per_level": 4, "depth": 4,
    "binary_per_nonterminal": 6, "words_per_nonterminal": 8}})
# The testbed's language (issue 23; chosen by bench/testbed_search.py, grammar q0-23 of its
# "classes4" family): 128 words in 4 word classes (one per emitting nonterminal, 2 words shared
# each), 6 roots over 3 levels of 4 nonterminals with 2 rules each, sentences of exactly 8 words
# (one tree shape), entropy 3.71 nats/token. Labels by the paper's span rule (A.1), spans by
# parse depth: B = 4, C = 2 words (the text's L = 32/16/8 of sentences up to 32, halved twice).
# A probe on random features must learn 128 words one by one from 3200 sentences; one on
# features that group a class's words need not: the paper's premise, and why its tasks are not
# nearly free (random-init d64 features 0.68 / 0.70 / 0.73 on A / B / C, the lookup table 0.97).
@dataclass(frozen=True)
class SentenceShape:
    """How a span grammar's sentences look: ``depth`` levels of nonterminals, exactly ``length``
    words, the span rule's spans per task, and the shortest downstream sentence."""

    depth: int = 3
    length: int = 8
    spans: tuple[tuple[str, int], ...] = (("B", 4), ("C", 2))
    downstream_min_length: int = 5


EIGHT_WORDS = SentenceShape()
SIXTEEN_WORDS = SentenceShape(depth=4, length=16, spans=(("B", 8), ("C", 4)),
                              downstream_min_length=8)


def _span_grammar(seed: int, *, vocab: int, roots: int, nonterminals: int, rules: int,
                  words: int, sentences: SentenceShape = EIGHT_WORDS) -> str:
    """The source spec of a random grammar of the testbed searches' families: ``sentences.depth``
    levels of ``nonterminals`` with ``rules`` binary rules and ``words`` words each (no terminal
    rules above the last level), sentences of exactly ``sentences.length`` words, labels by the
    span rule."""
    return json.dumps({
        "kind": "pcfg", "seed": seed, "max_length": sentences.length,
        "spans": dict(sentences.spans), "downstream_min_length": sentences.downstream_min_length,
        "label_rule": "span", "random": {
            "vocab": vocab, "roots": roots, "nonterminals_per_level": nonterminals,
            "depth": sentences.depth, "binary_per_nonterminal": rules,
            "words_per_nonterminal": words, "terminal_share": 0.0, "concentration": 4.0}})


TESTBED_SOURCE = _span_grammar(52, vocab=128, roots=6, nonterminals=4, rules=2, words=2)
# The same grammar family one level deeper (sentences of exactly 16 words, spans 8 / 4): the
# diagnosis' grammar switch at the testbed scale (not searched: its KL is not measured).
TESTBED_DEEP_SOURCE = _span_grammar(52, vocab=128, roots=6, nonterminals=4, rules=2, words=2,
                                    sentences=SIXTEEN_WORDS)
# The robustness column's grammar (issue 23, item 4; the switch "second-grammar"): the testbed
# search's runner-up in the same "classes4" family, q0-7 (kept by its stage 0, then the lowest
# stage-1 KL after q0-23's: 0.0444 against 0.0192 for d64-h4-l1-i256, testbed_search.md), chosen
# by the search's own ranking, not by any claim: 96 words in 4 classes of one word per emitting
# nonterminal, 5 roots, sentences of exactly 8 words, entropy 3.43 nats/token; majority 30% /
# 45% / 43% on A / B / C, random-init d64 features 0.65 / 0.60 / 0.71, the lookup table 0.97-0.99
TESTBED_SECOND_SOURCE = _span_grammar(422, vocab=96, roots=5, nonterminals=4, rules=2, words=1)
# Closer to the paper's description (A.1) than the shipped grammar: 200 words, 9 roots and 5
# levels of 8 nonterminals (49 symbols), sentences up to 32 words.
PAPER_LIKE_SOURCE = json.dumps({"kind": "pcfg", "seed": 0, "max_length": 32, "random": {
    "vocab": 200, "roots": 9, "nonterminals_per_level": 8, "depth": 5,
    "binary_per_nonterminal": 20, "words_per_nonterminal": 20}})

# The tiny models of the CPU sweeps, smallest first (d_model-heads-layers-d_inter); one head
# size (16), so that each grows into the largest without changing its function (Table 4).
TINY_MODELS = ("d16-h1-l1-i64", "d32-h2-l1-i128", "d64-h4-l2-i256")
# The testbed's sizes grid: one width (d64, head size 16), 2 / 3 / 4 layers, all growing into
# the largest; the narrower d16 / d32 models do not reach its KL criterion in a CPU budget, nor
# does d64-h4-l1-i256 at a constant rate (KL 0.023 after 12000 steps at 1e-3, 0.029 at 2e-3).
TESTBED_MODELS = ("d64-h4-l2-i256", "d64-h4-l3-i256", "d64-h4-l4-i256")
# Table 3 presets the paper's PCFG sweeps span (bert-234m and up need a large GPU each).
PAPER_MODELS = ("bert-2m", "bert-4.8m", "bert-8.3m", "bert-12.8m", "bert-41m", "bert-110m")
# The BiLSTMs of the HMM experiments (paper A.1 / A.4), smallest first: two tiny ones for a CPU,
# and the paper's 10M-135M range from its grid (9.1M, 23.7M, 48.9M, 81.6M, 110M parameters with
# 200 words; ``flatlm.models.presets.parameter_count``).
TINY_LSTMS = ("lstm-h16-l1", "lstm-h32-l2")
PAPER_LSTMS = ("lstm-h256-l6", "lstm-h512-l4", "lstm-h512-l8", "lstm-h768-l6", "lstm-h768-l8")

# What the CPU scales (tiny, testbed and the sweep's) share: a warmup of 100 steps, a log line
# every 50, and their measurements, about a minute a trial on one core: 4000 labelled sentences
# (800 test: s.e. of an accuracy ~1.5 points), the loss on 1000, Tr(F) on 1000 inputs.
CPU_SETTINGS = {
    "train.warmup_steps": 100, "train.log_every": 50,
    "measure.n_eval": 1000, "measure.n_downstream": 4000,
    "measure.flatness.batch_size": 128, "measure.flatness.hutchinson_batch_size": 64,
}
# The CPU scales' adversary: it attacks task B (Table 1) through small pools.
CPU_ADVERSARY = {"train.adversarial.task": "B", "train.adversarial.d1": 32,
                 "train.adversarial.d2": 32, "train.adversarial.pool": 256}


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
    adversarial: dict  # the adversary's settings in the algorithms experiment (its task, when
    #   not given: B if the trial measures B, else its first task: the probed one)
    overrides: dict  # the rest of the base config
    lstms: tuple[str, ...] = TINY_LSTMS  # the sizes grid on an HMM source (BiLSTMs, A.4)
    run_checkpoints: int = 1  # checkpoints of a run of ``steps``, evenly spaced, the last at it
    run_from_zero: bool = False  # a run of ``steps`` also checkpoints step 0 (the initial model)
    long_from_zero: bool = True  # a long run also checkpoints step 0
    # the sizes experiment's grown measurements besides the paper's construction (Fig. 5 under
    # both: ``flatlm.experiments.paper``); none on an LSTM grid, which does not grow
    growth_compare: tuple[str, ...] = ("head-norm",)
    sizes_overrides: dict = field(default_factory=dict)  # the sizes experiment's own settings
    long_overrides: dict = field(default_factory=dict)  # the long runs' own settings (steps,
    #   and sgd before its own rate and schedule)
    kl_threshold: float = 0.1  # the sweeps' saturation rule: KL below it (nats per token)
    # measured besides the protocol's own in the steps, sizes and algorithms experiments, so
    # that their checkpoints also feed the head-to-head of measures (analysis/leaderboard.py)
    selection_what: tuple[str, ...] = ()
    # experiment -> seeds ``flatlm replicate`` runs without --seeds (else the scale's ``seeds``)
    replication_seeds: dict = field(default_factory=dict)
    # the selection experiment's rates (an axis of its grid; none: the scale's own rate)
    selection_lrs: tuple[float, ...] = ()
    # the robustness column's grammar, of the source's family (switch "second-grammar"); None:
    # the scale has none
    second_source: str | None = None
    # a run's checkpoints where the scale places them itself (else ``run_checkpoints`` evenly)
    checkpoint_steps: tuple[int, ...] = ()
    # model -> the settings a sizes grid's model runs with (its own steps and checkpoints, so
    # that each model's checkpoints lie dense around the target KL)
    model_overrides: dict = field(default_factory=dict)
    # the matched-loss rule's common KL (analysis/matched.py), nats/token; None: the scale's
    # claims are read in the saturation regime only
    target_kl: float | None = None
    # algorithm -> the settings its arm of the algorithms experiment runs with (its rate, and
    # checkpoints around the step where it reaches the target KL)
    algorithm_overrides: dict = field(default_factory=dict)
    # protocol switch -> the settings the scale runs with under it (an ablation that reaches
    # the target KL sooner checkpoints sooner)
    switch_overrides: dict = field(default_factory=dict)
    # protocol switch -> the scale's own fields under it (``under``): the second grammar's
    # target KL and the checkpoints around each arm's crossing of it, where its models learn
    # at another pace than on the scale's grammar
    switch_fields: dict = field(default_factory=dict)

    def under(self, protocol: str) -> Scale:
        """This scale as ``protocol``'s switches set it (their ``switch_fields``)."""
        switches = parse_protocol(protocol)[1]
        fields = {k: v for s in switches for k, v in self.switch_fields.get(s, {}).items()}
        return replace(self, **fields) if fields else self

    def seeds_of(self, experiment: str) -> tuple[int, ...] | None:
        """The seeds ``flatlm replicate`` runs ``experiment`` with (no --seeds): its
        ``replication_seeds``, else None (the experiment's, the scale's ``seeds``)."""
        n = self.replication_seeds.get(experiment)
        return None if n is None else tuple(range(n))

    def base(self) -> TrialConfig:
        n = self.run_checkpoints  # evenly spaced, the last at ``steps`` even when n divides not
        steps = self.checkpoint_steps or (self.steps * k // n for k in range(1, n + 1))
        return apply_overrides(TrialConfig(), {
            "source": self.source, "model": self.model, "train.steps": self.steps,
            "train.checkpoint_steps": self.run_steps(steps), **self.overrides})

    def run_steps(self, steps) -> list[int]:
        """A run's checkpoint ``steps``, with step 0 first when the scale checkpoints it."""
        return sorted({*steps, *((0,) if self.run_from_zero else ())})


TINY = Scale(
    name="tiny", source=TINY_SOURCE, deep_source=TINY_DEEP_SOURCE, models=TINY_MODELS,
    model=TINY_MODELS[-1], steps=1500, long_steps=3000, checkpoints=6, seeds=(0, 1, 2), gpus=0.0,
    # plain SGD at B.2's 1e-3 does not leave its initialisation in a CPU-sized run
    sgd_lr=0.3, adversarial=dict(CPU_ADVERSARY),
    overrides={"train.batch_size": 128, "train.lr": 3e-3, **CPU_SETTINGS})

GPU = Scale(
    name="gpu", source="pcfg:paper", deep_source=PAPER_LIKE_SOURCE, models=PAPER_MODELS,
    model="bert-41m", steps=30_000, long_steps=200_000, checkpoints=20, seeds=(0, 1, 2), gpus=1.0,
    lstms=PAPER_LSTMS,
    sgd_lr=1e-3,  # B.2
    adversarial={"train.adversarial.task": "B"},  # Table 1 reports tasks A and B
    overrides={
        "train.batch_size": 4096, "train.micro_batch_size": 1024, "train.warmup_steps": 1000,
        "train.log_every": 100,
        # A.7: the loss on 10^6 sentences; A.1: 0.1M labelled sentences per task; B.1: Tr(F) on
        # 10^4 inputs (50 sampled labels each under the paper protocol, B.1; 8 under paper-code:
        # s.e. ~2%)
        "measure.n_eval": 1_000_000, "measure.n_downstream": 100_000,
        "measure.flatness.n_inputs": 10_000, "measure.flatness.batch_size": 512,
    })

# The testbed (issue 23, item 3): the scale where the paper's precondition can hold on a
# laptop, chosen by bench/testbed_search.py against criteria fixed before any claim was looked
# at (bench/results/testbed_search.md; the search read KL, the best trained probe against
# random-init features, majority shares and times, never a claim's outcome). The search's stage
# 2 ran at 5e-3 with a linear decay (KL 0.019 / 0.0067 / 0.0069 for 1 / 2 / 4 layers); under
# the paper's constant rate (A.5) the KL is set by the sentences seen, not by the rate or the
# batch (d64-h4-l2-i256 after 512k sentences: 0.044 / 0.039 / 0.041 at batch 128 / 512 / 1024
# and lr 1e-3; 0.041 / 0.039 at batch 1024 and lr 2e-3 / 4e-3: testbed_search.md, "Batch and
# rate"). 1.5M sentences (12000 x 128) left 10 of 15 AdamW runs of the first replication above
# 0.02 (0.019-0.025); 2.56M (10000 x 256, the paper's rate) leave a margin, the KL falling
# about as N^-0.7. (b) best probe - random-init features +26.5 / +24.7 / +19.3 points on A / B
# / C, majority 32% / 42% / 52% (task C misses the 50% bound by 2 points: the report flags its
# verdicts); (d) the adversary's lambda 0.01: the largest of 1, 0.316, ..., 0.001 within 0.02
# nats of AdamW's KL at this budget (the search's earlier 12000 x 128 budget chose 0.0316, which
# at 10000 x 256 ends 0.04-0.09 nats above AdamW; lambda 0.01 and 0.00316 end at KL 0.0126 and
# 0.0148 against AdamW's 0.0139, seed 0: bench/results/adversary_lambda.md; at lambda >= 0.1
# the adversary stalls at KL 0.77). SGD at its rate 0.3 does not
# saturate (KL 0.64). Measured on the replication's own runs:
# bench/results/replication_testbed/criteria.md.
TESTBED = Scale(
    name="testbed", source=TESTBED_SOURCE, deep_source=TESTBED_DEEP_SOURCE,
    models=TESTBED_MODELS, model=TESTBED_MODELS[0], steps=10000, long_steps=10000,
    checkpoints=5, seeds=(0,), gpus=0.0, sgd_lr=0.3,
    # criterion (c): at least 5 seeds for steps / sizes and 3 for the others, in one command
    replication_seeds={"steps": 5, "sizes": 5, "algorithms": 3, "sgd": 3, "selection": 3},
    adversarial={**CPU_ADVERSARY, "train.adversarial.lambda": 0.01},
    # the paper's dropout 0.1 in every AdamW run (A.5; without it d64-h4-l2 ends at KL 0.0204)
    run_checkpoints=3, long_from_zero=False, kl_threshold=SATURATED_KL,
    # issue 25's measures, about 25 s a checkpoint on one core (landscape 13 s, llc 5 s)
    selection_what=("eigen", "sharpness", "precond", "critical", "noise", "llc", "cka_truth"),
    # issue 25's lr axis: the rates around the scale's own 1e-3 (whose runs are the other
    # experiments'; the leaderboard pools every experiment and merges repeated trainings): the
    # KL is set by the sentences seen, not the rate (bench/results/testbed_search.md)
    selection_lrs=(5e-4, 2e-3),
    second_source=TESTBED_SECOND_SOURCE,
    overrides={
        # the paper's rate (A.5: AdamW at a constant 1e-3 after warmup: flatlm's default lr,
        # and the protocol's schedule; at batch 128 a constant 2e-3 or 5e-3 plateaus above KL
        # 0.02); the paper's batch is 4096, this one's 256: the sentences seen set the KL, and a
        # smaller batch costs no more per sentence on a CPU
        "train.batch_size": 256, **CPU_SETTINGS,
        # the probe as the testbed search measured (first.MEASURE): reaches only this scale's
        # base alone (``Scale.base()``: bench/checkpoint_cost.py without --protocol); every
        # protocol sets its own (A.6's 100 epochs x 5 seeds, or the released probe)
        "measure.probe.epochs": 40, "measure.probe.seeds": 3, "measure.probe.batch_size": 256,
    })

# The sweeps' CPU scale (the no-argument sweeps, issue 23 item 3): the testbed's grammar and
# models, one seed, at a budget that fits 10 minutes on 2 cores. The testbed's runs pass KL 0.02
# only after 2.5M sentences (13-25 CPU-min a trial); after 2000 x 256 sentences its AdamW runs
# are at KL 0.036-0.045 (the testbed replication's steps runs at step 2000), so the sweeps' rule
# is KL < 0.05 and their summaries say how far from the truth the runs are (``--scale testbed``
# for the saturated runs). The tasks are the testbed's: random-init features probe at 0.65-0.82,
# trained ones at 0.97-0.99 (the earlier sweep grammar's were nearly free: random-init 0.89-0.94
# on A). Every curve starts at the initial model (step 0); sizes and algorithms runs checkpoint
# 0 / 1000 / 2000, the steps run every 500 up to 3000. To fit the budget, Tr(F) is estimated on
# 500 inputs (s.e. about 2%) and the sizes grid grows by the paper's construction only (the
# replication shows Fig. 5 under both): at 3000 steps, 4 checkpoints, 1000 inputs and both
# constructions the scaling sweep took 16+ min (its 2-layer trial alone 6 min). The schedule's
# shape is the protocol's.
SWEEP = replace(
    TESTBED, name="sweep", steps=2000, long_steps=3000, checkpoints=6, seeds=(0,),
    run_checkpoints=2, run_from_zero=True, long_from_zero=True, kl_threshold=0.05,
    replication_seeds={}, selection_what=(), selection_lrs=(), second_source=None,
    growth_compare=(),
    overrides={**TESTBED.overrides, "measure.flatness.n_inputs": 500},
    # the testbed's adversary without its task: B where the trial measures B, else the first
    # task measured (a sweep's --source may be an HMM or Dyck)
    adversarial={k: v for k, v in TESTBED.adversarial.items() if k != "train.adversarial.task"})

# Testbed v2 (issue 50): the paper's claims at *matched loss* below saturation. The v2 search
# (bench/testbed_v2.py, bench/results/testbed_v2_search.md) found no CPU-trainable grammar that
# saturates with tasks that leave room; its L0-24 (64 words, 10 roots, 3 levels of 10
# nonterminals with 4 rules each, 4 words each, sentences of exactly 8 words, entropy 2.64
# nats/token) has room for every claim (majority 25-28%, random-init d64 features 0.55-0.67,
# the trained probes 0.79-0.92 at KL 0.31-0.34). Every arm is read where its KL crosses
# ``target_kl`` = 0.7 nats (analysis/matched.py), the KL the smallest model reaches in about
# 6000 steps (3.5 CPU-min on one thread); each model's checkpoints lie around the step where it
# gets there (bench/results/replication_testbed_v2/criteria.md has the pilot's KL curves).
TESTBED_V2_SOURCE = _span_grammar(924, vocab=64, roots=10, nonterminals=10, rules=4, words=4)
# The robustness column's grammar: the v2 search's next kept candidate of the same family with
# a stage-1 run, L0-17 (64 words, 12 roots, 12 nonterminals a level with 6 rules, one word each)
TESTBED_V2_SECOND_SOURCE = _span_grammar(90, vocab=64, roots=12, nonterminals=12, rules=6,
                                         words=1)
# The sizes grid grows depth, then width, over 7x the parameters (60k, 110k, 424k with 64
# words), head size 16 throughout: every model grows into d128-h8-l2-i512 (Table 4).
TESTBED_V2_MODELS = ("d64-h4-l1-i256", "d64-h4-l2-i256", "d128-h8-l2-i512")
TESTBED_V2_TARGET_KL = 0.7
# the second grammar's own target (switch_fields, below): its pilot's 0.85, moved to 0.88 by the
# KL of the landed runs alone, before any claim of the column was read (below)
TESTBED_V2_SECOND_PILOT_KL, TESTBED_V2_SECOND_TARGET_KL = 0.85, 0.88
TESTBED_V2 = replace(
    TESTBED, name="testbed-v2", source=TESTBED_V2_SOURCE, deep_source=TESTBED_V2_SOURCE,
    models=TESTBED_V2_MODELS, model=TESTBED_V2_MODELS[1], steps=3500, long_steps=3500,
    checkpoints=7, long_from_zero=True, run_checkpoints=1,
    checkpoint_steps=(2000, 2500, 3000, 3500), target_kl=TESTBED_V2_TARGET_KL,
    # the pilot's first checkpoints at KL <= 0.7 (seed 0, every 250 steps): d64-l1 6500,
    # d64-l2 2750, d128-l2 1250 (bench/results/replication_testbed_v2/pilot.json); the steps
    # model's checkpoints reach on both sides for an algorithm that gets there later (the
    # adversary: 0.706 at 3000 in the pilot); noreg, sooner, has its own (below)
    model_overrides={
        "d64-h4-l1-i256": {"train.steps": 8000,
                           "train.checkpoint_steps": [5000, 5750, 6500, 7250, 8000]},
        "d128-h8-l2-i512": {"train.steps": 1750,
                            "train.checkpoint_steps": [750, 1000, 1250, 1500, 1750]}},
    # the paper's construction only (the first testbed showed Fig. 5 under both): grown Tr(F)
    # of each checkpoint at 4x a d64 model's size is the largest measurement of this scale
    growth_compare=(), selection_what=(), selection_lrs=(),
    second_source=TESTBED_V2_SECOND_SOURCE, kl_threshold=TESTBED_V2_TARGET_KL,
    # the adversary's lambda by the pilot's search (bench/testbed_v2_pilot.py): the largest of
    # 0.1, 0.0316, 0.01, 0.00316 whose KL at AdamW's first step at the target (2750) lies within
    # 0.02 nats of it: 0.1 stalls (KL 1.27 at step 1000), 0.01 is 0.022 above, 0.00316 0.017
    # (0.0316 not run: the KL rises with lambda and 0.01 already fails)
    adversarial={**CPU_ADVERSARY, "train.adversarial.lambda": 0.00316},
    # SGD keeps the testbed's 0.3 (12% warmup, then constant): by the pilot's search no rate of
    # 0.3, 1, 3 reaches the target in 3500 steps (0.3 ends at KL 1.253, 1 at 1.276, 3 diverges
    # at step 750), and 0.3 ends lowest, so the SGD arm reads "target not reached"
    # Muon (issue 54) at the pilot's rate: of 0.005, 0.01, 0.02 the one whose KL crosses the
    # target first (0.01 at step 1326; 0.005 at 1574; 0.02 stalls at 0.77; 0.04 not run: the
    # plateau rises with the rate), checkpointed around that crossing (KL 0.74-0.65 in the
    # pilot) as AdamW's are around its own (2750)
    algorithm_overrides={"muon": {"train.muon.lr": 0.01, "train.steps": 1750,
                                  "train.checkpoint_steps": [1000, 1250, 1500, 1750]},
                         # noreg (no dropout, no weight decay) learns faster: its first runs
                         # at AdamW's checkpoints were below the target from the first one
                         # (KL 0.677 / 0.664 / 0.692 at step 2000, seeds 0-2, the records at
                         # commit 70b21dc), so it is checkpointed before 2000
                         "noreg": {"train.steps": 2000,
                                   "train.checkpoint_steps": [1250, 1500, 1750, 2000]}},
    # soft targets (paper+soft-targets) cross the target at step 1000 in the pilot (KL 0.79 at
    # 500, 0.67 at 1250)
    switch_overrides={"soft-targets": {"train.steps": 1250,
                                       "train.checkpoint_steps": [500, 750, 1000, 1250]}},
    # the robustness column's grammar (L0-17) is learned slower: the smallest model's KL is
    # 0.851 at step 6000 and 0.810 at 14000 (a plateau the larger models pass), so KL 0.7 is
    # out of a trial's budget there. Its pilot (seed 0, the KL on 1,000 sentences) put the
    # column's target at 0.85 nats/token and each arm's checkpoints around its crossing of it
    # (bench/testbed_v2_pilot.py --grammar second; pilot_second_grammar.json): d64-l1 at 6750,
    # d64-l2 (AdamW) 3500, d128-l2 1500, noreg 2500, SAM 3750. On 20,000 sentences and three
    # seeds the smallest model's seed 2 plateaus at KL 0.879 (steps 8500-10000; seeds 0-1 end
    # at 0.843 / 0.854), so at 0.85 every sizes row reads "target not reached"; the target is
    # the lowest KL in steps of 0.01 that every run of the grid reaches, 0.88, chosen from the
    # runs' KL alone before any of the column's claims was read (every arm still brackets it)
    switch_fields={"second-grammar": {
        "target_kl": TESTBED_V2_SECOND_TARGET_KL, "kl_threshold": TESTBED_V2_SECOND_TARGET_KL,
        "steps": 4000, "checkpoint_steps": (2500, 3000, 3500, 4000),
        "model_overrides": {
            "d64-h4-l1-i256": {"train.steps": 10000,
                               "train.checkpoint_steps": [4000, 5500, 7000, 8500, 10000]},
            "d128-h8-l2-i512": {"train.steps": 2000,
                                "train.checkpoint_steps": [1000, 1250, 1500, 1750, 2000]}},
        "algorithm_overrides": {
            "noreg": {"train.steps": 3250, "train.checkpoint_steps": [1750, 2250, 2750, 3250]},
            "sam": {"train.steps": 4250, "train.checkpoint_steps": [2750, 3250, 3750, 4250]}}}},
    # the probe's downstream set: the paper's 100,000 sentences would take ~7 CPU-min a
    # checkpoint (35 a trial, over the 30 CPU-min budget); 20,000 is the largest that stays
    # within it, and lifts the probes 10 points over 4,000's, whose probe is data-bound (train
    # 0.87 vs test 0.67 on A at KL 0.69; pilot.json's probe_size)
    # The KL on 20,000 sentences (Tr(F) still on 1,000 inputs): the first sizes runs (n_eval
    # 1,000, bench/results/replication_testbed_v2/) read every arm at KL 0.7 but knew each KL
    # only to +-0.017 nats, which at a slope of -0.5 accuracy per nat could hide 3 points, over
    # a quarter of Fig. 3a's 6.9: the matched-loss rule's confound bound, decided on by the bound
    # alone (analysis/matched.py), not by any effect. 20,000 sentences cut it to about 0.7.
    overrides={**TESTBED.overrides, "measure.n_downstream": 20_000, "measure.n_eval": 20_000,
               "measure.flatness.n_inputs": 1000})

SCALES: Registry[Scale] = Registry(
    "scale", key="scale",
    how_to_add="flatlm.experiments.scales.register_scale in a plug-in module: --plugin MODULE")


def register_scale(sc: Scale, *, replace: bool = False) -> Scale:
    """Adds ``sc`` under its name (``replace``: over a scale registered before); returns it."""
    return SCALES.add(sc, Scale, "register_scale", replace=replace)


for _scale in (SWEEP, TINY, GPU, TESTBED, TESTBED_V2):
    register_scale(_scale)


def scale(name: str) -> Scale:
    """The registered scale ``name``; a ValueError naming the known ones."""
    return SCALES.lookup(name)
