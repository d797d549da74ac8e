"""What a sweep's runs can conclude before any claim is read, said first (issue 42): whether
their losses are equal, how many seeds each grid point ran, whether the sweep's accuracy has
room to move (the ceiling, the floor); and the command that would conclude.

A direction is read from a difference only when it is at least ``DIRECTION_SE`` (2) standard
errors from 0 *and* the compared arms are at equal loss: their KLs within ``DIRECTION_SE``
s.e. of each other (for the steps sweep: the KL did not move over the plateau). A difference of
1 s.e. is what two draws of the same model give one time in three.

The ceiling is ``analysis.room``'s: a group whose mean accuracy is within ``BOUND_SE`` s.e. of
100% (the s.e. floored at the binomial's, so a perfect score is not exact), or whose room above
it is less than twice the paper's effect for the sweep's lead claim.

>>> equal_loss(0.034, 0.001, 0.045, 0.001)
False
>>> equal_loss(0.034, 0.004, 0.040, 0.004)
True
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

import pandas as pd

from analysis.paper_claims import CLAIMS
from analysis.room import BOUND_SE, ROOM_FACTOR, accuracy_se
from flatlm.experiments.costs import experiment_minutes
from flatlm.experiments.paper import build
from flatlm.experiments.scales import SCALES
from flatlm.measure import KL, se_key

DIRECTION_SE = 2.0  # a direction needs |effect| >= this many s.e. and equal loss
CAN, CANNOT = "What this sweep can conclude:", "What this sweep cannot conclude:"
REACH_OPENINGS = (CAN, CANNOT)  # how the opening paragraph starts (the summary finds it)

# The lead accuracy claim of each sweep kind, as (experiment, figure) of analysis.paper_claims,
# whose effect sets the room it needs: Fig. 3a +6.9 points (sizes); the steps claim's only
# number, Fig. 4 left's +1.6 (SGD; Fig. 2a says "rises"); Table 1's adversary -6.9.
LEAD_CLAIM = {"sizes": ("sizes", "Fig. 3a (2.3)"), "steps": ("sgd", "Fig. 4 left (4, B.2)"),
              "algorithms": ("algorithms", "Table 1 (2.3)")}


def lead_effect(kind: str, task: str | None = None) -> tuple[float, str] | None:
    """(the paper's effect, accuracy signed, and the task it is on) of ``kind``'s lead claim:
    its row on ``task`` where the paper gives that task a size (Table 1's adversary: A -6.8),
    else the lead's own (Fig. 3a's +6.9 is task B's: the words name it); None for another
    kind."""
    if kind not in LEAD_CLAIM:
        return None
    experiment, figure = LEAD_CLAIM[kind]
    sized = [c for c in CLAIMS  # signed: "worse" claims are negative
             if (c.experiment, c.figure) == (experiment, figure)
             and c.effect_size is not None and not c.relative
             and "lookup" not in (c.compare or ())]
    on_task = [c for c in sized if claim_task(c) == task]
    lead = (on_task or sized)[0]
    return lead.effect_size, claim_task(lead)


def claim_task(claim) -> str:
    """The task of an accuracy claim's metric: ``probe/B/acc_mean`` -> ``B``."""
    return claim.metric.split("/")[1] if "/" in claim.metric else claim.metric.split(":")[-1]

# The command that reads the kind's claims with seeds at matched loss, where the tasks leave
# room (testbed v2: the first testbed's saturated tasks read 97.5-100%), and the note on it.
REPLICATE_SCALE = "testbed-v2"
REPLICATE = {kind: ["flatlm", "replicate", "--scale", REPLICATE_SCALE, "--experiment", kind,
                    "--protocol", "paper", "--out", "repl-v2/"]
             for kind in ("sizes", "steps", "algorithms")}
TESTBED_ROOM = ("testbed v2 reads the paper's claims at matched loss, KL 0.7, below saturation: "
                "on the first testbed, saturated, the tasks read 97.5-100% "
                "(bench/results/replication_testbed/room/replication.md), so the claims that "
                "need room there read 'inconclusive (ceiling)'; saturation with room needs a "
                "GPU (--scale gpu, docs/replication.md)")


def gap_is_equal_loss(gap: float, gap_se: float) -> bool:
    """The one rule for "equal loss" (the conclusion, the tables, the summary): two KLs whose
    gap is within ``DIRECTION_SE`` s.e. of it; an unknown s.e. is not equal loss."""
    return bool(math.isfinite(gap_se) and abs(gap) <= DIRECTION_SE * gap_se)  # not numpy's bool


def equal_loss(kl_a: float, se_a: float, kl_b: float, se_b: float) -> bool:
    """The two KLs at equal loss (``gap_is_equal_loss``); one arm's unknown s.e. counts as 0
    (a single run's KL without its s.e.: the other's carries the gap)."""
    se = math.hypot(*(s if math.isfinite(s) else 0.0 for s in (se_a, se_b)))
    return gap_is_equal_loss(kl_a - kl_b, se)


def groups_at_equal_loss(groups: pd.DataFrame, a: str, b: str) -> bool | None:
    """Whether groups ``a`` and ``b`` (``effects.group_means`` rows) are at equal loss; None
    where the groups have no KL."""
    if KL not in groups or a not in groups.index or b not in groups.index:
        return None
    se = se_key(KL)
    ses = [float(groups.loc[g, se]) if se in groups else math.nan for g in (a, b)]
    return equal_loss(float(groups.loc[a, KL]), ses[0], float(groups.loc[b, KL]), ses[1])


@dataclass(frozen=True)
class Bound:
    """Where the sweep's accuracy sits against its bounds: ``ceiling``, ``floor`` or "", and
    what decided it in words."""

    kind: str
    words: str


def accuracy_bound(final: pd.DataFrame, df: pd.DataFrame, acc_key: str, sweep_kind: str
                   ) -> Bound:
    """The sweep's accuracy at its final checkpoints (``final``: group means) against 100%
    and the majority share, and the room its lead claim needs (``lead_effect``)."""
    if final.empty or acc_key not in final:
        return Bound("", "")
    stem = acc_key.removesuffix("acc_mean")
    n_test = _column_mean(df, stem + "n_test")
    majority = _column_mean(df, stem + "majority_acc")
    acc = final[acc_key].astype(float)
    se = accuracy_se(acc, final.get(se_key(acc_key), math.nan), n_test)
    at_top = acc[1 - acc <= BOUND_SE * se]
    low, high = f"{acc.min():.3f}", f"{acc.max():.3f}"
    span = low if low == high else f"{low}-{high}"
    if len(at_top):
        return Bound("ceiling", f"{span}, {len(at_top)} of {len(acc)} within {BOUND_SE:g} "
                                f"s.e. of 100%")
    lead = lead_effect(sweep_kind, acc_key.split("/")[1] if "/" in acc_key else None)
    if lead is None:
        return Bound("", "")
    effect, task = lead
    other = "" if f"/{task}/" in acc_key else f" (its task {task}; the paper gives this one none)"
    room = 1 - acc.iloc[0] if effect > 0 else acc.iloc[0] - majority
    if math.isfinite(room) and room < ROOM_FACTOR * abs(effect):
        where = "above" if effect > 0 else "above the majority share for"
        return Bound("ceiling" if effect > 0 else "floor",
                     f"{span}: {100 * room:.1f} points of room {where} {acc.index[0]}, less "
                     f"than {ROOM_FACTOR:g} x the paper's {100 * abs(effect):.1f}{other}")
    return Bound("", "")


def _column_mean(df: pd.DataFrame, column: str) -> float:
    return float(df[column].mean()) if column in df and df[column].notna().any() else math.nan


def reach_words(*, equal: bool | None, loss_words: str, seeds: int | None, what: str | None,
                bound: Bound, task: str, kind: str, measured: bool = True) -> str:
    """The opening paragraph: what the runs can conclude, what they cannot, and what would.
    ``seeds``: the fewest runs of a grid point (``what``: its field's name; None: the runs
    are seeds of one setting). ``equal``: None when nothing could be compared at matched loss;
    ``measured``: whether the task's accuracy was measured at all."""
    cannot = []
    if not measured:
        cannot.append(f"task {task}'s accuracy was not measured (measure.what has no probe)")
    elif equal is None:
        cannot.append("no run has two checkpoints in the regime" if kind == "steps" else
                      "no two settings have checkpoints in the regime to compare at matched "
                      "loss")
    if equal is False:
        cannot.append(f"the losses are not equal ({loss_words})")
    if seeds is not None and seeds < 2:
        cannot.append(f"each {what} ran once, so a difference is one seed's draw" if what
                      else "one run, so a change is one seed's draw")
    if bound.kind:
        cannot.append(f"task {task} sits at the {bound.kind} ({bound.words})")
    if not cannot:
        seen = f"{seeds} runs per {what or 'setting'}, " if seeds else ""
        return (f"{CAN} {seen}at equal loss and with room on task "
                f"{task}, the directions below are read at {DIRECTION_SE:g} s.e.")
    words = (f"{CANNOT} " + "; ".join(cannot) + ". So it reads no "
             "direction where these apply: the numbers below describe these runs, not the "
             "paper's claims.")
    command = REPLICATE.get(kind)
    if command:
        words += (f" What would: seeds read at matched loss, e.g. `{shlex.join(command)}` "
                  f"({replication_cost(kind)}); {TESTBED_ROOM}.")
    return words


def replication_cost(kind: str) -> str:
    """The trials and estimated CPU time of ``REPLICATE[kind]`` (``flatlm.experiments.costs``,
    what its ``--dry-run`` prints)."""
    trials = build(kind, scale=REPLICATE_SCALE, protocol="paper",  # seeded as flatlm replicate
                   seeds=SCALES[REPLICATE_SCALE].seeds_of(kind)).trials()
    minutes, how, unknown = experiment_minutes(trials)
    if unknown:
        return f"{len(trials)} trials; its --dry-run lists them"
    return (f"{len(trials)} trials, about {minutes:.0f} CPU-minutes ({how}): "
            f"{minutes / 2:.0f} min on 2 cores with --jobs 2")
