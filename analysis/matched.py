"""The matched-loss rule: the paper's claims read below saturation, each arm at the checkpoint
where its KL to the truth crosses one common target, with the confound of the KL difference
that remains bounded and folded into the interval.

The paper's claims are about the saturation regime (``analysis/claims.py``'s rule). Where no
arm saturates (a CPU testbed whose tasks leave room: bench/results/testbed_v2_search.md), two
models compared *at the same KL* still answer the paper's thesis, "the pre-training loss cannot
fully explain downstream performance", for an unsaturated model. This rule says how, and says
"precondition not met" where a claim needs convergence.

**Settings** (fields of ``analysis.claims.VerdictRule``; the report carries their values):

- ``target_kl`` (nats/token): the common target. None (the default) turns the rule off: every
  claim is read by the saturation rule alone, as before this rule existed.
- ``match_tol`` = 0.02 nats: a run whose KL never crosses the target between two checkpoints
  is read at its checkpoint nearest the target if that lies within ``match_tol`` of it, else
  not at all ("inconclusive (target not reached)").
- ``slope_window`` = 0.1 nats: the checkpoints of an arm whose KL lies within this of the
  target (at least its bracketing pair) give the slope of the metric on the KL.
- ``confound_share`` = 0.25: a claim whose confound bound exceeds this share of the paper's
  effect reads ``inconclusive (loss not matched)``. Where the paper states a direction only,
  the share is of the larger of our own mean effect and the interval's half-width before the
  bound widens it (seeds and measurement error: what this design resolves): against our mean
  alone a null effect, however well matched its KLs, would always read "loss not matched".

**Reading a run at the target.** Its first pair of consecutive checkpoints with KL above and
at-or-below the target brackets the crossing; the metric is interpolated linearly in the KL
between them, weight w = (KL_before - target) / (KL_before - KL_after), and so is its
measurement s.e., as if the two measurements were fully correlated (they share the test set):
se = (1 - w) se_before + w se_after, the largest the s.e. of the weighted mean can be. The KL
read there is the target; its s.e. is interpolated alike from ``pretrain/kl_se``.

**The confound bound.** Interpolation matches the KLs as measured; what is left is (i) the mean
over seeds of the read KLs' difference (0 when both arms are interpolated; the nearest
checkpoint's offset otherwise) and (ii) the KL's own measurement error, sqrt(se_t^2 + se_c^2)
(one evaluation set for every seed, so not divided by sqrt(n)). The accuracy (or trace) that
such a KL difference could explain is at most

    bound = s_max * (|mean dKL| + z se_dKL),    s_max = max over the two arms of |s| + z se_s,

where s is the slope of the metric on the KL along the arm's own trajectory around the target
(least squares over the window's checkpoints of every seed, each seed its own intercept; its
s.e. from the residuals, at least the checkpoints' mean measurement s.e.) and z the normal
quantile of the rule's ``level``. A relative effect (a trace: treated / control - 1) divides the
bound by the control's mean. The bound is a column of every row (``confound_bound``) and widens
the interval on both sides: [low - bound, high + bound]. Beside it the report gives the bound
from (i) alone (``confound_bound_read_kl``, 0 where both arms are interpolated): the reading
that trusts the measured KLs as exact. The difference between the two is what the KL's sampling
error on the evaluation set could hide; a larger ``measure.n_eval`` shrinks it.

**Claims that need convergence** (Fig. 2 / Fig. 4: accuracy rising with steps *after* the loss
converges; SGD's Fig. 4 left) read ``precondition not met (the loss still falls)`` unless every
run's KL has a measured plateau: the least-squares slope of the KL on the step over its last
``plateau_points`` checkpoints lies within one s.e. of 0 (s.e. from the residuals alone: the
checkpoints share one evaluation set, whose sampling error is common to them all and cancels in
a slope; a floor at the KL's s.e. would call a falling loss flat). A plateau above the target
KL is a stall, not convergence: the other arms of the same scale go below it, so the optimiser
stopped short of the minimum the paper's claims presuppose, and the claim reads ``precondition not
met (the loss stalls above the target KL)`` (SGD on testbed v2 sits at KL 1.25 while AdamW
reaches 0.7). The lookup table is the
truth's own features (KL 0): no trained run is at its loss below saturation, so its claims read
``precondition not met (the lookup table is at KL 0)``.

>>> run = pd.DataFrame({"step": [1, 2, 3], "pretrain/kl": [0.8, 0.6, 0.4],
...     "probe/B/acc_mean": [0.5, 0.6, 0.7], "probe/B/acc_se": [0.01, 0.01, 0.01]})
>>> r = read_at(run, 0.5, "probe/B/acc_mean", match_tol=0.02)
>>> round(r.value, 6), r.kl, r.how
(0.65, 0.5, 'interpolated')
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd
from scipy import stats

from analysis.paper_claims import SIZES_EFFECT, WINDOW_EFFECT
from analysis.room import PAIR, TASK_COLUMNS, arm_keys
from analysis.uncertainty import Interval, t_p_value
from flatlm.measure import KL, se_key
from flatlm.models.presets import parameter_count, parse_model

MATCH_TOL = 0.02  # nats: the nearest checkpoint counts when no pair brackets the target
SLOPE_WINDOW = 0.1  # nats: checkpoints this near the target give the slope on the KL
CONFOUND_SHARE = 0.25  # a bound above this share of the paper's effect: loss not matched
PLATEAU_POINTS = 4  # the last checkpoints whose KL-on-step slope decides a plateau

MATCHED, SATURATED = "matched loss", "saturated"
PRECONDITION = "precondition not met"
NOT_MATCHED = "inconclusive (loss not matched)"
NOT_REACHED = "inconclusive (target not reached)"
STILL_FALLING = f"{PRECONDITION} (the loss still falls)"
STALLED = f"{PRECONDITION} (the loss stalls above the target KL)"
LOOKUP_AT_ZERO = f"{PRECONDITION} (the lookup table is at KL 0)"


class Reading(NamedTuple):
    """One run's metric at the target KL."""

    value: float
    se: float
    kl: float  # the KL read (the target when interpolated)
    kl_se: float
    how: str  # "interpolated", "nearest" or "" (not reached)


