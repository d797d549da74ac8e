"""Named trial configs: a preset is a function, a variant is a small diff (``dataclasses.replace``
or ``apply_overrides`` on a base)."""

from __future__ import annotations

from flatlm.config import apply_overrides
from flatlm.measure.probe import RELEASED
from flatlm.replication import scales
from flatlm.replication.protocols import model_for, protocol_overrides
from flatlm.trial import TrialConfig

# The languages and model grids live with the replication's scales (one place for both).
SWEEP_SOURCE, TINY_MODELS, PAPER_MODELS = (scales.SWEEP_SOURCE, scales.TINY_MODELS,
                                           scales.PAPER_MODELS)
TINY_KL_THRESHOLD = 0.05  # the tiny sweeps' saturation rule: every tiny model gets below it
#   by step 2000-3000 of tiny_cpu() (0.032 / 0.019 / 0.009 at 3000, no dropout)


def tiny_cpu() -> TrialConfig:
    """A trial that reaches the saturated regime on one CPU core in about 1.5 minutes (the
    middle model; 1-3 minutes over TINY_MODELS): the numbers are in flatlm.replication.scales
    at SWEEP_SOURCE. Linear decay, because with a constant rate the models plateau higher
    (measured: the smallest at KL 0.044 instead of 0.032)."""
    return apply_overrides(TrialConfig(), {
        "source": SWEEP_SOURCE, "model": TINY_MODELS[1],
        "train.steps": 3000, "train.batch_size": 128, "train.lr": 5e-3,
        "train.warmup_steps": 50, "train.schedule": "linear",
        "train.checkpoint_steps": [1000, 2000, 3000], "train.log_every": 50,
        # 800 test sentences per task: s.e. of an accuracy ~0.8 points here
        "measure.n_eval": 1000, "measure.n_downstream": 4000, "measure.tasks": ["A", "B"],
        "measure.probe.epochs": 40, "measure.probe.seeds": 3, "measure.probe.batch_size": 256,
        "measure.flatness.batch_size": 128, "measure.flatness.hutchinson_batch_size": 64,
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


def paper_code_pcfg() -> TrialConfig:
    """``paper_pcfg`` under the released code's protocol (``flatlm.replication.protocols``):
    pre-LN, 15% masking, linear decay, inside-probability labels, the released probe."""
    base = paper_pcfg()
    return apply_overrides(base, {**protocol_overrides("paper-code"),
                                  "model": model_for(str(base.model), "paper-code")})


def base_for(preset: str) -> TrialConfig:
    return {"tiny": tiny_cpu, "paper": paper_pcfg, "paper-code": paper_code_pcfg}[preset]()


def models_for(preset: str) -> tuple[str, ...]:
    """The model grid of a preset: tiny shapes, or Table 3's (pre-LN under paper-code)."""
    if preset == "tiny":
        return TINY_MODELS
    return tuple(model_for(m, "paper" if preset == "paper" else "paper-code")
                 for m in PAPER_MODELS)
