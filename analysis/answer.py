"""flatlm's committed answer, for a sweep to lead its ending with: the verdicts of the committed
testbed-v2 replication (``bench/results/replication_testbed_v2/room/claims.csv``, read at
matched loss: ``analysis/matched.py``) on the claims a sweep of one design bears on, where they
come from, and the command that reproduces them. A sweep of one seed reads no verdict of its
own (the rule needs 3 seeds at matched loss), so what it adds is said beside, not mixed in.

>>> lines = answer_lines("sizes", claims=pd.DataFrame({"experiment": ["sizes"],
...     "figure": ["Fig. 3a"], "claim": ["larger"], "metric": ["probe/B/acc_mean"],
...     "effect_unit": ["difference"], "effect": [0.02], "ci_low": [0.01], "ci_high": [0.03],
...     "n": [3], "regime": ["matched loss"], "verdict": ["reproduces"],
...     "verdict_holm": ["reproduces"], "target_kl": [0.7]}))
>>> print(lines[1])
  Fig. 3a larger (probe/B/acc_mean): +2.00 pts [+1.00, +3.00] (n=3, matched loss): reproduces
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "bench" / "results" / "replication_testbed_v2"
REPRODUCE = {
    "sizes": "flatlm replicate --scale testbed-v2 --protocol paper --experiment sizes --jobs 2 "
             "--out repl-v2/",
    "steps": "flatlm replicate --scale testbed-v2 --protocol paper --experiment steps --jobs 2 "
             "--out repl-v2/",
    "algorithms": "flatlm replicate --scale testbed-v2 --protocol paper --experiment "
                  "algorithms --jobs 2 --out repl-v2/",
}
REPORT = "python bench/replication_testbed_v2.py --trials repl-v2/"
EXPERIMENTS = {"sizes": ("sizes",), "steps": ("steps", "sgd"), "algorithms": ("algorithms",)}


def committed_claims(path: Path = COMMITTED / "room" / "claims.csv") -> pd.DataFrame | None:
    """The committed v2 claims table (the ``paper`` protocol's rows), None where not committed."""
    if not path.exists():
        return None
    claims = pd.read_csv(path)
    return claims[claims.get("protocol", "paper") == "paper"] if "protocol" in claims \
        else claims


def answer_lines(design: str, claims: pd.DataFrame | None = None) -> list[str]:
    """What the committed answer says about a sweep of ``design`` (sizes, steps, algorithms):
    a heading, one line per claim, the command that reproduces it; [] where none is
    committed."""
    claims = committed_claims() if claims is None else claims
    if claims is None or design not in EXPERIMENTS:
        return []
    rows = claims[claims["experiment"].isin(EXPERIMENTS[design])]
    if rows.empty:
        return []
    target = rows["target_kl"].dropna().iloc[0] if "target_kl" in rows else np.nan
    head = (f"flatlm's committed answer ({_relative(COMMITTED)}/, testbed v2, the paper "
            f"protocol, read at matched loss, KL {target:g} nats/token):")
    lines = [head, *(_line(r) for r in rows.itertuples())]
    if design in REPRODUCE:
        lines.append(f"  Reproduce: {REPRODUCE[design]} && {REPORT}")
    return lines


def _line(r) -> str:
    unit = "pts" if r.effect_unit == "difference" else "%"
    scale = 100.0
    effect = (f"{scale * r.effect:+.2f} {unit} [{scale * r.ci_low:+.2f}, {scale * r.ci_high:+.2f}]"
              if np.isfinite(r.ci_low) else "no interval")
    holm = getattr(r, "verdict_holm", r.verdict)
    holm = f" (Holm: {holm})" if isinstance(holm, str) and holm != r.verdict else ""
    regime = getattr(r, "regime", "")
    return (f"  {r.figure} {r.claim} ({r.metric}): {effect} (n={r.n}"
            f"{', ' + regime if isinstance(regime, str) and regime else ''}): {r.verdict}{holm}")


def _relative(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)
