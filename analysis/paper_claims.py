"""The paper's claims, defined once: each with where the paper says it, its setting and the
effect it reports in our units. Two readers: the replication report (``analysis/claims.py``
computes each claim's effect and states the verdict rule) and a sweep's conclusion
(``analysis/conclusion.py`` reads the claims marked ``in_sweeps`` on the sweep's own task)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flatlm.measure import TRACE_FISHER, TRACE_FISHER_GROWN, probe_keys

# What a claim's effect compares (``analysis.claims.EFFECTS`` computes each; ``analysis.matched``
# reads each at matched loss): one arm's saturation window, last minus first checkpoint (after
# the loss converges); the largest minus the smallest model of a sizes grid; two named arms
# (``compare``: treatment, control).
WINDOW_EFFECT, SIZES_EFFECT, ARMS_EFFECT = "window", "sizes", "arms"
EFFECT_KINDS = (WINDOW_EFFECT, SIZES_EFFECT, ARMS_EFFECT)


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, where it says it, and the effect it reports."""

    experiment: str  # the trials it is read from
    figure: str  # the paper's figure/table and section
    statement: str
    metric: str  # the column whose difference is the effect
    sign: int  # +1: the paper says it goes up; -1: down
    paper: str  # the paper's number, as it reports it
    setting: str  # the paper's data, model, optimiser and task for this claim
    effect_size: float | None = None  # the paper's effect in our units; None: a direction only
    relative: bool = False  # the effect is treatment / control - 1 (traces), else a difference
    compare: tuple[str, str] | None = None  # algorithms: (treatment, control)
    analogue: str = ""  # what the paper tested instead, when our test is an analogue of it
    origin: str = field(default="", compare=False)  # how effect_size was read from the paper
    in_sweeps: bool = False  # a sweep's conclusion reads it (an accuracy claim on the sweep's
    #   own task, so one row per statement: the others repeat it on another task)
    effect: str = ARMS_EFFECT  # what the effect compares: one of EFFECT_KINDS

    def __post_init__(self):
        if self.effect not in EFFECT_KINDS:
            raise ValueError(f"claim {self.statement!r}: effect={self.effect!r}; use one of "
                             f"{', '.join(EFFECT_KINDS)}")
        if (self.effect == ARMS_EFFECT) != (self.compare is not None):
            raise ValueError(f"claim {self.statement!r}: effect={self.effect!r} with compare="
                             f"{self.compare!r}; an {ARMS_EFFECT!r} effect names "
                             "(treatment, control) in compare, the others none")

    @property
    def where(self) -> str:
        """The figure or table without its sections: ``Fig. 4 left``."""
        return self.figure.split(" (")[0]


def acc(task: str) -> str:
    return probe_keys(task)[0]


def lookup(task: str) -> str:
    return f"lookup/{task}/acc_mean"


# The paper does not name Fig. 5's task. Its range, 40.4 -> 50.5%, is task B's: Table 1 has
# AdamW's 235M model at 49.2 on B and the lookup table at 39.7, "worse than all other models in
# Figure 3(a) on task B", while Table 2 has the same model at 55.7 on task C, above the whole
# range; and B.3 says Fig. 5 follows Section 2's setting, whose sizes figure (3a) is task B.
FIG5_TASK = "B"
PCFG_235M = "PCFG, 235M transformer, 4096 batch"
BOOKCORPUS = "BookCorpus, 330M transformer, GLUE fine-tuning (QNLI, SST-2, RTE)"
GLUE_ANALOGUE = "BookCorpus/GLUE claim, tested here on the PCFG task B probe"
GROWN_HEAD_NORM = TRACE_FISHER_GROWN + "_head_norm"  # measure.growth_compare=["head-norm"]