NO_READING = Reading(np.nan, np.nan, np.nan, np.nan, "")


def _col(run: pd.DataFrame, key: str) -> np.ndarray:
    return run[key].to_numpy(dtype=float) if key in run else np.full(len(run), np.nan)


def read_at(run: pd.DataFrame, target: float, key: str, *, match_tol: float = MATCH_TOL,
            se_column: str | None = None) -> Reading:
    """``run``'s ``key`` at the KL ``target`` (module docstring): interpolated between its
    first bracketing pair of checkpoints, else its nearest checkpoint within ``match_tol``."""
    run = run.sort_values("step")
    kl, value = _col(run, KL), _col(run, key)
    se, kl_se = _col(run, se_column or se_key(key)), _col(run, se_key(KL))
    ok = np.isfinite(kl) & np.isfinite(value)
    kl, value, se, kl_se = kl[ok], value[ok], se[ok], kl_se[ok]
    for i in range(1, len(kl)):
        if kl[i - 1] > target >= kl[i]:
            w = (kl[i - 1] - target) / (kl[i - 1] - kl[i])
            return Reading(float((1 - w) * value[i - 1] + w * value[i]),
                           _blend(se[i - 1], se[i], w), float(target),
                           _blend(kl_se[i - 1], kl_se[i], w), "interpolated")
    if not len(kl):
        return NO_READING
    i = int(np.argmin(np.abs(kl - target)))
    if abs(kl[i] - target) > match_tol:
        return NO_READING
    return Reading(float(value[i]), float(se[i]), float(kl[i]), float(kl_se[i]), "nearest")


