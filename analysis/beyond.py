"""Beyond the paper, where only exact truth can answer (issue 54): Muon against AdamW, and the
paper's mechanism ablated (AdamW on the true conditionals, ``paper+soft-targets``), each at
matched loss by the same verdict rule as the paper's claims (``analysis/claims.py``,
``analysis/matched.py``).

The claims are stated before any run is read, each with where it comes from and its direction:

- **Muon** (Ruan et al. 2026, "Muon learns more robust and transferable features than Adam"):
  at the same loss, Muon's features probe better. If they do, the paper's thesis (flatness
  explains what the loss does not) predicts Muon is also flatter: Tr(F) and Tr(H) lower.
- **SGD** (Keskar et al. 2017, Wilson et al. 2017: adaptive methods settle in sharper minima than
  SGD and generalise worse): at the same loss, SGD is flatter than AdamW, and by the paper's
  thesis its features then probe better. Its arm is the sgd experiment's run (the algorithms
  model at the scale's SGD rate, checkpointed along the way), read at the same target.
- **Soft targets** (Theorem 3.3: the drift toward flat minima comes from the label noise of the
  MLM gradient, whose covariance equals the Hessian at the minimum): trained on Pr(. | x_{-t})
  instead of the sampled word, that noise is gone, so at the same loss the model is sharper
  (Tr(F), Tr(H) higher) and probes no better (the direction read is "worse").

Neither source gives an effect in our units: every row is a direction only, so its confound
bound is judged against a quarter of our own mean effect or of the interval's half-width before
the bound (seeds and measurement error), whichever is larger (``analysis/matched.py``). Holm's
family is this table alone: these are not the paper's claims and do not enter its family.

An arm is an algorithm of the base protocol's algorithms experiment (``muon``, ``adamw``), the
sgd experiment's run (``sgd``: same model, its own rate and checkpoints), or an
algorithm trained under an ablation switch, named ``<algorithm>+<switch>`` (``adamw+soft-targets``)
when its trials are put beside the base's (``arms_frame``).

>>> rows = pd.DataFrame({"protocol": ["paper", "paper+soft-targets", "paper-code"],
...     "experiment": "algorithms", "train.algorithm": "adamw"})
>>> arms_frame(rows, "paper")["train.algorithm"].tolist()
['adamw', 'adamw+soft-targets']
"""

from __future__ import annotations

import pandas as pd

from analysis.claims import DEFAULT_RULE, VerdictRule, claim_rows, with_holm
from analysis.paper_claims import Claim, acc
from flatlm.experiments.protocols import added_switches, is_ablation, parse_protocol
from flatlm.measure import TRACE_FISHER, TRACE_HESSIAN

ALGORITHM = "train.algorithm"
SOFT = "adamw+soft-targets"
V2_SETTING = "the testbed's v2 PCFG, d64-h4-l2-i256, the paper protocol, read at the target KL"
MUON = "Muon (Ruan et al. 2026)"
MUON_SRC = "Ruan et al. 2026: Muon's features are more robust and transferable than Adam's"
THESIS = "the paper's thesis, given Muon transfers better: flatter"
SGD = "SGD vs Adam (Keskar et al. 2017; Wilson et al. 2017)"
SGD_SRC = ("Keskar et al. 2017, Wilson et al. 2017: adaptive methods find sharper minima than SGD "
           "and generalise worse")
SGD_THESIS = "the paper's thesis, given SGD is flatter: better probes"
THEOREM = "Theorem 3.3 (3)"
THEOREM_SRC = "Theorem 3.3: SGD's label noise drives the model to flat minima; without it, sharper"

