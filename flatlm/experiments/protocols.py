"""How a claim is run and measured: the paper's text, the released code, and the switches between.

A protocol name is a base (``paper`` or ``paper-code``) followed by switches joined with ``+``:
``paper+inside-labels`` is the paper's text with the released code's label rule. Each switch is
one protocol difference the diagnosis (issue: what decides the verdicts) turns on alone.

Every protocol starts from ``PAPER``, the paper's text as trial config overrides, the one place
that says what ``paper`` is (the sweeps' and ``flatlm replicate``'s
``--protocol paper`` build from it); ``paper-code`` adds every released switch. A
scale (``flatlm.experiments.scales``) sets sizes, lengths and the peak lr, not how the protocol
labels, masks, schedules or probes.

>>> protocol_overrides("paper+mask-only")["train.mask_replace"]
[1.0, 0.0, 0.0]
>>> protocol_overrides("paper")["measure.label_rule"], protocol_overrides("paper-code")[
...     "measure.spans"]
('span', 'released')
>>> model_for("d32-h2-l1-i128", "paper-code")
'd32-h2-l1-i128-pre'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flatlm.core.registry import Registry
from flatlm.measure.curvature.common import B1_LABELS_PER_INPUT
from flatlm.measure.probes.probe import RELEASED
from flatlm.models.presets import PRE_LN_SUFFIX

# The released run's warmup (its README: --lr_schedule step --warmup_proportion 0.13333
# --max_steps 25000; schedules.py's StepScheduler warms up over max_steps * warmup_proportion,
# and --num_warmup_steps 3333 is read only by "constant_step"), then --curve linear decay to 0.
RELEASED_WARMUP_PROPORTION = 0.13333

# The paper's text, under every protocol (a switch may replace a key):
PAPER: dict = {
    # Section 2 (footnote 1): one masked token per sentence; 15% only on real text (A.2, which
    # presets.source_overrides sets for a text source)
    "train.mask": "one",
    # A.5: a constant rate after warmup, "to compare checkpoints at different number of steps"
    "train.schedule": "constant",
    # A.1: y = argmax_s Pr(s | x_1..x_{1+L}), tasks A, B, C on the symbols of span L = 32, 16, 8
    # of a depth-6 grammar: parse depths 1, 2, 3 (flatlm.sources.pcfg, spans "depth")
    "measure.label_rule": "span", "measure.spans": "depth",
    # A.6: AdamW lr 1e-3 for 100 epochs, 5 seeds; the text gives no batch size: the released
    # run_lp.py's (--per_device_train_batch_size 512)
    "measure.probe.lr": 1e-3, "measure.probe.epochs": 100, "measure.probe.seeds": 5,
    "measure.probe.batch_size": RELEASED["batch_size"],
}

# A switch's kinds: one protocol difference (the diagnosis turns it on alone); another language,
# not how a claim is run or measured (the report shows its protocols as robustness columns, the
# diagnosis leaves them out); an ablation of the paper's mechanism rather than its text or the
# released code (its trials are arms of analysis/beyond.py's comparisons, not a protocol of the
# paper's claims)
PROTOCOL, ROBUSTNESS, ABLATION = "protocol", "robustness", "ablation"
KINDS = (PROTOCOL, ROBUSTNESS, ABLATION)


@dataclass(frozen=True, kw_only=True)
class Switch:
    """One ``+switch`` of a protocol name: what it changes, as trial config overrides."""

    name: str
    description: str  # one line, what ``describe`` and the reports say it is
    # trial config overrides, applied after the base's; "pre-ln" changes the model instead
    # (``model_for``), "deep-grammar" and "second-grammar" the source (flatlm.experiments.scales)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    kind: str = PROTOCOL

    def __post_init__(self):
        if not self.name or "+" in self.name or self.name != self.name.strip():
            raise ValueError(f"protocol switch {self.name!r}: use a word without '+'")
        if self.kind not in KINDS:
            raise ValueError(f"protocol switch {self.name!r}: kind={self.kind!r}; use one of "
                             f"{', '.join(KINDS)}")
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))


SWITCHES: Registry[Switch] = Registry(
    "protocol switch", key="--protocol switch",
    how_to_add="flatlm.experiments.protocols.register_switch in a plug-in module: --plugin MODULE")


def register_switch(switch: Switch, *, replace: bool = False) -> Switch:
    """Adds ``switch`` (``paper+<name>`` then names it); a name taken is a ValueError."""
    return SWITCHES.add(switch, Switch, "register_switch", replace=replace)


def switches_of_kind(kind: str) -> tuple[str, ...]:
    """The registered switches of ``kind`` (``ROBUSTNESS``: the second grammar), in order."""
    return tuple(name for name, switch in SWITCHES.items() if switch.kind == kind)


# The built-in switches, each the released code's choice for one part of the protocol, but the
# last three
for _switch in (
    Switch(name="released-masking",
           description="15% masking: exactly max(1, round(0.15 (L + 2))) words per sentence, at "
                       "most 5, BERT's 80/10/10 (released create_pretraining_data.py)",
           overrides={"train.mask": 0.15, "train.mask_count": "fixed",
                      "train.max_predictions": 5}),
    Switch(name="mask-only",
           description="every masked word written as [MASK] (no 10% random / 10% kept)",
           overrides={"train.mask_replace": [1.0, 0.0, 0.0]}),
    Switch(name="inside-labels",
           description="labels: argmax of the inside probability of the span, no prior (released "
                       "labeling())", overrides={"measure.label_rule": "inside"}),
    Switch(name="released-spans",
           description="spans: B over the first 4 words, C over the first 2 (released "
                       "labeling())", overrides={"measure.spans": "released"}),
    Switch(name="pre-ln",
           description="pre-LN encoder (academic-budget-bert --encoder_ln_mode pre-ln)"),
    Switch(name="linear-schedule",
           description="warmup over 13.3% of the steps, then linear decay to 0, at the scale's "
                       "lr (the released run's --lr_schedule step --curve linear)",
           overrides={"train.schedule": "linear", "train.warmup_steps": None,
                      "train.warmup_proportion": RELEASED_WARMUP_PROPORTION}),
    Switch(name="released-probe",
           description="probe as run_lp.py runs it: batch 512, 50 epochs, linear decay, no "
                       "clipping, raw states of positions 1..T (padding too), dropout 0.1 on "
                       "them, the encoder in train mode, a N(0, 0.02) head",
           overrides={f"measure.probe.{k}": v for k, v in RELEASED.items()}),
    Switch(name="deep-grammar",
           description="a deeper grammar: the scale's deep source (paper-like at GPU scale)"),
    Switch(name="second-grammar", kind=ROBUSTNESS,
           description="a second grammar of the scale's family (testbed: the search's "
                       "runner-up, q0-7): the robustness column"),
    Switch(name="soft-targets", kind=ABLATION,
           description="trained on the true conditionals, not the sampled word (train.targets="
                       "truth): Theorem 3.3's label noise removed, the rest of the algorithm "
                       "kept", overrides={"train.targets": "truth"}),
):
    register_switch(_switch)

# The released code's protocol = every switch but the ones that are not its choices.
BASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "paper": ("the paper's text (A.1, A.5, A.6, B.1): post-LN, one masked word per sentence, "
              "AdamW at a constant lr after warmup, span labels by parse depth, standardised "
              "probe (100 epochs, 5 seeds), Tr(F) from 50 sampled labels per input", ()),
    "paper-code": ("the released code: pre-LN, exactly max(1, round(0.15 (L + 2))) masked words "
                   "(at most 5), 13.3% warmup and linear decay at the scale's lr, inside labels "
                   "over 4 (B) / 2 (C) words, batch-512 probe for 50 epochs",
                   ("released-masking", "inside-labels", "released-spans", "pre-ln",
                    "linear-schedule", "released-probe")),
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
                             f"{', '.join(SWITCHES)} (add one with {SWITCHES.how_to_add})")
    return base, tuple(dict.fromkeys((*BASES[base][1], *extra)))


def switches_of(name: str) -> tuple[str, ...]:
    return parse_protocol(name)[1]


def protocol_overrides(name: str) -> dict:
    """The trial config overrides of protocol ``name``: ``PAPER``'s, then its base's
    (``BASE_SETTINGS``), then its switches', in order."""
    base, _ = parse_protocol(name)
    out: dict = {**PAPER, **BASE_SETTINGS[base]}
    for switch in switches_of(name):
        out.update(SWITCHES[switch].overrides)
    return out