def _kl_span(run: pd.DataFrame, target: float) -> str:
    """Where a run that was not read at ``target`` lay: its first and last checkpoints' KL,
    and which side of the target it stayed on (a run below it from its first checkpoint needs
    earlier checkpoints, one above it at its last more steps)."""
    kl = _col(run.sort_values("step"), KL)
    kl = kl[np.isfinite(kl)]
    if not len(kl):
        return "no KL measured"
    side = ("below the target from its first checkpoint" if kl.max() <= target
            else "above the target at its last" if kl.min() > target else "")
    return f"KL {kl[0]:.3f} -> {kl[-1]:.3f}" + (f": {side}" if side else "")


def _blend(a: float, b: float, w: float) -> float:
    """(1 - w) a + w b, an unknown s.e. counting as 0 (NaN when both are unknown)."""
    if not (np.isfinite(a) or np.isfinite(b)):
        return np.nan
    return float((1 - w) * np.nan_to_num(a) + w * np.nan_to_num(b))


class Slope(NamedTuple):
    """d metric / d KL along an arm's trajectory around the target, with its s.e."""

    slope: float
    se: float
    points: int


def slope_on_kl(runs: list[pd.DataFrame], target: float, key: str, *,
                window: float = SLOPE_WINDOW, se_column: str | None = None) -> Slope:
    """The pooled within-run least-squares slope of ``key`` on the KL over each run's
    checkpoints within ``window`` of ``target`` (widened to its bracketing pair), its s.e. from
    the residuals, at least the checkpoints' mean measurement s.e. (module docstring)."""
    xs, ys, ses = [], [], []
    for run in runs:
        part = _window(run.sort_values("step"), target, key, window)
        if len(part) >= 2:
            x, y = _col(part, KL), _col(part, key)
            xs.append(x - x.mean())
            ys.append(y - y.mean())
            ses.append(_col(part, se_column or se_key(key)))
    if not xs:
        return Slope(np.nan, np.nan, 0)
    x, y, se = (np.concatenate(a) for a in (xs, ys, ses))
    sxx = float(x @ x)
    if sxx <= 0:
        return Slope(np.nan, np.nan, len(x))
    slope = float(x @ y) / sxx
    dof = len(x) - len(xs) - 1
    floor = float(np.nanmean(se ** 2)) if np.isfinite(se).any() else 0.0
    resid = float(((y - slope * x) ** 2).sum()) / dof if dof > 0 else 0.0
    return Slope(slope, float(np.sqrt(max(resid, floor) / sxx)), len(x))


def _window(run: pd.DataFrame, target: float, key: str, window: float) -> pd.DataFrame:
    """The checkpoints of ``run`` within ``window`` of ``target``, its bracketing pair
    included."""
    run = run[np.isfinite(_col(run, KL)) & np.isfinite(_col(run, key))]
    kl = _col(run, KL)
    near = np.abs(kl - target) <= window
    for i in range(1, len(kl)):
        if kl[i - 1] > target >= kl[i]:
            near[i - 1] = near[i] = True
            break
    return run[near]


def confound_bound(slopes: list[Slope], dkl: float, dkl_se: float, level: float) -> float:
    """The metric's change that a KL difference ``dkl`` (s.e. ``dkl_se``) could explain, at the
    steepest of ``slopes`` with its s.e. (module docstring); NaN where a slope is unknown."""
    z = float(stats.norm.ppf(0.5 + level / 2))
    steep = [abs(s.slope) + z * s.se for s in slopes]
    if not steep or not all(np.isfinite(steep)):
        return np.nan
    return float(max(steep) * (abs(dkl) + z * np.nan_to_num(dkl_se)))


def kl_plateau(run: pd.DataFrame, points: int = PLATEAU_POINTS) -> tuple[bool, float, float]:
    """(plateau, slope, s.e.) of the KL on the step over ``run``'s last ``points``
    checkpoints: a plateau when |slope| <= its s.e. (module docstring)."""
    part = run.sort_values("step").tail(points)
    x, y = part["step"].to_numpy(dtype=float), _col(part, KL)
    if len(x) < 3 or not np.isfinite(y).all():
        return False, np.nan, np.nan
    x = x - x.mean()
    sxx = float(x @ x)
    slope = float(x @ (y - y.mean())) / sxx
    resid = float(((y - y.mean() - slope * x) ** 2).sum()) / (len(x) - 2)
    slope_se = float(np.sqrt(resid / sxx))
    return abs(slope) <= slope_se, slope, slope_se