BEYOND_CLAIMS: tuple[Claim, ...] = (
    Claim("algorithms", MUON, "Muon probes better than AdamW at the same loss", acc("B"), +1,
          "more transferable features", V2_SETTING + ", task B", compare=("muon", "adamw"),
          origin=MUON_SRC),
    Claim("algorithms", MUON, "... on task A", acc("A"), +1, "more transferable features",
          V2_SETTING + ", task A", compare=("muon", "adamw"), origin=MUON_SRC),
    Claim("algorithms", MUON, "Muon is flatter than AdamW (Tr F)", TRACE_FISHER, -1, THESIS,
          V2_SETTING, relative=True, compare=("muon", "adamw"), origin=THESIS),
    Claim("algorithms", MUON, "Muon is flatter than AdamW (Tr H)", TRACE_HESSIAN, -1, THESIS,
          V2_SETTING, relative=True, compare=("muon", "adamw"), origin=THESIS),
    Claim("algorithms", SGD, "SGD is flatter than AdamW at the same loss (Tr F)", TRACE_FISHER,
          -1, "adaptive methods find sharper minima", V2_SETTING, relative=True,
          compare=("sgd", "adamw"), origin=SGD_SRC),
    Claim("algorithms", SGD, "SGD is flatter than AdamW at the same loss (Tr H)", TRACE_HESSIAN,
          -1, "adaptive methods find sharper minima", V2_SETTING, relative=True,
          compare=("sgd", "adamw"), origin=SGD_SRC),
    Claim("algorithms", SGD, "SGD probes better than AdamW at the same loss (task B)", acc("B"),
          +1, SGD_THESIS, V2_SETTING + ", task B", compare=("sgd", "adamw"), origin=SGD_THESIS),
    Claim("algorithms", THEOREM, "soft targets are sharper than sampled words (Tr F)",
          TRACE_FISHER, +1, "no label noise: no drift to flat minima", V2_SETTING,
          relative=True, compare=(SOFT, "adamw"), origin=THEOREM_SRC),
    Claim("algorithms", THEOREM, "soft targets are sharper than sampled words (Tr H)",
          TRACE_HESSIAN, +1, "no label noise: no drift to flat minima", V2_SETTING,
          relative=True, compare=(SOFT, "adamw"), origin=THEOREM_SRC),
    Claim("algorithms", THEOREM, "... and probe no better (task B)", acc("B"), -1,
          "the implicit bias is what the probe gains from", V2_SETTING + ", task B",
          compare=(SOFT, "adamw"), origin=THEOREM_SRC),
    Claim("algorithms", THEOREM, "... and on task A", acc("A"), -1,
          "the implicit bias is what the probe gains from", V2_SETTING + ", task A",
          compare=(SOFT, "adamw"), origin=THEOREM_SRC),
)


def arms_frame(df: pd.DataFrame, base: str = "paper") -> pd.DataFrame:
    """The algorithms experiment's checkpoints of protocol ``base`` and of ``base`` with one
    ablation switch, as one protocol: an ablated trial's algorithm becomes
    ``<algorithm>+<switch>``, so that each arm is one value of ``train.algorithm``."""
    # the sgd experiment's run is the sgd arm: the algorithms experiment's model, read at the
    # same target (its checkpoints span the run; the rule interpolates between two of them)
    sgd_runs = (df["experiment"] == "sgd") & (df.get(ALGORITHM) == "sgd")
    part = df[(df["experiment"] == "algorithms") | sgd_runs].copy()
    part.loc[part["experiment"] == "sgd", "experiment"] = "algorithms"
    keep = [p for p in part["protocol"].dropna().unique()
            if p == base or (is_ablation(p) and parse_protocol(p)[0] == base
                             and len(added_switches(p)) == 1)]
    part = part[part["protocol"].isin(keep)].copy()
    ablated = part["protocol"] != base
    suffix = part.loc[ablated, "protocol"].map(lambda p: "+" + added_switches(p)[0])
    part.loc[ablated, ALGORITHM] = part.loc[ablated, ALGORITHM] + suffix
    # an ablated trial's run_id already differs (its protocol is its first path part)
    return part.assign(protocol=base)


def beyond_rows(df: pd.DataFrame, rule: VerdictRule = DEFAULT_RULE,
                base: str = "paper") -> pd.DataFrame:
    """One row per claim of ``BEYOND_CLAIMS`` whose arms have trials, by the report's rule,
    with Holm over these rows alone (empty when no compared arm has run, or when the rule reads
    no target KL: the arms are checkpointed around the matched-loss target, and the first
    testbed's saturated report, which has an sgd run but no target, stays as it was)."""
    if rule.target_kl is None:
        return pd.DataFrame()
    rows = claim_rows(arms_frame(df, base), rule, claims=BEYOND_CLAIMS)
    return rows if rows.empty else with_holm(rows, rule.level)
