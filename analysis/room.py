"""How far an accuracy can move: the *room* of an accuracy claim, its ceiling and floor, the
s.e. of an accuracy at the bounds, and the logit scale reported beside the points.

A probe accuracy lies between the task's majority-class share (a probe that learned nothing
reaches it) and its *ceiling*: 1 where the labels are a function of the sentence, else the exact
Bayes accuracy on the probe's test sentences, E_x[max_y Pr(label = y | x)] (an HMM's rule
``sampled`` labels by the hidden state the sampler drew; the runs record it as
``<stage>/<task>/bayes_ceiling``, absent = 1). A claim that an arm probes *better* (the paper's
effect > 0) needs room above the compared (control) arm; one that it probes *worse* needs room
between the control and the majority share. Where there is none, "no effect as large as the
paper's" could not have come out otherwise, so the rule (``analysis/claims.py``) reads the claim
at its bound instead.

- **Room** (means over seeds): ceiling - control for "better"; control - majority for "worse".
- **Bound**: ``ceiling`` for "better" (``floor`` for "worse") when room < ``room_factor`` x
  |paper's effect| (default 2: an effect of the paper's size, and as much again of spread,
  must fit); else ``ceiling`` when either arm's mean is within ``bound_se`` (default 2) of its
  s.e. of the ceiling, ``floor`` when within ``bound_se`` s.e. of the majority share. The
  ceiling and the majority share are the control's (the treated arm's where the control has
  none; the mean over seeds). An arm's s.e. is
  sqrt(sd^2 / n + se_acc^2): its seed spread (sd the sample standard deviation over seeds, n - 1
  in its denominator) and its mean measurement s.e. "Within" is <= (an arm exactly at the bound
  is at it); the ceiling is checked before the floor, arm by arm, treated first. ``bound`` is the
  room check's result whichever step of the rule decides the verdict. A room that cannot
  be computed (no majority share in the runs) is not checked; a claim with a direction only is
  checked by its arms alone.
- **An accuracy's s.e.** is the measured one (``<stage>/<task>/acc_se``: test-set sampling and
  the probe seeds), at least the binomial s.e. at the Laplace-smoothed accuracy,
  sqrt(p~ (1 - p~) / n), p~ = (p n + 1) / (n + 2), n the test sentences: the plug-in binomial
  s.e. is 0 at 100%, which would call a perfect score exact.
- **Logit scale**: each accuracy effect is also given as the change in the empirical logit
  log((p n + 1/2) / ((1 - p) n + 1/2)) (finite at 0 and 100%; the plain logit where n is not
  recorded), its s.e. by the delta method. The logit, not the error rate, because it treats
  the ceiling and the floor alike (the "worse" claims sit near the floor's side of it): near
  either bound a point counts for more than at 50%.

>>> round(room(+1, control=0.999, majority=0.4), 3), round(room(-1, control=0.999, majority=0.4), 3)
(0.001, 0.599)
>>> pairs = pd.DataFrame({"treated": [0.999, 0.998, 1.0], "control": [1.0, 0.999, 1.0],
...     "treated_se": [0.001] * 3, "control_se": [0.0] * 3, "majority": [0.4] * 3,
...     "n_test": [800.0] * 3})
>>> room_check(pairs, +1, 0.069)[0]  # room 0.0003 < 2 x 0.069
'ceiling'
>>> room_check(pairs, -1, -0.069)[0]  # room 0.6, but both arms sit within 2 s.e. of 100%
'ceiling'
>>> round(room(+1, control=0.85, majority=0.4, ceiling=0.9), 3)  # labels the sentence lacks
0.05
>>> round(float(logit(0.5, 800)), 6), round(float(logit(1.0, 800)), 2)
(0.0, 7.38)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flatlm.measure import BAYES_CEILING, se_key

ROOM_FACTOR = 2.0  # the paper's effect must fit this many times into the room
BOUND_SE = 2.0  # an arm this many s.e. from its ceiling (or the majority share) is at its bound
CEILING, FLOOR = "ceiling", "floor"
ACC_MEAN = "acc_mean"
ARM = ("value", "se", "majority", "ceiling", "n_test")  # one arm's columns, per seed or run
PAIR = ("treated", "treated_se", "control", "control_se", "majority", "ceiling", "n_test")
# the columns a pair takes from the control arm (else the treated one): the task's, not the arm's
TASK_COLUMNS = ("majority", "ceiling", "n_test")


def is_accuracy(key: str) -> bool:
    """A probe accuracy (``<stage>/<task>/acc_mean``, or ``lookup:<task>``)."""
    return key.endswith("/" + ACC_MEAN) or key.startswith("lookup:")


def arm_keys(key: str) -> dict[str, str]:
    """The columns one arm's value travels with: ``probe/B/acc_mean`` -> its ``acc_se``, the
    task's ``majority_acc``, ``bayes_ceiling`` and ``n_test``; any other key has its ``_se``
    only."""
    keys = {"value": key, "se": se_key(key)}
    if key.endswith("/" + ACC_MEAN):
        stem = key.removesuffix(ACC_MEAN)
        keys |= {"majority": stem + "majority_acc", "ceiling": stem + BAYES_CEILING,
                 "n_test": stem + "n_test"}
    return keys


def arm_frame(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per row of ``rows``: the arm's ``value``, ``se``, ``majority``, ``ceiling`` and
    ``n_test`` (NaN where the runs do not record it; a ceiling not recorded is 1, ``paired``)."""
    keys = arm_keys(key)
    return pd.DataFrame({name: rows[keys[name]] if keys.get(name) in rows else np.nan
                         for name in ARM}, index=rows.index)