class MatchedPair(NamedTuple):
    """Two arms read at the target, seed by seed: ``pairs`` has ``analysis.room.PAIR``'s
    columns (indexed by seed), the read KLs' mean difference and its s.e., each arm's slope,
    and the seeds an arm did not reach the target in."""

    pairs: pd.DataFrame
    dkl: float
    dkl_se: float
    slopes: tuple[Slope, Slope]
    unreached: tuple[str, ...]
    hows: tuple[str, ...]


def pair_at_target(treated: dict, control: dict, key: str, target: float, *,
                   match_tol: float = MATCH_TOL, window: float = SLOPE_WINDOW) -> MatchedPair:
    """``treated`` and ``control`` (seed -> that seed's checkpoints) read at ``target`` in
    ``key`` (an accuracy brings its task's majority share, ceiling and test size), seeds with
    both."""
    cols = arm_keys(key)
    rows, dkl, dkl_se, unreached, hows = [], [], [], [], []
    for seed in sorted(set(treated) & set(control)):
        t, c = (read_at(arms[seed], target, key, match_tol=match_tol)
                for arms in (treated, control))
        missing = [(name, arms[seed]) for name, arms, r in
                   (("treated", treated, t), ("control", control, c)) if not r.how]
        if missing:
            unreached += [f"{name} seed {seed} ({_kl_span(run, target)})" for name, run in missing]
            continue
        fixed = {name: _first(control[seed], cols.get(name)) for name in TASK_COLUMNS}
        rows.append({"seed": seed, "treated": t.value, "treated_se": t.se,
                     "control": c.value, "control_se": c.se, **fixed})
        dkl.append(t.kl - c.kl)
        dkl_se.append(float(np.hypot(np.nan_to_num(t.kl_se), np.nan_to_num(c.kl_se))))
        hows += [t.how, c.how]
    pairs = pd.DataFrame(rows, columns=["seed", *PAIR]).set_index("seed")
    slopes = tuple(slope_on_kl(list(arms.values()), target, key, window=window)
                   for arms in (treated, control))
    return MatchedPair(pairs, float(np.mean(dkl)) if dkl else np.nan,
                       float(np.mean(dkl_se)) if dkl_se else np.nan, slopes,
                       tuple(unreached), tuple(hows))


def _first(run: pd.DataFrame, key: str | None) -> float:
    """The first finite value of ``key`` in ``run`` (a task's majority share, ceiling or test
    size, the same at every checkpoint), NaN where not recorded (a ceiling: 1, room.py)."""
    if key is None or key not in run:
        return np.nan
    v = run[key].dropna()
    return float(v.iloc[0]) if len(v) else np.nan


# -- a claim's effects at the target ---------------------------------------------------------

RUN, SEED, ALGORITHM = "run_id", "train.seed", "train.algorithm"


class Matched(NamedTuple):
    """What the rule reads off one claim at the target: per-seed effects, the arms
    (``analysis.room.PAIR`` columns), the confound bound in the effect's units, a verdict no
    interval decides (a precondition, the target not reached; "" otherwise) and a note."""

    values: list
    pairs: pd.DataFrame
    confound: float
    precondition: str
    kl_max: float
    kl_spread: float
    note: str
    confound_read_kl: float = np.nan  # the bound from the read KLs' difference alone


def _seed_runs(part: pd.DataFrame) -> dict:
    """seed -> that seed's checkpoints (its first run where several share a seed)."""
    out = {}
    for run_id, run in part.groupby(RUN, sort=True):
        out.setdefault(run[SEED].iloc[0] if SEED in run else run_id, run)
    return out


class MatchRule(NamedTuple):
    """The matched-loss rule's settings (``analysis.claims.VerdictRule.matching``)."""

    target: float  # nats/token: the common KL every arm is read at
    level: float  # the intervals' confidence
    match_tol: float = MATCH_TOL
    window: float = SLOPE_WINDOW
    plateau_points: int = PLATEAU_POINTS