CLAIMS: tuple[Claim, ...] = (
    Claim("steps", "Fig. 2a (2.3)", "after the loss converges, accuracy keeps rising",
          acc("C"), +1, "rises", "PCFG, 41M, AdamW at a constant lr after warmup (A.5), task C",
          in_sweeps=True, effect=WINDOW_EFFECT),
    Claim("sgd", "Fig. 4 left (4, B.2)", "under SGD, accuracy rises after the loss converges",
          acc("C"), +1, "+1.6 pts", "PCFG, 235M, SGD (B.2: 12% warmup, then 1e-3), task C",
          0.016, origin="4: 'the downstream performance improves by 1.6%' (PCFG)",
          effect=WINDOW_EFFECT),
    Claim("sgd", "Fig. 4 left (4, B.2)", "under SGD, Tr(H) falls after the loss converges",
          TRACE_FISHER, -1, "falls", "PCFG, 235M, SGD (B.2)", relative=True, in_sweeps=True,
          effect=WINDOW_EFFECT),
    Claim("sgd", "Fig. 10 (B.2)", "... and accuracy rises on task B", acc("B"), +1, "rises",
          "PCFG, SGD (B.2), task B", effect=WINDOW_EFFECT),
    Claim("sgd", "Fig. 10 (B.2)", "... and on task A", acc("A"), +1, "rises",
          "PCFG, SGD (B.2), task A", effect=WINDOW_EFFECT),
    Claim("sizes", "Fig. 3a (2.3)", "a larger model probes better at the same loss", acc("B"),
          +1, "+6.9 pts", "PCFG, Table 3 transformers in the saturation regime, AdamW, task B",
          0.069, origin="2.3: 'scaling up the models improves linear probe performance by 6.9%'",
          in_sweeps=True, effect=SIZES_EFFECT),
    Claim("sizes", "Fig. 8 (A.6)", "... and on task A", acc("A"), +1, "rises",
          "PCFG, Table 3 transformers in the saturation regime, AdamW, task A",
          effect=SIZES_EFFECT),
    Claim("sizes", "Fig. 5 (4, B.3)", "a larger model is flatter, grown to one shape",
          TRACE_FISHER_GROWN, -1, "19.8 -> 12.6 (-36%)",
          "PCFG, models > 9M grown into Table 4's shape (B.4), AdamW", 12.6 / 19.8 - 1,
          relative=True, origin="4: 'decreases from 19.8 to 12.6'", in_sweeps=True,
          effect=SIZES_EFFECT),
    # The verdict depends on the growth construction (both preserve the function, not the
    # trace): the row above uses B.4.2's (embeddings halved), this one flatlm's head-norm.
    Claim("sizes", "Fig. 5 (4, B.3)", "... the same, grown by flatlm's head-norm construction",
          GROWN_HEAD_NORM, -1, "19.8 -> 12.6 (-36%)",
          "PCFG, models > 9M grown into Table 4's shape (B.4), AdamW; grown here by flatlm's "
          "construction, not B.4.2's (embeddings kept, the MLM head's LayerNorm divided by m)",
          12.6 / 19.8 - 1, relative=True, origin="4: 'decreases from 19.8 to 12.6'",
          effect=SIZES_EFFECT),
    Claim("sizes", "Fig. 5 (4, B.3)", f"... while its probe accuracy rises (task {FIG5_TASK})",
          acc(FIG5_TASK), +1, "40.4 -> 50.5%",
          "PCFG, the same models; the task is not named (task B by its range, see FIG5_TASK)",
          0.101, origin="4: 'increase of linear probe accuracy from 40.4% to 50.5%'",
          effect=SIZES_EFFECT),
    Claim("algorithms", "Table 1 (2.3)", "adversarial pre-training probes worse than AdamW",
          acc("B"), -1, "42.3 vs 49.2", f"{PCFG_235M}, task B", -0.069,
          compare=("adversarial", "adamw"), in_sweeps=True),
    Claim("algorithms", "Table 1 (2.3)", "... on task A", acc("A"), -1, "83.1 vs 89.9",
          f"{PCFG_235M}, task A", -0.068, compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 2 (4)", "... on task C", acc("C"), -1, "50.2 vs 55.7",
          f"{PCFG_235M}, task C", -0.055, compare=("adversarial", "adamw")),
    Claim("algorithms", "Table 2 (4)", "adversarial pre-training is sharper", TRACE_FISHER, +1,
          "19.34 vs 8.01 (2.4x)", PCFG_235M, 19.34 / 8.01 - 1, relative=True,
          compare=("adversarial", "adamw"), in_sweeps=True),
    Claim("algorithms", "Table 1 (2.3)", "the lookup table probes worse than AdamW", "lookup:B",
          -1, "39.7 vs 49.2", f"{PCFG_235M}, task B", -0.095, compare=("lookup", "adamw"),
          in_sweeps=True),
    Claim("algorithms", "Table 1 (2.3)", "... and on task A", "lookup:A", -1, "71.2 vs 89.9",
          f"{PCFG_235M}, task A", -0.187, compare=("lookup", "adamw")),
    Claim("algorithms", "Tables 1/2 (2.3, 4)", "no dropout / weight decay probes worse",
          acc("B"), -1, "QNLI -1.4, SST-2 -1.3, RTE -2.7 pts", BOOKCORPUS, -0.013,
          compare=("noreg", "adamw"), analogue=GLUE_ANALOGUE,
          origin="the smallest of the three GLUE differences", in_sweeps=True),
    Claim("algorithms", "Table 2 (4)", "no dropout / weight decay is sharper", TRACE_FISHER, +1,
          "34.91 vs 24.55 (+42%)", BOOKCORPUS, 34.91 / 24.55 - 1, relative=True,
          compare=("noreg", "adamw"), analogue="BookCorpus claim, tested here on PCFG",
          in_sweeps=True),
    Claim("algorithms", "Tables 1/2 (2.3, 4)", "SAM recovers the accuracy noreg loses",
          acc("B"), +1, "QNLI +1.4, SST-2 +0.6, RTE +2.3 pts", BOOKCORPUS, 0.006,
          compare=("sam", "noreg"), analogue=GLUE_ANALOGUE,
          origin="the smallest of the three GLUE differences", in_sweeps=True),
    Claim("algorithms", "Table 2 (4)", "SAM is flatter than noreg", TRACE_FISHER, -1,
          "22.15 vs 34.91 (-37%)", BOOKCORPUS, 22.15 / 34.91 - 1, relative=True,
          compare=("sam", "noreg"), analogue="BookCorpus claim, tested here on PCFG",
          in_sweeps=True),
)