def paired(treated: pd.DataFrame, control: pd.DataFrame) -> pd.DataFrame:
    """Two arms (``arm_frame``) aligned on their index (seed or run), as the columns ``PAIR``:
    the task's majority share, ceiling and test size are the control's, else the treated
    arm's; a ceiling neither records is 1 (labels that are a function of the sentence)."""
    both = pd.merge(treated, control, how="inner", left_index=True, right_index=True,
                    suffixes=("_t", "_c"))
    task = {name: both[name + "_c"].fillna(both[name + "_t"]) for name in TASK_COLUMNS}
    task["ceiling"] = task["ceiling"].fillna(1.0)
    return pd.DataFrame({
        "treated": both["value_t"], "treated_se": both["se_t"],
        "control": both["value_c"], "control_se": both["se_c"], **task},
        index=both.index, columns=list(PAIR))


def accuracy_se(p, se, n):
    """The measured s.e. of an accuracy p on n test sentences, at least the binomial s.e. at
    the Laplace-smoothed accuracy (module docstring); NaN where neither is known."""
    p, se, n = (np.asarray(a, dtype=float) for a in (p, se, n))
    smooth = (p * n + 1) / (n + 2)
    with np.errstate(invalid="ignore"):
        return np.fmax(se, np.sqrt(smooth * (1 - smooth) / n))


def with_accuracy_se(pairs: pd.DataFrame) -> pd.DataFrame:
    """``pairs`` with each arm's s.e. floored as an accuracy's (``accuracy_se``)."""
    return pairs.assign(
        treated_se=accuracy_se(pairs["treated"], pairs["treated_se"], pairs["n_test"]),
        control_se=accuracy_se(pairs["control"], pairs["control_se"], pairs["n_test"]))


def room(sign: int, *, control: float, majority: float, ceiling: float = 1.0) -> float:
    """How far the control's accuracy can move the paper's way: up to the task's ceiling (1,
    or the Bayes accuracy where the sentence does not determine the label) for "better"
    (``sign`` > 0), down to the majority share for "worse"."""
    return ceiling - control if sign > 0 else control - majority


def task_ceiling(pairs: pd.DataFrame) -> float:
    """The ceiling of ``pairs``' task: the mean of its ``ceiling`` column, 1 where it records
    none (labels that are a function of the sentence)."""
    ceiling = pairs.get("ceiling")
    if ceiling is None or not ceiling.notna().any():
        return 1.0
    return float(ceiling.mean())


def ceiling_words(ceiling: float) -> str:
    """How the reason names the ceiling: "100%" (the report's words since issue 38), else the
    Bayes ceiling's value."""
    return "100%" if ceiling == 1.0 else f"the Bayes ceiling {ceiling:.4f}"


def arm_mean_se(values: pd.Series, ses: pd.Series) -> tuple[float, float]:
    """(mean, s.e.) of one arm over seeds: sqrt(sd^2 / n + mean measurement s.e.^2)."""
    v = values.dropna()
    if v.empty:
        return np.nan, np.nan
    spread = v.std(ddof=1) ** 2 / len(v) if len(v) > 1 else 0.0
    meas = float(ses.mean()) if ses.notna().any() else 0.0
    return float(v.mean()), float(np.sqrt(spread + meas ** 2))


def room_check(pairs: pd.DataFrame, sign: int, paper_effect: float | None,
          room_factor: float = ROOM_FACTOR, bound_se: float = BOUND_SE
          ) -> tuple[str, float, str]:
    """(``ceiling``, ``floor`` or "", the room, what decided it in words) of an accuracy
    claim's arms (``PAIR`` columns, s.e. already floored: ``with_accuracy_se``)."""
    majority = float(pairs["majority"].mean()) if pairs["majority"].notna().any() else np.nan
    ceiling = task_ceiling(pairs)
    arms = {name: arm_mean_se(pairs[name], pairs[name + "_se"])
            for name in ("treated", "control")}
    space = room(sign, control=arms["control"][0], majority=majority, ceiling=ceiling)
    words = f"room {100 * space:.2f} pts" if np.isfinite(space) else "room unknown"
    if paper_effect is not None and np.isfinite(space):
        needed = room_factor * abs(paper_effect)
        words += (f" {'<' if space < needed else '>='} {room_factor:g} x the paper's "
                  f"{100 * abs(paper_effect):.2f} pts")
        if space < needed:
            return (CEILING if sign > 0 else FLOOR), space, words
    for name, (mean, se) in arms.items():
        if ceiling - mean <= bound_se * se:
            return CEILING, space, words + f"; {name} {mean:.4f} within {bound_se:g} s.e. " \
                                           f"({se:.4f}) of {ceiling_words(ceiling)}"
        if mean - majority <= bound_se * se:
            return FLOOR, space, words + f"; {name} {mean:.4f} within {bound_se:g} s.e. " \
                                         f"({se:.4f}) of the majority share {majority:.3f}"
    return "", space, words


def logit(p, n):
    """The empirical logit of accuracy p on n test sentences (module docstring)."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        plain = np.log(p / (1 - p))
        return np.where(np.isfinite(n), np.log((p * n + 0.5) / ((1 - p) * n + 0.5)), plain)


def logit_slope(p, n):
    """d logit / dp at p (the delta method's factor)."""
    p, n = np.asarray(p, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        plain = 1 / (p * (1 - p))
        return np.where(np.isfinite(n), n / (p * n + 0.5) + n / ((1 - p) * n + 0.5), plain)


def logit_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """``pairs`` of accuracies on the logit scale, each s.e. by the delta method."""
    n = pairs["n_test"]
    return pairs.assign(
        treated=logit(pairs["treated"], n), control=logit(pairs["control"], n),
        treated_se=pairs["treated_se"] * logit_slope(pairs["treated"], n),
        control_se=pairs["control_se"] * logit_slope(pairs["control"], n))