class Compared(NamedTuple):
    """What one claim compares: its ``effect`` kind (``analysis.paper_claims.EFFECT_KINDS``), the
    metric column ``key``, (treatment, control) for two arms, a relative (trace) effect or a
    difference."""

    effect: str
    key: str
    compare: tuple | None
    relative: bool


def matched_effects(part: pd.DataFrame, compared: Compared, rule: MatchRule) -> Matched:
    """One claim's effects under the matched-loss rule (module docstring), read from ``part``."""
    effect, key, compare, relative = compared
    target, level, match_tol, window, plateau_points = rule
    if effect == WINDOW_EFFECT:
        return _plateau_effects(part, key, relative, level, plateau_points, target)
    if compare is not None and "lookup" in compare:
        return _empty(LOOKUP_AT_ZERO, "the lookup table has KL 0; no trained run is there "
                                      "below saturation")
    arms = _arms(part, effect, compare)
    if arms is None:
        return _empty(NOT_REACHED, "fewer than two arms to compare")
    (t_name, treated), (c_name, control) = arms
    got = pair_at_target(treated, control, key, target, match_tol=match_tol, window=window)
    note = (f"{t_name} vs {c_name} read at KL {target:g} ({_hows(got.hows)}); "
            f"mean KL difference {got.dkl:+.4f} (s.e. {got.dkl_se:.4f}); slope on KL "
            f"{_slope_words(got.slopes)}")
    if got.unreached:
        return Matched([], got.pairs, np.nan, NOT_REACHED, np.nan, np.nan,
                       f"{note}; did not reach KL {target:g} within {match_tol:g}: "
                       + ", ".join(got.unreached))
    p = got.pairs
    values = list(p["treated"] / p["control"] - 1 if relative else p["treated"] - p["control"])
    bound = confound_bound(list(got.slopes), got.dkl, got.dkl_se, level)
    read_only = confound_bound(list(got.slopes), got.dkl, 0.0, level)
    if relative:
        bound /= abs(float(p["control"].mean()))
        read_only /= abs(float(p["control"].mean()))
    return Matched(values, p, bound, "", float(target + max(0.0, got.dkl)), abs(got.dkl), note,
                   read_only)


def _empty(precondition: str, note: str) -> Matched:
    return Matched([], pd.DataFrame(), np.nan, precondition, np.nan, np.nan, note)


def _arms(part: pd.DataFrame, effect: str, compare):
    """((name, seed -> run), (name, seed -> run)) of the treated and control arms: the largest
    and smallest model of a sizes grid, or the compared algorithms; None with fewer than two."""
    if effect == SIZES_EFFECT:
        models = sorted(part["model"].dropna().unique(), key=lambda m: parameter_count(
            parse_model(m), vocab_size=100, max_length=32))
        if len(models) < 2:
            return None
        names, column = (models[-1], models[0]), "model"
    else:
        names, column = compare, ALGORITHM
    groups = [part[part[column] == name] for name in names]
    if any(g.empty for g in groups):
        return None
    return tuple((name, _seed_runs(g)) for name, g in zip(names, groups, strict=True))


def _hows(hows: tuple) -> str:
    counts = pd.Series(hows, dtype=object).value_counts()
    return ", ".join(f"{n} {how}" for how, n in counts.items()) or "no reading"


def _slope_words(slopes) -> str:
    return " / ".join(f"{s.slope:+.3g} (s.e. {s.se:.2g}, {s.points} pts)" for s in slopes)


