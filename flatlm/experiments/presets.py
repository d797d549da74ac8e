"""What ``--source`` brings with it, and the sweeps' retired presets as older runs' tags.

``--scale`` and ``--protocol`` mean the same in every command (``flatlm replicate``, the sweeps);
the experiments themselves are in ``paper``. The sweeps once took ``--preset`` instead, a
(scale, protocol) pair whose ``tiny`` was the ``sweep`` scale (not ``--scale tiny``); it is now
an error naming its replacement (``sweeps.cli``), and runs tagged with it are still read.
"""

from __future__ import annotations

from flatlm.experiments.scales import PAPER_LSTMS, TINY_LSTMS, Scale
from flatlm.runs.trial import TrialConfig
from flatlm.sources import SourceSpec, load

__all__ = ["PAPER_LSTMS", "RETIRED_PRESETS", "TINY_LSTMS", "hmm_tasks", "scale_and_protocol_of",
           "source_kind", "source_overrides"]

# The sweeps' retired --preset names, as (scale, protocol): read from older runs' preset tags.
RETIRED_PRESETS = {"tiny": ("sweep", "paper"), "paper": ("gpu", "paper"),
                   "paper-code": ("gpu", "paper-code")}


def scale_and_protocol_of(preset: str) -> tuple[str, str | None]:
    """The (scale, protocol) an older sweep's preset tag names: a retired preset's pair
    (``tiny`` is the ``sweep`` scale under ``paper``), ``scale/protocol`` where they were given
    apart, else the tag as the scale.

    >>> scale_and_protocol_of("tiny"), scale_and_protocol_of("testbed/paper-code")
    (('sweep', 'paper'), ('testbed', 'paper-code'))
    """
    if preset in RETIRED_PRESETS:
        return RETIRED_PRESETS[preset]
    scale, _, protocol = preset.partition("/")
    return scale, protocol or None


PAPER_HMM_POSITIONS = (6, 10)  # A.1: task-6 and task-10 classify the 6th and 10th hidden state


def source_kind(source: str | None) -> str:
    """The kind of a sweep's ``--source`` (pcfg when none is given: the presets' own)."""
    return "pcfg" if source is None else SourceSpec(source).kind


def hmm_tasks(length: int) -> list[str]:
    """The paper's HMM tasks that sentences of ``length`` words have (task-6, task-10), else the
    middle position's."""
    return [f"task-{k}" for k in PAPER_HMM_POSITIONS if k <= length] or [
        f"task-{(length + 1) // 2}"]


def source_overrides(sc: Scale, source: str | None) -> dict:
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
    if kind != "pcfg":  # the protocols' label rules and spans are a PCFG's: the source's own
        out.update({"measure.label_rule": None, "measure.spans": None})
    if kind == "hmm":
        out.update({"model": sc.lstms[-1], "measure.tasks": hmm_tasks(load(source).max_length)})
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