def model_for(model: str, protocol: str) -> str:
    """``model`` as protocol ``protocol`` trains it (the pre-LN variant under ``pre-ln``)."""
    pre = ("pre-ln" in switches_of(protocol) and not model.endswith(PRE_LN_SUFFIX)
           and not model.startswith("lstm-"))  # the LSTM has no layer-norm placement
    return model + PRE_LN_SUFFIX if pre else model


def describe(name: str) -> str:
    """One line: the base's description and each added switch's."""
    base = parse_protocol(name)[0]
    return "; ".join([BASES[base][0], *(f"+ {SWITCHES[s].description}"
                                        for s in added_switches(name))])


def added_switches(name: str) -> list[str]:
    """The switches ``name`` adds to its base (``paper-code+mask-only``: mask-only)."""
    base, switches = parse_protocol(name)
    return [s for s in switches if s not in BASES[base][1]]


def diagnosis_protocols(base: str = "paper") -> list[str]:
    """``base`` with each switch alone (the diagnosis grid), the base itself first; not the
    robustness switches (another language is not a protocol difference) nor the ablations."""
    parse_protocol(base)
    return [base, *(f"{base}+{s}" for s in switches_of_kind(PROTOCOL)
                    if s not in switches_of(base))]


def is_robustness(name: str) -> bool:
    """``name`` is a base with robustness switches only (``paper+second-grammar``)."""
    added = added_switches(name)
    return bool(added) and all(SWITCHES[s].kind == ROBUSTNESS for s in added)


def is_ablation(name: str) -> bool:
    """``name`` adds an ablation switch to its base (``paper+soft-targets``)."""
    return any(SWITCHES[s].kind == ABLATION for s in added_switches(name))