def _plateau_effects(part: pd.DataFrame, key: str, relative: bool, level: float,
                     points: int, target: float) -> Matched:
    """steps / sgd below saturation: each run's last ``points`` checkpoints minus its first of
    them, if every run's KL is flat there (``kl_plateau``) at or below ``target``, else the
    precondition fails (still falling, or stalled above the target)."""
    runs = [run.sort_values("step") for _, run in part.groupby(RUN, sort=True)]
    flat = [kl_plateau(run, points) for run in runs]
    words = "; ".join(f"KL slope {s:+.2e}/step (s.e. {se:.1e})" for _, s, se in flat)
    if not runs or not all(f[0] for f in flat):
        falling = sum(not f[0] for f in flat)
        return _empty(STILL_FALLING, f"{falling}/{len(runs)} runs without a KL plateau over "
                                     f"their last {points} checkpoints: {words}")
    tails = [run.tail(points) for run in runs]
    stalled = [kl for kl in (float(_col(t, KL).mean()) for t in tails) if kl > target]
    if stalled:
        return _empty(STALLED, f"{len(stalled)}/{len(runs)} runs flat above the target KL "
                               f"{target:g} (mean KL of their last {points} checkpoints "
                               + ", ".join(f"{k:.3f}" for k in stalled) + f"): {words}")
    pairs = pd.DataFrame({
        "treated": [_col(t, key)[-1] for t in tails],
        "treated_se": [_col(t, se_key(key))[-1] for t in tails],
        "control": [_col(t, key)[0] for t in tails],
        "control_se": [_col(t, se_key(key))[0] for t in tails]})
    for name in TASK_COLUMNS:
        pairs[name] = [_first(t, arm_keys(key).get(name)) for t in tails]
    values = list(pairs["treated"] / pairs["control"] - 1 if relative
                  else pairs["treated"] - pairs["control"])
    dkl = float(np.mean([_col(t, KL)[-1] - _col(t, KL)[0] for t in tails]))
    dkl_se = float(np.nanmean([np.hypot(*_col(t, se_key(KL))[[0, -1]]) for t in tails]))
    slope = slope_on_kl(tails, float(np.mean([_col(t, KL).mean() for t in tails])), key,
                        window=np.inf)
    bound = confound_bound([slope], dkl, dkl_se, level)
    if relative:
        bound /= abs(float(pairs["control"].mean()))
    kls = np.concatenate([_col(t, KL) for t in tails])
    return Matched(values, pairs, bound, "", float(kls.max()), float(kls.max() - kls.min()),
                   f"every run's KL flat over its last {points} checkpoints: {words}")


def widen(iv, bound: float, level: float):
    """``iv`` (``analysis.uncertainty.Interval``) widened by ``bound`` on both sides, its p the
    t test of the mean shrunk toward 0 by ``bound`` (so p < 1 - level exactly when the widened
    interval excludes 0)."""
    if not (np.isfinite(bound) and np.isfinite(iv.low)):
        return iv
    q = float(stats.t.ppf(0.5 + level / 2, iv.n - 1))
    half = (iv.high - iv.low) / 2
    shrunk = max(abs(iv.mean) - bound, 0.0)
    return Interval(iv.mean, iv.low - bound, iv.high + bound, iv.n,
                    t_p_value(shrunk, half / q, iv.n), iv.seed_half, iv.se_meas)


def resolution(widened, bound: float) -> float:
    """The half-width of ``widened`` (an interval ``widen`` widened by ``bound``) before the
    bound: the seeds' spread and the measurement error, what the design resolves."""
    half = (widened.high - widened.low) / 2
    return float(half - bound) if np.isfinite(bound) else float(half)


def confound_scale(paper_effect: float | None, effect: float, resolution: float = 0.0) -> float:
    """What the confound bound is judged against: |the paper's effect|; where the paper states
    a direction only, the larger of |our mean effect| and ``resolution`` (``resolution()``: the
    smallest effect the design resolves), so that a null effect read at a matched KL is not
    called unmatched for being near 0."""
    if paper_effect is not None and np.isfinite(paper_effect):
        return abs(paper_effect)
    return max(abs(effect), resolution if np.isfinite(resolution) else 0.0)


def confounded(bound: float, paper_effect: float | None, effect: float, share: float,
               resolution: float = 0.0) -> bool:
    """Whether the confound ``bound`` exceeds ``share`` x ``confound_scale``; an unknown bound
    counts as exceeding."""
    scale = confound_scale(paper_effect, effect, resolution)
    return not (np.isfinite(bound) and bound <= share * scale)