# The kind of design (``analysis.effects.design``) a sweep of each experiment shows: the sgd
# experiment's runs vary along steps, as the steps experiment's do.
SWEEP_KIND = {"steps": "steps", "sgd": "steps", "sizes": "sizes", "algorithms": "algorithms"}


def sweep_claims(kind: str) -> tuple[Claim, ...]:
    """The claims a sweep of design ``kind`` bears on, as its conclusion reads them: one row per
    statement (``in_sweeps``), an accuracy claim on the sweep's own task."""
    return tuple(c for c in CLAIMS if c.in_sweeps and SWEEP_KIND.get(c.experiment) == kind)


# B.2: SGD after 12% warmup at a constant 1e-3 (GPU scale). A CPU scale may run SGD at another
# rate (flatlm.experiments.scales.Scale.sgd_lr: the testbed's 0.3, since 1e-3 does not leave the
# initialisation in a CPU-sized run); the report names that deviation beside the claim.
PAPER_SGD_LR = 1e-3


def deviation(claim: Claim, lrs) -> str:
    """How the runs of ``claim`` depart from the paper's setting, "" when they do not: an SGD
    claim whose runs' rates ``lrs`` are not B.2's."""
    rates = sorted({float(x) for x in lrs})
    if claim.experiment != "sgd" or not rates or rates == [PAPER_SGD_LR]:
        return ""
    return (f"SGD at a constant {', '.join(f'{r:g}' for r in rates)} after warmup, not B.2's "
            f"{PAPER_SGD_LR:g} (the scale's sgd_lr)")

