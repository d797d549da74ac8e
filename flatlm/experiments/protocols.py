"""How a claim is run and measured: the paper's text, the released code, and the switches between.

A protocol name is a base (``paper`` or ``paper-code``) followed by switches joined with ``+``:
``paper+inside-labels`` is the paper's text with the released code's label rule. Each switch is
one protocol difference the diagnosis (issue: what decides the verdicts) turns on alone.

>>> protocol_overrides("paper+mask-only")["train.mask_replace"]
[1.0, 0.0, 0.0]
>>> model_for("d32-h2-l1-i128", "paper-code")
'd32-h2-l1-i128-pre'
"""

from __future__ import annotations

from flatlm.measure.curvature import B1_LABELS_PER_INPUT
from flatlm.measure.probe import RELEASED
from flatlm.models.presets import PRE_LN_SUFFIX

# The switches, each the released code's choice (or the flatlm-era default it replaced) for one
# part of the protocol. "pre-ln" changes the model (``model_for``), "deep-grammar" the source
# (``flatlm.experiments.scales``); the others are trial config overrides.
SWITCHES: dict[str, tuple[str, dict]] = {
    "released-masking": ("15% of the words masked, at most 5 per sentence (BERT's 80/10/10)",
                         {"train.mask": 0.15, "train.max_predictions": 5}),
    "mask-only": ("every masked word written as [MASK] (no 10% random / 10% kept)",
                  {"train.mask_replace": [1.0, 0.0, 0.0]}),
    "inside-labels": ("labels: argmax of the inside probability of the span (released code)",
                      {"measure.label_rule": "inside"}),
    "pre-ln": ("pre-LN encoder (academic-budget-bert --encoder_ln_mode pre-ln)", {}),
    "linear-schedule": ("lr 5e-4, warmup 20% of the steps, linear decay to 0 (released code)",
                        {"train.lr": 5e-4, "train.schedule": "linear",
                         "train.warmup_steps": None, "train.warmup_proportion": 0.2}),
    "released-probe": ("probe as run_lp.py runs it: batch 512, 50 epochs, linear decay, no "
                       "clipping, raw states of positions 1..T (padding too), dropout 0.1 on "
                       "them, the encoder in train mode, a N(0, 0.02) head",
                       {f"measure.probe.{k}": v for k, v in RELEASED.items()}),
    "deep-grammar": ("a deeper grammar: the scale's deep source (paper-like at GPU scale)", {}),
}

# The released code's protocol = every switch but the ones that are not its choices.
BASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "paper": ("the paper's text (A.1, A.4, A.5, B.1): post-LN, one masked word per sentence, "
              "AdamW at a constant lr after warmup, posterior labels, standardised probe, Tr(F) "
              "from 50 sampled labels per input", ()),
    "paper-code": ("the released code: pre-LN, 15% masking (max 5), lr 5e-4 with 20% warmup "
                   "and linear decay, inside-probability labels, batch-512 probe for 50 epochs",
                   ("released-masking", "inside-labels", "pre-ln", "linear-schedule",
                    "released-probe")),
}


# What a base sets besides its switches, where the library default is not its text's choice.
# B.1: Tr(F) from 50 labels sampled per input (the library's default is 8: the same expectation,
# a larger variance per input, 6x fewer backward passes). The released code has no sampled-label
# estimator (it runs Hutchinson on the one-hot loss: flat/trace_hessian_data), so paper-code
# keeps the library's.
BASE_SETTINGS: dict[str, dict] = {
    "paper": {"measure.flatness.labels_per_input": B1_LABELS_PER_INPUT},
    "paper-code": {},
}


def parse_protocol(name: str) -> tuple[str, tuple[str, ...]]:
    """(base, switches) of ``name``; a ValueError names what is unknown and what is known."""
    base, *extra = name.split("+")
    if base not in BASES:
        raise ValueError(f"protocol {name!r}: unknown base {base!r}; use one of "
                         f"{', '.join(BASES)}, optionally followed by +switch")
    for switch in extra:
        if switch not in SWITCHES:
            raise ValueError(f"protocol {name!r}: unknown switch {switch!r}; switches: "
                             f"{', '.join(SWITCHES)}")
    return base, tuple(dict.fromkeys((*BASES[base][1], *extra)))


def switches_of(name: str) -> tuple[str, ...]:
    return parse_protocol(name)[1]


def protocol_overrides(name: str) -> dict:
    """The trial config overrides of protocol ``name``: its base's (``BASE_SETTINGS``), then its
    switches', in order."""
    base, switches = parse_protocol(name)
    out: dict = dict(BASE_SETTINGS[base])
    for switch in switches:
        out.update(SWITCHES[switch][1])
    return out


def model_for(model: str, protocol: str) -> str:
    """``model`` as protocol ``protocol`` trains it (the pre-LN variant under ``pre-ln``)."""
    pre = ("pre-ln" in switches_of(protocol) and not model.endswith(PRE_LN_SUFFIX)
           and not model.startswith("lstm-"))  # the LSTM has no layer-norm placement
    return model + PRE_LN_SUFFIX if pre else model


def describe(name: str) -> str:
    """One line: the base's description and each added switch's."""
    base, switches = parse_protocol(name)
    added = [s for s in switches if s not in BASES[base][1]]
    return "; ".join([BASES[base][0], *(f"+ {SWITCHES[s][0]}" for s in added)])


def diagnosis_protocols(base: str = "paper") -> list[str]:
    """``base`` with each switch alone (the diagnosis grid), the base itself first."""
    parse_protocol(base)
    return [base, *(f"{base}+{s}" for s in SWITCHES if s not in switches_of(base))]
