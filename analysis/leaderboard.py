"""The head-to-head of measures (issue 25): among masked LMs at the same pre-training loss, which
measure predicts downstream probe accuracy?

    python analysis/leaderboard.py --trials DIR --out DIR [--kl-threshold 0.02] [--kl-from LOW]
        [--tasks A,B,C] [--n-boot 2000] [--seed 0] [--measures K1,K2] [--wall-min M]
        [--hardware TEXT]

**Candidates** of a (measure, task): the checkpoints in the saturated window
(``analysis.correlate.saturated``: ``pretrain/kl`` below ``--kl-threshold``) whose probe accuracy
``probe/<task>/acc_mean``, loss and measure are all finite. With ``--kl-from LOW`` the window is
a *matched* one instead, ``LOW <= pretrain/kl < --kl-threshold``: a band around a common target
below saturation (testbed v2's 0.7), where the runs' losses are matched rather than saturated.
A measure is read as a selector: its lowest value is picked (flatter, lower LLC, less
noise-sensitive), except the CKA with the truth (``cka/*``: higher = more truth-like), which
enters with its sign flipped.

**Groups**, reported apart: ``one shape``, the runs of the shape most runs in the window have,
with every measure; ``all sizes``, every run, with only the measures comparable across shapes
(their ``Quantity`` in ``flatlm.measure.registry`` says ``shape_free``: the loss, the ``_grown``
twins, the noise, the CKA, the LLC, the critical sharpness; the others are in different
parameterisations). Which keys compete, their names and timing are the registered measurements'
``quantities``: a plug-in measurement that declares one with ``leaderboard=True`` is ranked too.

**Statistics** per (group, task, measure), each with a 95% cluster-bootstrap interval over runs
(``analysis.selection.cluster_weights``; the same resamples for every measure of a group):
``partial_spearman`` of -measure with the accuracy given the loss (ranks, residualised on the
loss's ranks with intercept, Pearson; the loss's own is 0 by construction), ``spearman``,
``kendall`` (tau-b), ``regret`` (best candidate's accuracy minus the picked one's),
``gain_vs_loss`` (the loss's regret minus the measure's, on the same candidates),
``random_regret`` (a random pick's expected regret) and ``gain_vs_random``. A measure is
*indistinguishable from the loss* on a task when the intervals of its partial Spearman and of
its gain both contain 0.

**Cost** per measure: the mean over checkpoints of its measurement's ``time/<name>_s`` over the
time of one training step there (``time/train_s`` / the steps since the previous checkpoint).

Writes ``leaderboard.md`` / ``leaderboard.csv`` / ``leaderboard.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.correlate import RUN, saturated, saturation_rule
from analysis.labels import plain_name
from analysis.same_training import MODEL, merge_same_training
from analysis.selection import (
    RANDOM,
    cluster_weights,
    selection_stats,
    weighted_pearson,
    weighted_ranks,
)
from analysis.trials import load_trials
from flatlm.core.flags import COUNT, POSITIVE, SEED
from flatlm.measure import (
    KL,
    LOSS,
    RANDOM_INIT,
    SATURATED_KL,
    probe_key,
)
from flatlm.measure.registry import quantities, quantity_of

KL_THRESHOLD = SATURATED_KL  # the window: the saturation regime (flatlm.measure)
TASKS = ("A", "B", "C")
LEVEL = 0.95
FEW_RUNS = 30  # fewer runs in a group's window: the md says the intervals rest on few clusters
ONE_SHAPE, ALL_SIZES = "one shape", "all sizes"
STATISTICS = ("partial_spearman", "spearman", "kendall", "regret", "gain_vs_loss",
              "random_regret", "gain_vs_random")
COLUMNS = ("group", "task", "measure", "statistic", "value", "ci_low", "ci_high")
PROBE_COST = "probe (the accuracy itself)"
WHY_SHAPE_FREE = (
    "Tr(F), Tr(H), lambda_max, the adaptive and preconditioned sharpness of models of different "
    "shapes are taken in different parameterisations (more and differently scaled directions), "
    "so their values are not comparable: the paper grows every model into one shape before "
    "comparing Tr(H) (App. B.4, Table 4), and so do the `_grown` keys here. Comparable as they "
    "are: the loss and the noise sensitivity (nats), the CKA with the truth (features, not "
    "weights), the LLC (an effective parameter count: invariant to reparameterisation in "
    "theory, not as SGLD estimates it, see the invariance section) and the critical sharpness "
    "(2 / the learning rate at which the next update raises the loss).")
INVARIANCE_FILE = Path(__file__).resolve().parents[1] / "bench" / "results" / "invariance.json"
RESCALINGS = ("query-key", "value-output", "layer-norm")  # a post-LN BERT's function-keeping
#   rescalings (flatlm.models.reparameterise); growth is another comparison (the _grown keys)


# -- which measures ------------------------------------------------------------------------

def measure_keys(columns) -> list[str]:
    """The measures present in ``columns``: the keys of the registered measurements' leaderboard
    quantities (``flatlm.measure.registry.Quantity``), in the order they run, then each family's
    (the grown twins, the noise scales, the CKA levels; no ``_se``, no reference rows), a
    family's keys ordered by the number they end in where they all do (the noise scales), else
    as in ``columns``."""
    # a random-init twin is a reference row, one value per trial, not a property of the checkpoint
    columns = [c for c in columns if not c.endswith(("_se", RANDOM_INIT))]
    selectors = [q for _, q in quantities() if q.leaderboard]
    exact = [q.key for q in selectors if not q.family and q.key in columns]
    families = [_family_keys(q, [c for c in columns if c not in exact]) for q in selectors
                if q.family]
    return list(dict.fromkeys([*exact, *(key for family in families for key in family)]))


def _family_keys(family, columns: list[str]) -> list[str]:
    keys = [c for c in columns if family.covers(c)]
    try:
        return sorted(keys, key=lambda c: float(c.removeprefix(family.key)))
    except ValueError:
        return keys


def _declared(key: str) -> list:
    """The registered quantities that cover ``key``: the one naming it and the families it
    belongs to (a family's flags hold for each of its keys)."""
    return [q for _, q in quantities() if q.covers(key)]


def comparable_across_shapes(key: str) -> bool:
    """Whether models of different shapes can be compared by ``key`` (``WHY_SHAPE_FREE``): a
    quantity covering it says it is ``shape_free``."""
    return any(q.shape_free for q in _declared(key))


def higher_picked(key: str) -> bool:
    """Its highest value is picked (the CKA with the truth: more truth-like), the score's sign
    flipped: a quantity covering it says ``higher_picked``."""
    return any(q.higher_picked for q in _declared(key))


def selector_score(values, key: str) -> np.ndarray:
    """The score whose minimum the measure picks."""
    values = np.asarray(values, float)
    return -values if higher_picked(key) else values


# -- statistics ----------------------------------------------------------------------------

def partial_spearman(score, acc, loss, weights=None) -> np.ndarray:
    """(B,) partial Spearman of -score with acc given loss in each weighted sample (row i
    counted weights[:, i] times): average ranks, each residualised on the loss's ranks by least
    squares with intercept, then the Pearson r of the residuals."""
    score, acc, loss = (np.asarray(a, float) for a in (score, acc, loss))
    w = np.ones((1, len(acc))) if weights is None else np.asarray(weights, float)
    z = weighted_ranks(loss, w)
    return weighted_pearson(_residuals(weighted_ranks(-score, w), z, w),
                            _residuals(weighted_ranks(acc, w), z, w), w)


def _residuals(a: np.ndarray, z: np.ndarray, w: np.ndarray) -> np.ndarray:
    """a minus its weighted least-squares fit on z with intercept, row by row."""
    total = w.sum(axis=1, keepdims=True)
    ac = a - (w * a).sum(axis=1, keepdims=True) / total
    zc = z - (w * z).sum(axis=1, keepdims=True) / total
    zz = (w * zc * zc).sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        beta = np.where(zz > 0, (w * ac * zc).sum(axis=1, keepdims=True) / zz, 0.0)
    return ac - beta * zc


def measure_stats(acc, loss, score, weights=None, *, is_loss=False) -> dict[str, np.ndarray]:
    """{statistic: (B,)} of one measure (``STATISTICS``) on its candidates, per weighting."""
    w = np.ones((1, len(acc))) if weights is None else np.asarray(weights, float)
    name = LOSS if is_loss else "measure"
    with np.errstate(invalid="ignore", divide="ignore"):
        sel = selection_stats(acc, {LOSS: loss, name: score}, w)
    zero = np.zeros(len(w))  # the loss against itself, by construction
    out = {"partial_spearman": zero if is_loss else partial_spearman(score, acc, loss, w),
           "spearman": sel[name, "spearman"], "kendall": sel[name, "kendall"],
           "regret": sel[name, "regret"],
           "gain_vs_loss": zero if is_loss else sel[name, "gain_vs_loss"],
           "random_regret": sel[RANDOM, "regret"]}
    out["gain_vs_random"] = out["random_regret"] - out["regret"]
    return out


def interval(boot: np.ndarray | None, level: float = LEVEL) -> tuple[float, float]:
    """Percentile interval of the finite resampled values (NaN when there are none)."""
    if boot is None:
        return math.nan, math.nan
    boot = boot[np.isfinite(boot)]
    if not boot.size:
        return math.nan, math.nan
    alpha = (1 - level) / 2
    lo, hi = np.quantile(boot, [alpha, 1 - alpha])
    return float(lo), float(hi)


# -- groups and the table ------------------------------------------------------------------

@dataclass
class Group:
    """The runs of one comparison and the measures that enter it."""

    name: str
    runs: list[str]
    measures: list[str]
    shapes: list[str]
    why: str


@dataclass
class Board:
    """The leaderboard: the tidy ``table`` (``COLUMNS``), the ``cost`` per measure, the groups
    and the window's rule."""

    table: pd.DataFrame
    cost: pd.DataFrame
    groups: list[Group]
    rule: str
    tasks: list[str]
    level: float = LEVEL
    notes: list[str] = field(default_factory=list)
    matched: bool = False  # the window is a band around a target KL, not the saturated regime


def in_window(df: pd.DataFrame, kl_threshold: float, kl_from: float | None = None) -> pd.Series:
    """The rows in the window: ``pretrain/kl < kl_threshold`` (saturated), and with
    ``kl_from`` also ``>= kl_from`` (a matched band)."""
    inside = saturated(df, kl_threshold=kl_threshold)
    if kl_from is None:
        return inside
    if not kl_from < kl_threshold:
        raise ValueError(f"--kl-from {kl_from:g}: the band's lower edge must lie below "
                         f"--kl-threshold {kl_threshold:g}")
    return inside & (df[KL] >= kl_from).fillna(False).astype(bool)


def window_rule(kl_threshold: float, kl_from: float | None = None) -> str:
    rule = saturation_rule(kl_threshold=kl_threshold)
    return rule if kl_from is None else f"{kl_from:g} <= {rule}"


def split_groups(window: pd.DataFrame, acc_keys, measures) -> list[Group]:
    """``one shape`` (the shape most runs with an accuracy in the window have; every measure)
    and ``all sizes`` (every run; only the measures comparable across shapes)."""
    if MODEL not in window:
        raise ValueError(f"the trials have no {MODEL!r} column (config.json's model): the "
                         "groups compare shapes; load them with analysis.trials.load_trials")
    has_acc = window[list(acc_keys)].notna().any(axis=1)
    shapes = window[has_acc].groupby(MODEL)[RUN].nunique().sort_values(ascending=False,
                                                                       kind="stable")
    if shapes.empty:
        return []
    shape, all_shapes = str(shapes.index[0]), [str(s) for s in shapes.index]
    one = sorted(window.loc[has_acc & (window[MODEL] == shape), RUN].unique())
    every = sorted(window.loc[has_acc, RUN].unique())
    free = [m for m in measures if comparable_across_shapes(m)]
    return [Group(ONE_SHAPE, one, list(measures), [shape],
                  f"the runs of {shape}, the shape most runs in the window have "
                  f"({len(one)} of {len(every)} runs): every measure, all in one "
                  "parameterisation"),
            Group(ALL_SIZES, every, free, all_shapes,
                  f"every run ({len(every)}, {len(all_shapes)} shape(s): "
                  f"{', '.join(all_shapes)}): only the measures comparable across shapes. "
                  + WHY_SHAPE_FREE)]


def group_table(rows: pd.DataFrame, group: Group, acc_key: str, task: str, weights,
                level: float = LEVEL) -> list[tuple]:
    """The tidy rows of one (group, task): every statistic of every measure, the loss first,
    with its interval; ``n_candidates``, ``n_runs`` and ``rank`` (by partial Spearman)."""
    out = []
    for key in [LOSS, *(m for m in group.measures if m != LOSS)]:
        ok = np.isfinite(rows[[acc_key, LOSS, key]].to_numpy(float)).all(axis=1)
        if ok.sum() < 2:
            continue
        acc, loss = rows[acc_key].to_numpy(float)[ok], rows[LOSS].to_numpy(float)[ok]
        score = selector_score(rows[key].to_numpy(float)[ok], key)
        point = measure_stats(acc, loss, score, is_loss=key == LOSS)
        boot = _resampled(acc, loss, score, weights, ok, key == LOSS)
        for stat in STATISTICS:
            fixed = key == LOSS and stat in ("partial_spearman", "gain_vs_loss")
            lo, hi = interval(None if fixed else boot.get(stat), level)
            out.append((group.name, task, key, stat, float(point[stat][0]), lo, hi))
        out += [(group.name, task, key, "n_candidates", float(ok.sum()), math.nan, math.nan),
                (group.name, task, key, "n_runs", float(rows[RUN][ok].nunique()), math.nan,
                 math.nan)]
    return out + _rank_rows(out)


def _resampled(acc, loss, score, weights, ok, is_loss) -> dict[str, np.ndarray]:
    """The statistics on each resample that drew at least 2 of these candidates."""
    if weights is None:
        return {}
    w = weights[:, ok]
    w = w[w.sum(axis=1) >= 2]
    return measure_stats(acc, loss, score, w, is_loss=is_loss) if len(w) else {}


def _rank_rows(rows: list[tuple]) -> list[tuple]:
    """Rank 1 = the highest partial Spearman of the (group, task) (ties share the best rank)."""
    ps = pd.Series({r[2]: r[4] for r in rows if r[3] == "partial_spearman"}, dtype=float)
    ranks = ps.rank(ascending=False, method="min", na_option="bottom")
    return [(*rows[0][:2], key, "rank", float(rank), math.nan, math.nan)
            for key, rank in ranks.items()]


def of_protocols(df: pd.DataFrame, protocols: list[str] | None) -> pd.DataFrame:
    """The trials of ``protocols`` (None: every trial). One board pools one protocol's trials:
    the label rule and the probe differ between protocols, so their accuracies do not compare."""
    if protocols is None:
        return df
    present = sorted(df["protocol"].dropna().unique()) if "protocol" in df else []
    unknown = [p for p in protocols if p not in present]
    if unknown:
        there = ", ".join(present) or "none (not the <protocol>/<experiment>/<trial> layout)"
        raise ValueError(f"--protocol {unknown[0]!r}: no trial of it under --trials; the "
                         f"protocols there: {there}")
    return df[df["protocol"].isin(protocols)]


def leaderboard(df: pd.DataFrame, *, tasks=TASKS, kl_threshold: float = KL_THRESHOLD,
                kl_from: float | None = None, measures=None, n_boot: int = 2000, seed: int = 0,
                level: float = LEVEL) -> Board:
    """The leaderboard of ``measures`` (default: every one present, ``measure_keys``) on the
    checkpoints of ``df`` (``analysis.trials.load_trials``) in the window ``pretrain/kl <
    kl_threshold`` (and ``>= kl_from``, a matched band, when given: ``in_window``)."""
    acc_keys = {t: probe_key(t) for t in tasks}
    measures = list(measures or measure_keys(df.columns))
    missing = [k for k in (RUN, LOSS, *acc_keys.values(), *measures) if k not in df]
    if missing:
        raise ValueError(f"no column {missing} in the trials: --tasks names probe/<task>/"
                         f"acc_mean, --measures metric keys; present: {measure_keys(df.columns)}")
    merged, label = merge_same_training(df)
    window = merged[in_window(merged, kl_threshold, kl_from)]
    groups = split_groups(window, acc_keys.values(), measures)
    rows = []
    for group in groups:
        part = window[window[RUN].isin(group.runs)]
        # one draw of runs per group, shared by every task and measure: paired comparisons
        weights = cluster_weights(part[RUN], n_boot, np.random.default_rng(seed))
        for task, acc_key in acc_keys.items():
            rows += group_table(part, group, acc_key, task, weights, level)
    table = pd.DataFrame(rows, columns=list(COLUMNS))
    # the cost per trial as it ran: its own checkpoint spacing and training time
    trial_run = df[RUN].map(label)
    cost = pd.concat([cost_table(df[trial_run.isin(g.runs)], g) for g in groups] or
                     [pd.DataFrame()], ignore_index=True)
    notes = _notes(df, window, groups, window_rule(kl_threshold, kl_from)) + _merge_notes(label)
    return Board(table, cost, groups, window_rule(kl_threshold, kl_from), list(tasks), level,
                 notes, matched=kl_from is not None)


def _merge_notes(label: dict[str, str]) -> list[str]:
    merged = sorted({v for k, v in label.items() if k != v})
    if not merged:
        return []
    return [f"{len(merged)} training(s) ran as more than one trial (the same settings but the "
            "checkpoint steps, or an identical checkpoint), each counted as one run, its "
            "checkpoints at one step as one: " + "; ".join(merged) + "."]


def _notes(df, window, groups, rule: str) -> list[str]:
    if window.empty:
        smallest = df[KL].min() if KL in df else math.nan
        return [f"No checkpoint is in the window ({rule}; smallest KL seen {smallest:.3g}): "
                "nothing to rank."]
    return [f"Only {len(g.runs)} runs in the window for `{g.name}` (fewer than {FEW_RUNS}): "
            "the intervals rest on few resampled runs and are rough; read this as provisional."
            for g in groups if len(g.runs) < FEW_RUNS]


# -- cost ----------------------------------------------------------------------------------

def timing_key(key: str) -> str:
    """The ``time/<measurement>_s`` that covers ``key``: its measurement's ``timing`` (a grown
    twin: its construction's own run)."""
    if "_grown" in key:
        return "time/flatness" + key[key.index("_grown"):] + "_s"
    found = quantity_of(key)
    if found is None:
        raise ValueError(f"{key}: no registered measurement declares it, so its timing is not "
                         "known; give the measurement a Quantity for it "
                         "(flatlm.measure.registry.Measurement.quantities)")
    return f"time/{found[0].timing}_s"


def step_seconds(df: pd.DataFrame) -> pd.Series:
    """Seconds per training step at each checkpoint: ``time/train_s`` (since the previous
    checkpoint) over the steps since it (from 0 at the first); NaN where no step was taken."""
    previous = df.groupby(RUN)["step"].shift(1).fillna(0)
    steps = df["step"] - previous
    return (df["time/train_s"] / steps).where(steps > 0)


def cost_table(df: pd.DataFrame, group: Group) -> pd.DataFrame:
    """Per measure of ``group`` (and the probe): mean over checkpoints of its measurement's
    seconds over one training step's, the timing key, which measures share it and how many
    checkpoints had both."""
    keys = [LOSS, *(m for m in group.measures if m != LOSS)]
    timings = {k: timing_key(k) for k in keys} | {PROBE_COST: "time/probe_s"}
    per_step = step_seconds(df) if "time/train_s" in df else pd.Series(np.nan, index=df.index)
    rows = []
    for key, timing in timings.items():
        ratio = (df[timing] / per_step) if timing in df else pd.Series(dtype=float)
        ratio = ratio[np.isfinite(ratio)]
        shared = [k for k, t in timings.items() if t == timing and k != key]
        rows.append({"group": group.name, "measure": key, "timing": timing,
                     "shared_with": ", ".join(shared), "cost_steps": ratio.mean(),
                     "checkpoints": len(ratio)})
    return pd.DataFrame(rows)


# -- words ---------------------------------------------------------------------------------

def standing(stats: dict[str, tuple[float, float, float]]) -> str:
    """A measure against the loss on one task, from ``{statistic: (value, lo, hi)}``."""
    (_, plo, phi), (_, glo, ghi) = stats["partial_spearman"], stats["gain_vs_loss"]
    if not all(math.isfinite(v) for v in (plo, phi, glo, ghi)):
        return "no interval"
    beyond, worse = plo > 0 or glo > 0, phi < 0 or ghi < 0
    if beyond and worse:
        return "mixed (one interval above 0, one below)"
    if beyond:
        return "predicts beyond the loss"
    return "worse than the loss" if worse else "indistinguishable from the loss"


def _stats_of(table: pd.DataFrame, group: str, task: str) -> dict[str, dict]:
    """{measure: {statistic: (value, lo, hi)}} of one (group, task), in the table's order."""
    part = table[(table.group == group) & (table.task == task)]
    out: dict[str, dict] = {}
    for r in part.itertuples():
        out.setdefault(r.measure, {})[r.statistic] = (r.value, r.ci_low, r.ci_high)
    return out


def _ci(stat: tuple, fmt: str = "+.4f") -> str:
    value, lo, hi = stat
    if not math.isfinite(value):
        return "n/a"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return format(value, fmt)
    return f"{value:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def task_verdict(table: pd.DataFrame, group: Group, task: str) -> str:
    """The paragraph of one (group, task): the best pick against the loss's and a random pick,
    the top partial Spearman and which measures predict beyond the loss."""
    stats = _stats_of(table, group.name, task)
    head = f"**Task {task}, {group.name}.**"
    if LOSS not in stats:
        return f"{head} No candidates (no checkpoint in the window with this accuracy)."
    others = {k: v for k, v in stats.items() if k != LOSS}
    loss = stats[LOSS]
    words = [f"{head} {int(loss['n_candidates'][0])} candidates of {int(loss['n_runs'][0])} "
             f"runs. The loss's pick: regret {_ci(loss['regret'])}; a random pick: expected "
             f"regret {_ci(loss['random_regret'])}."]
    if not others:
        return " ".join([*words, "No other measure has candidates here."])
    best = min(others, key=lambda k: (others[k]["regret"][0], -others[k]["partial_spearman"][0]))
    b = others[best]
    tied = sum(v["regret"][0] == b["regret"][0] for v in others.values()) - 1
    words.append(f"Best pick: {best}" + (f" (tied in regret with {tied} other(s); the "
                                         "higher partial Spearman breaks the tie)" if tied else "")
                 + f", regret {_ci(b['regret'])}; gain vs the loss's pick "
                 f"{_ci(b['gain_vs_loss'])}, vs a random pick {_ci(b['gain_vs_random'])}"
                 + _on_fewer(b, loss) + ".")
    top = min(others, key=lambda k: others[k]["rank"][0])
    words.append(f"Highest partial Spearman: {top}, {_ci(others[top]['partial_spearman'])} "
                 f"({standing(others[top])}).")
    return " ".join([*words, _tally(others)])


def _on_fewer(stats: dict, loss: dict) -> str:
    """Regrets on fewer candidates than the loss's are not comparable with its regret: say so."""
    n, n_loss = int(stats["n_candidates"][0]), int(loss["n_candidates"][0])
    return f" (on the {n} candidates that have it, of {n_loss})" if n < n_loss else ""


def _tally(others: dict[str, dict]) -> str:
    by = {}
    for key, stats in others.items():
        by.setdefault(standing(stats), []).append(key)
    return " ".join(f"{label.capitalize()}: {', '.join(keys)}." for label, keys in
                    sorted(by.items()))


def group_markdown(table: pd.DataFrame, group: Group, task: str) -> str:
    """The table of one (group, task): a row per measure, ranked by partial Spearman."""
    stats = _stats_of(table, group.name, task)
    if not stats:
        return f"No candidates for task {task} in `{group.name}`."
    head = ("| rank | measure | picked | partial Spearman | Kendall tau-b | regret | gain vs loss "
            "| random regret | gain vs random | n | runs | standing |")
    lines = [head, "|" + "---|" * 12]
    for key in sorted(stats, key=lambda k: stats[k]["rank"][0]):
        s = stats[key]
        cells = [f"{int(s['rank'][0])}", f"`{key}`", "highest" if higher_picked(key) else
                 "lowest", *(_ci(s[k]) for k in ("partial_spearman", "kendall", "regret",
                                                  "gain_vs_loss", "random_regret",
                                                  "gain_vs_random")),
                 f"{int(s['n_candidates'][0])}", f"{int(s['n_runs'][0])}",
                 "the baseline" if key == LOSS else standing(s)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_markdown(cost: pd.DataFrame) -> str:
    """Cost per checkpoint in training steps, a column per group."""
    if cost.empty:
        return "No timings."
    groups = list(dict.fromkeys(cost.group))
    by = cost.set_index(["group", "measure"])
    lines = ["| measure | timing key | its time also covers | "
             + " | ".join(f"{g}: steps (checkpoints)" for g in groups) + " |",
             "|" + "---|" * (3 + len(groups))]
    for r in cost.drop_duplicates("measure").itertuples(index=False):
        cells = [_cost_cell(by, g, r.measure) for g in groups]
        lines.append(f"| `{r.measure}` | `{r.timing}` | {r.shared_with} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cost_cell(by: pd.DataFrame, group: str, measure: str) -> str:
    if (group, measure) not in by.index:
        return ""
    row = by.loc[(group, measure)]
    value = f"{row.cost_steps:.1f}" if math.isfinite(row.cost_steps) else "n/a"
    return f"{value} ({row.checkpoints})"


def leaderboard_markdown(board: Board, *, command: str = "", wall_min: float | None = None,
                         hardware: str | None = None, protocols: list[str] | None = None) -> str:
    """The verdicts first, then the tables, the cost, the rule and the provenance."""
    out = ["# Which measure predicts probe accuracy at equal loss?", ""]
    if protocols:
        out += [f"Trials of protocol {', '.join(f'`{p}`' for p in protocols)} only (one label "
                "rule and one probe: accuracies of other protocols do not compare).", ""]
    out += board.notes
    for group in board.groups:
        out += ["", *(task_verdict(board.table, group, t) + "\n" for t in board.tasks)]
    out += ["", "## Rule", "", _rule_text(board)]
    for group in board.groups:
        out += ["", f"## {group.name}", "", group.why, "",
                "Measures: " + ", ".join(f"`{m}`" for m in group.measures) + "."]
        for task in board.tasks:
            out += ["", f"### Task {task}", "", group_markdown(board.table, group, task)]
    measures = list(dict.fromkeys(m for g in board.groups for m in g.measures))
    out += ["", "## Invariance to function-preserving reparameterisation", "",
            _invariance_text(), "", invariance_markdown(measures)]
    out += ["", "## Cost per checkpoint, in training steps", "", _cost_text(), "",
            cost_markdown(board.cost), "", "## Provenance", "", f"Command: `{command}`"]
    if wall_min is not None:
        out.append(f"\nThe data's wall time: {wall_min:g} min.")
    if hardware:
        out.append(f"\nThe data's hardware: {hardware}.")
    return "\n".join(out) + "\n"


def _rule_text(board: Board) -> str:
    window = (f"the matched window, {board.rule} (a band around a common target KL below "
              "saturation: the runs' losses are matched, not saturated, and the loss still "
              "orders models within it)" if board.matched else
              f"the saturated window, {board.rule} (within that many nats of the truth's "
              "conditionals, where the loss barely orders models)")
    return (
        f"Candidates: the checkpoints in {window}, with the "
        "task's probe accuracy (`probe/<task>/acc_mean`), the loss and the measure finite. A "
        "measure picks its lowest value (the CKA with the truth its highest). Partial Spearman: "
        "of -measure (+CKA) with the accuracy given the loss, on ranks residualised on the "
        "loss's ranks with intercept; the loss's own is 0 by construction (its residual "
        "vanishes), as is its gain. Regret: the best candidate's accuracy minus the picked "
        "one's (ties averaged); gain vs loss: the loss's regret minus the measure's, on the "
        "same candidates; random regret: a random pick's expected regret. Intervals: "
        f"{board.level:.0%} percentile intervals of a cluster bootstrap over runs (a resample "
        "draws the group's runs with replacement with all their candidates; the same resamples "
        "for every measure and task of a group). Standing: *indistinguishable from the loss* "
        "when the intervals of the partial Spearman and of the gain both contain 0, *predicts "
        "beyond the loss* when either lies above 0, *worse than the loss* when either lies "
        "below. Rank: by the partial Spearman's point value.")


def invariance_of(measures, path: Path = INVARIANCE_FILE) -> dict[str, list[str] | None]:
    """measure -> the ``RESCALINGS`` under which the committed test (``python
    bench/invariance.py``) found it invariant; None for a measure the test did not take."""
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    kept: dict[str, list[str]] = {}
    for row in rows:
        if row["case"] in RESCALINGS:
            kept.setdefault(row["measure"], [])
            if row["invariant"]:
                kept[row["measure"]].append(row["case"])
    return {m: kept.get(m) for m in measures}


def invariance_markdown(measures) -> str:
    """Each leaderboard measure, invariant to the rescalings or not, as the test measured it:
    a measure that moves under a rescaling that keeps every logit ranks models by how they are
    parameterised as well as by what they compute."""
    lines = ["| measure | invariant to the rescalings | not invariant to |", "|---|---|---|"]
    for measure, kept in invariance_of(measures).items():
        if kept is None:
            lines.append(f"| `{measure}` | not tested | |")
            continue
        lost = [c for c in RESCALINGS if c not in kept]
        verdict = "yes" if not lost else ("no" if not kept else "partly")
        lines.append(f"| `{measure}` | {verdict} | {', '.join(lost)} |")
    return "\n".join(lines)


def _invariance_text() -> str:
    return ("From `bench/results/invariance.md` (`python bench/invariance.py`: a tiny BERT, "
            "float64, c = 100; each rescaling keeps the logits to 1e-12): a measure marked *no* "
            "or *partly* changes its value under a reparameterisation that keeps the model's "
            "function, so its ranking of models mixes parameterisation with function.")


def _cost_text() -> str:
    return ("The mean over the group's checkpoints of the measurement's `time/<name>_s` over "
            "the seconds of one training step there (`time/train_s` / the steps since the "
            "previous checkpoint). One measurement's time covers all its keys: Tr(F) and Tr(H) "
            "are one run (`time/flatness_s`), the eigenvalues and the sharpness another "
            "(`time/landscape_s`), all noise scales one (`time/noise_s`), both CKA keys one "
            "(`time/cka_truth_s`); a shared time is what the keys cost together, an upper bound "
            "for each.")


# -- figure and files ----------------------------------------------------------------------

def leaderboard_figure(board: Board, path: Path) -> Path:
    """Per task (rows) and group: partial Spearman with its interval per measure (the loss at
    0), and the regret (random's beside)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_measures = max([len(g.measures) for g in board.groups] + [3]) + 2
    cols = max(1, 2 * len(board.groups))
    fig = Figure(figsize=(5.5 * cols, 0.8 + 0.32 * n_measures * len(board.tasks)))
    FigureCanvasAgg(fig)
    axes = np.atleast_2d(fig.subplots(len(board.tasks), cols, squeeze=False))
    for i, task in enumerate(board.tasks):
        for j, group in enumerate(board.groups):
            stats = _stats_of(board.table, group.name, task)
            _panel(axes[i, 2 * j], stats, "partial_spearman", f"{group.name}, task {task}")
            _panel(axes[i, 2 * j + 1], stats, "regret", f"{group.name}, task {task}")
    fig.suptitle(f"Measures against the loss at equal loss; {board.rule}")
    fig.tight_layout(rect=(0, 0, 1, 0.98))  # room for the suptitle
    fig.savefig(path, dpi=100)
    return path


def _panel(ax, stats: dict, statistic: str, title: str) -> None:
    ax.set_title(title, fontsize=9)
    if LOSS not in stats:
        return
    names = sorted(stats, key=lambda k: stats[k]["rank"][0])
    rows = [stats[k][statistic] for k in names]
    if statistic == "regret":  # the random pick beside, on the loss's candidates
        names, rows = [*names, RANDOM], [*rows, stats[LOSS]["random_regret"]]
    y = np.arange(len(names))
    v, lo, hi = np.array(rows, float).T
    # a percentile interval of a min/max statistic need not contain the point: clip
    err = np.clip(np.nan_to_num(np.vstack([v - lo, hi - v])), 0, None)
    ax.errorbar(v, y, xerr=err, fmt="o", capsize=3)
    ax.set_yticks(y, [plain_name(n) for n in names], fontsize=7)
    ax.locator_params(axis="x", nbins=4)  # regrets of 1e-3 crowd the axis otherwise
    ax.axvline(0, color="grey", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel(statistic.replace("_", " ") + (" (higher: predicts more)"
                                                 if statistic == "partial_spearman"
                                                 else " (lower: better pick)"))


def tidy(board: Board) -> pd.DataFrame:
    """The table and the cost in one tidy frame (``COLUMNS``; the cost's task empty)."""
    cost = board.cost
    if not cost.empty:
        cost = pd.DataFrame({"group": cost.group, "task": "", "measure": cost.measure,
                             "statistic": "cost_steps", "value": cost.cost_steps,
                             "ci_low": math.nan, "ci_high": math.nan})
    return pd.concat([board.table, cost], ignore_index=True)[list(COLUMNS)]


def write_leaderboard(board: Board, out: Path, **context) -> list[Path]:
    """``leaderboard.md`` / ``.csv`` / ``.png`` under ``out``; ``context``: the markdown's
    ``command``, ``wall_min``, ``hardware``, ``protocols``."""
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / "leaderboard.md", out / "leaderboard.csv"
    md.write_text(leaderboard_markdown(board, **context))
    tidy(board).to_csv(csv, index=False)
    paths = [md, csv]
    if board.groups:
        paths.append(leaderboard_figure(board, out / "leaderboard.png"))
    return paths


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", required=True, type=Path, help="a root of trial directories")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--kl-threshold", type=POSITIVE, default=KL_THRESHOLD)
    p.add_argument("--kl-from", type=POSITIVE, default=None,
                   help="the window's lower edge: a matched band [LOW, --kl-threshold) instead "
                        "of the saturated window")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--measures", default=None,
                   help="comma-separated metric keys (default: every measure present)")
    p.add_argument("--n-boot", type=COUNT, default=2000)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--wall-min", type=POSITIVE, default=None, help="the data's wall time, minutes")
    p.add_argument("--hardware", default=None, help="the hardware the data was made on")
    p.add_argument("--protocol", default=None,
                   help="comma-separated protocols whose trials count (default: every trial)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        df = load_trials(args.trials)
        if df.empty:
            raise ValueError(f"--trials {args.trials}: no trial directories under it")
        protocols = args.protocol.split(",") if args.protocol else None
        df = of_protocols(df, protocols)
        board = leaderboard(df, tasks=args.tasks.split(","), kl_threshold=args.kl_threshold,
                            kl_from=args.kl_from,
                            measures=args.measures.split(",") if args.measures else None,
                            n_boot=args.n_boot, seed=args.seed)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    write_leaderboard(board, args.out, wall_min=args.wall_min, hardware=args.hardware,
                      protocols=protocols,
                      command=shlex.join(["python", "analysis/leaderboard.py", *argv]))
    print((args.out / "leaderboard.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
