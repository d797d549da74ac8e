"""Named trial configs: a preset is a function, a variant is a small diff (``dataclasses.replace``
or ``apply_overrides`` on a base)."""

from __future__ import annotations

from flatlm.core.config import apply_overrides
from flatlm.experiments import scales
from flatlm.experiments.protocols import model_for, protocol_overrides
from flatlm.measure.probe import RELEASED
from flatlm.runs.trial import TrialConfig
from flatlm.sources import SourceSpec, load

# The languages and model grids live with the replication's scales (one place for both).
SWEEP_SOURCE, TINY_MODELS, PAPER_MODELS = (scales.SWEEP_SOURCE, scales.TINY_MODELS,
                                           scales.PAPER_MODELS)
# The BiLSTMs of the HMM sweeps (paper A.1 / A.4), smallest first: two tiny ones for a CPU, and
# the paper's 10M-135M range from its grid (9.1M, 23.7M, 48.9M, 81.6M, 110M parameters with
# 200 words; ``flatlm.models.presets.parameter_count``).
TINY_LSTMS = ("lstm-h16-l1", "lstm-h32-l2")
PAPER_LSTMS = ("lstm-h256-l6", "lstm-h512-l4", "lstm-h512-l8", "lstm-h768-l6", "lstm-h768-l8")
PAPER_HMM_POSITIONS = (6, 10)  # A.1: task-6 and task-10 classify the 6th and 10th hidden state
TINY_KL_THRESHOLD = 0.05  # the tiny sweeps' saturation rule: every tiny model gets below it
#   by step 2000-3000 of tiny_cpu() (0.032 / 0.019 / 0.009 at 3000, no dropout)


def tiny_cpu() -> TrialConfig:
    """A trial that reaches the saturated regime on one CPU core in about 1.5 minutes (the
    middle model; 1-3 minutes over TINY_MODELS): the numbers are in flatlm.experiments.scales
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
    """``paper_pcfg`` under the released code's protocol (``flatlm.experiments.protocols``):
    pre-LN, 15% masking, linear decay, inside-probability labels, the released probe."""
    base = paper_pcfg()
    return apply_overrides(base, {**protocol_overrides("paper-code"),
                                  "model": model_for(str(base.model), "paper-code")})


def source_kind(source: str | None) -> str:
    """The kind of a sweep's ``--source`` (pcfg when none is given: the presets' own)."""
    return "pcfg" if source is None else SourceSpec(source).kind


def hmm_tasks(length: int) -> list[str]:
    """The paper's HMM tasks that sentences of ``length`` words have (task-6, task-10), else the
    middle position's."""
    return [f"task-{k}" for k in PAPER_HMM_POSITIONS if k <= length] or [
        f"task-{(length + 1) // 2}"]


def source_overrides(preset: str, source: str | None) -> dict:
    """What ``--source`` changes in a preset's base: the source, and per kind the paper's
    setting for it: an HMM trains a BiLSTM (A.4) and probes task-6 / task-10 (A.1); Dyck probes
    g* (section 5); LM text probes its first and middle positions' tasks (``mask-k``) and
    fine-tunes on its GLUE tasks if it has them (``glue=DIR``, A.1); real
    text masks 15% of the words (A.2), measures what needs no truth and fine-tunes on its GLUE
    tasks (the sweep then needs ``--loss-tolerance``); a PCFG keeps the preset's model and tasks
    (every grammar has A, B, C)."""
    if source is None:
        return {}
    kind = source_kind(source)
    out: dict = {"source": source}
    if kind != "pcfg":  # paper-code's inside-probability labels are a PCFG's: the source's own
        out["measure.label_rule"] = None
    if kind == "hmm":
        lstm = (TINY_LSTMS if preset == "tiny" else PAPER_LSTMS)[-1]
        out.update({"model": lstm, "measure.tasks": hmm_tasks(load(source).max_length)})
    elif kind == "dyck":
        out["measure.tasks"] = ["g_star"]
    elif kind == "lm":
        lm = load(source)
        out["measure.tasks"] = sorted({"mask-1", f"mask-{max(1, lm.max_length // 2)}"})
        if lm.glue_tasks:  # the paper's QNLI / SST-2 fine-tuning beside the mask-k probes
            out["measure.what"] = [*TrialConfig().measure.what, "glue"]
    elif kind == "text":
        glue = ["glue"] if load(source).tasks else []
        out.update({"train.mask": 0.15, "measure.tasks": [],
                    "measure.what": ["loss", "fisher", "hessian", *(["probe"] if glue else []),
                                     *glue]})
    return out


def base_for(preset: str, source: str | None = None) -> TrialConfig:
    """A preset's base trial, on ``source`` (``--source``) with its kind's defaults."""
    base = {"tiny": tiny_cpu, "paper": paper_pcfg, "paper-code": paper_code_pcfg}[preset]()
    return apply_overrides(base, source_overrides(preset, source))


def models_for(preset: str, source: str | None = None) -> tuple[str, ...]:
    """The model grid of a preset: tiny shapes, or Table 3's (pre-LN under paper-code); on an
    HMM source the BiLSTMs (TINY_LSTMS, or PAPER_LSTMS under paper / paper-code)."""
    if source_kind(source) == "hmm":
        return TINY_LSTMS if preset == "tiny" else PAPER_LSTMS
    if preset == "tiny":
        return TINY_MODELS
    return tuple(model_for(m, "paper" if preset == "paper" else "paper-code")
                 for m in PAPER_MODELS)
