"""Model selection without downstream labels: does picking the flattest checkpoint pick a better
model than picking the one of lowest loss (paper App. D)?

    python analysis/selection.py --experiment NAME --out DIR (--kl-threshold X | --loss-tolerance Y)
        [--tracking-uri URI] [--task B] [--selectors flat/trace_fisher,pretrain/loss]
        [--n-boot 2000] [--seed 0] [--no-log]
    python analysis/selection.py --trials DIR --out DIR --kl-threshold X

**Candidates** are the checkpoints in the saturation regime (``analysis.correlate``'s rule),
with a downstream accuracy and every selector measured. A **selector** is a metric where lower
predicts better: a flatness measure (flatter is better, the paper's claim) or the pre-training
loss (the baseline a flatness measure must beat). For each selector s, on the candidates:

- ``spearman`` / ``kendall``: rank correlation of -s with the accuracy (1: s orders the
  candidates exactly as their accuracy does; 0: no better than chance);
- ``regret``: accuracy of the best candidate minus that of the candidate s picks (its minimum;
  ties averaged): accuracy lost by trusting s instead of downstream labels;
- ``gain_vs_loss``: the loss's regret minus s's (> 0: s picks a better model than the loss).

A **random choice** is the reference row: expected regret max(acc) - mean(acc), expected rank
correlation 0. Intervals: checkpoints of one run are not independent, so each statistic's 95%
interval (and the two-sided p of ``gain_vs_loss``, none below ``MIN_RUNS`` runs) comes from a
cluster bootstrap over runs, as in ``analysis.correlate``: a resample draws runs with
replacement with all their candidates and recomputes every statistic on them (paired: every
selector on the same resample).

Writes ``selection.md`` / ``selection.csv`` / ``selection.png`` to DIR and logs them to MLflow as
the run ``selection`` of the experiment ``<experiment>.report``. ``analysis/report.py`` includes
the same section.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.correlate import MIN_RUNS, RUN, saturated, saturation_rule, to_markdown  # noqa: E402
from analysis.labels import plain_name  # noqa: E402
from analysis.output import report_dir, write_csv, write_figure, write_file  # noqa: E402
from analysis.store import (  # noqa: E402
    accuracy_key,
    load_table,
    log_report,
    refuse_password,
    report_experiment,
)
from flatlm.core.flags import COUNT, NON_NEGATIVE, POSITIVE, SEED  # noqa: E402
from flatlm.measure import HESSIAN_FISHER_GAP, LOSS  # noqa: E402

RANDOM = "random choice"
COLUMNS = ("selector", "statistic", "value", "ci_low", "ci_high", "p")
STATISTICS = ("spearman", "kendall", "regret", "gain_vs_loss")


def default_selectors(columns) -> list[str]:
    """Every flatness measure in ``columns`` (``flat/*``, not a standard error or the H - F gap,
    which is no flatness), then the pre-training loss."""
    flat = [c for c in columns if c.startswith("flat/") and not c.endswith("_se")
            and c != HESSIAN_FISHER_GAP]
    return [*flat, LOSS] if LOSS in columns else flat


def candidates(df: pd.DataFrame, acc_key: str, selectors, *, kl_threshold=None,
               loss_tolerance=None) -> pd.DataFrame:
    """The checkpoints in the regime with ``acc_key`` and every selector measured."""
    missing = [k for k in (acc_key, *selectors) if k not in df]
    if missing:
        raise ValueError(f"selectors: no column {missing} in the runs; present flatness "
                         f"columns: {default_selectors(df.columns)}")
    inside = df[saturated(df, kl_threshold=kl_threshold, loss_tolerance=loss_tolerance)]
    return inside.dropna(subset=[acc_key, *selectors])


def selection_stats(acc: np.ndarray, scores: dict[str, np.ndarray],
                    weights: np.ndarray | None = None) -> dict[tuple, np.ndarray]:
    """{(selector, statistic): values (B,)} for B weightings of the candidates; ``scores``:
    lower = picked. ``weights`` (B, n): how many times each candidate is in each sample (a
    cluster-bootstrap resample, or one row of ones: the candidates themselves). Every statistic
    equals that of the sample with each row repeated its weight times (scipy's average-rank
    Spearman and tau-b Kendall, ties averaged in the pick), without building it."""
    w = np.ones((1, len(acc))) if weights is None else np.asarray(weights, float)
    present = w > 0
    best = np.where(present, acc, -np.inf).max(axis=1)
    out = {(RANDOM, "regret"): best - (w @ acc) / w.sum(axis=1),
           (RANDOM, "spearman"): np.zeros(len(w)), (RANDOM, "kendall"): np.zeros(len(w))}
    acc_ranks, acc_signs = weighted_ranks(acc, w), np.sign(acc[:, None] - acc[None, :])
    for name, s in scores.items():
        low = np.where(present, s, np.inf)
        tie = w * (low == low.min(axis=1, keepdims=True))
        out[name, "regret"] = best - (tie @ acc) / tie.sum(axis=1)
        out[name, "spearman"] = weighted_pearson(weighted_ranks(-s, w), acc_ranks, w)
        out[name, "kendall"] = _tau_b(np.sign(s[None, :] - s[:, None]), acc_signs, w)
    if LOSS in scores:
        for name in (*scores, RANDOM):
            if name != LOSS:
                out[name, "gain_vs_loss"] = out[LOSS, "regret"] - out[name, "regret"]
    return out


def weighted_ranks(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(B, n) average ranks (1-based) of each candidate in each weighted sample."""
    below = (x[:, None] < x[None, :]).astype(float)  # [j, i]: x_j < x_i
    equal = (x[:, None] == x[None, :]).astype(float)
    return w @ below + (w @ equal + 1) / 2


def weighted_pearson(a: np.ndarray, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(B,) Pearson r of the rows of a and b (B, n), row i counted w[:, i] times; NaN where
    either is constant."""
    total = w.sum(axis=1, keepdims=True)
    ac = a - (w * a).sum(axis=1, keepdims=True) / total
    bc = b - (w * b).sum(axis=1, keepdims=True) / total
    den = np.sqrt((w * ac * ac).sum(axis=1) * (w * bc * bc).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (w * ac * bc).sum(axis=1) / den, np.nan)


def _tau_b(sx: np.ndarray, sy: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Kendall's tau-b of each weighted sample from the pairwise sign matrices (n, n)."""
    n = w.sum(axis=1)
    pairs = n * (n - 1) / 2

    def pair_sum(m):  # over unordered pairs of the expanded sample, copies of a row included
        return np.einsum("bi,ij,bj->b", w, m, w) / 2

    tied_x = pair_sum((sx == 0).astype(float)) - n / 2
    tied_y = pair_sum((sy == 0).astype(float)) - n / 2
    den = np.sqrt((pairs - tied_x) * (pairs - tied_y))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, pair_sum(sx * sy) / den, np.nan)


def selection_table(df: pd.DataFrame, acc_key: str, selectors=None, *, kl_threshold=None,
                    loss_tolerance=None, n_boot: int = 2000, level: float = 0.95,
                    seed: int = 0) -> pd.DataFrame:
    """One row per (selector, statistic): ``selector, statistic, value, ci_low, ci_high, p``
    (``p`` only for ``gain_vs_loss``). ``attrs``: ``rule``, ``level``, ``n`` candidates,
    ``runs``, ``acc_key`` and ``note`` when fewer than 2 runs leave no interval."""
    if kl_threshold is None and loss_tolerance is None:
        raise ValueError("selection needs a saturation rule: pass kl_threshold or "
                         "loss_tolerance (selection by loss outside the regime is trivial)")
    selectors = list(selectors or default_selectors(df.columns))
    if not selectors:
        raise ValueError("selectors: the runs have no flat/* or pretrain/loss column")
    rows = candidates(df, acc_key, selectors, kl_threshold=kl_threshold,
                      loss_tolerance=loss_tolerance)
    rule = saturation_rule(kl_threshold=kl_threshold, loss_tolerance=loss_tolerance, df=df)
    attrs = dict(rule=rule, level=level, n=len(rows), runs=rows[RUN].nunique(), acc_key=acc_key)
    if rows.empty:
        table = pd.DataFrame(columns=list(COLUMNS))
        table.attrs.update(attrs, note=f"no checkpoint in the regime {rule} has {acc_key} and "
                                       f"every selector: nothing to select from")
        return table
    acc = rows[acc_key].to_numpy(float)
    scores = {k: rows[k].to_numpy(float) for k in selectors}
    point = selection_stats(acc, scores)
    boot = _bootstrap(acc, scores, rows[RUN], n_boot, np.random.default_rng(seed))
    table = pd.DataFrame([_row(key, float(value[0]), boot.get(key), level)
                          for key, value in point.items()], columns=list(COLUMNS))
    order = {name: i for i, name in enumerate([*selectors, RANDOM])}
    table = table.sort_values(["selector", "statistic"], key=lambda c: c.map(
        order if c.name == "selector" else {s: i for i, s in enumerate(STATISTICS)}),
        kind="stable").reset_index(drop=True)
    table.attrs.update(attrs)
    if attrs["runs"] < MIN_RUNS:  # too few distinct resamples for a test
        table["p"] = math.nan
    if attrs["runs"] < 2:
        table.attrs["note"] = (f"only {attrs['runs']} run in the regime: no interval (runs are "
                               "the resampled units)")
    return table


def _bootstrap(acc, scores, runs, n_boot: int, rng) -> dict[tuple, np.ndarray]:
    """{(selector, statistic): finite resampled values} over ``n_boot`` cluster resamples, as
    weights: a resample draws runs with replacement, and each candidate counts as often as its
    run was drawn."""
    weights = cluster_weights(runs, n_boot, rng)
    if weights is None:
        return {}
    stats_ = selection_stats(acc, scores, weights)
    return {k: v[np.isfinite(v)] for k, v in stats_.items()}


def cluster_weights(runs, n_boot: int, rng) -> np.ndarray | None:
    """(n_boot, rows) cluster-bootstrap weights: each resample draws as many runs as there are,
    with replacement, and each row counts as often as its run was drawn (None below 2 runs).

    >>> w = cluster_weights(["a", "a", "b"], 3, np.random.default_rng(0))
    >>> bool((w[:, 0] == w[:, 1]).all() and (w[:, :2].sum(axis=1) / 2 + w[:, 2] == 2).all())
    True
    """
    codes, _ = pd.factorize(pd.Series(runs).to_numpy())
    n_runs = codes.max() + 1 if len(codes) else 0
    if n_runs < 2 or n_boot <= 0:
        return None
    drawn = rng.integers(0, n_runs, size=(n_boot, n_runs))
    counts = np.stack([np.bincount(d, minlength=n_runs) for d in drawn])  # (B, runs)
    return counts[:, codes]


def _row(key: tuple, value: float, boot: np.ndarray | None, level: float) -> tuple:
    selector, statistic = key
    lo = hi = p = math.nan
    fixed = selector == RANDOM and statistic in ("spearman", "kendall")  # 0 by definition
    if boot is not None and boot.size and not fixed:
        alpha = (1 - level) / 2
        lo, hi = (float(q) for q in np.quantile(boot, [alpha, 1 - alpha]))
        if statistic == "gain_vs_loss":
            tail = min((boot <= 0).sum(), (boot >= 0).sum())
            p = min(1.0, 2 * (tail + 1) / (boot.size + 1))
    return selector, statistic, float(value), lo, hi, p


def verdict(table: pd.DataFrame) -> str:
    """In words: which selectors pick better (or worse) models than the loss, by the intervals
    of ``gain_vs_loss``; or why the table cannot say."""
    a = table.attrs
    head = (f"{a.get('n', 0)} candidate checkpoints of {a.get('runs', 0)} runs in the regime "
            f"{a.get('rule', '')}, scored by {a.get('acc_key', 'accuracy')}.")
    if a.get("note"):
        return f"{head} {a['note']}."
    gains = table[(table.statistic == "gain_vs_loss") & (table.selector != RANDOM)]
    if gains.empty:
        return f"{head} No pre-training loss column: no comparison with selection by the loss."
    words = [head]
    for r in gains.itertuples():
        if not math.isfinite(r.ci_low):
            side = "cannot be told apart (no interval)"
        elif r.ci_low > 0:
            side = "picks better models than the loss"
        elif r.ci_high < 0:
            side = "picks worse models than the loss"
        else:
            side = "cannot be told apart from the loss"
        words.append(f"{r.selector} {side}: regret gain {r.value:+.4f} "
                     f"[{r.ci_low:+.4f}, {r.ci_high:+.4f}].")
    return " ".join(words)


def too_few_runs(table: pd.DataFrame, min_runs: int = MIN_RUNS) -> str:
    """Why a selection over ``table``'s candidates means nothing, in one line: candidates from
    fewer than ``min_runs`` runs (a ranking of three checkpoints is one of six orders); "" when
    there are enough, or none (``verdict`` says so)."""
    runs, n = table.attrs.get("runs", 0), table.attrs.get("n", 0)
    if not n or runs >= min_runs:
        return ""
    return (f"**Model selection left out:** {n} candidate checkpoint(s) of {runs} run(s) in the "
            f"regime {table.attrs.get('rule', '')}, fewer than {min_runs} runs: a ranking of "
            "so few candidates cannot be told from chance, and a cluster bootstrap over them "
            "gives no interval.")


def selection_markdown(table: pd.DataFrame, digits: int = 4) -> str:
    """The verdict, what the statistics are, and the table; below ``MIN_RUNS`` runs one line
    saying why there is none (``too_few_runs``)."""
    if why := too_few_runs(table):
        return why
    level = table.attrs.get("level", 0.95)
    intro = (f"**Model selection without downstream labels.** {verdict(table)}\n\n"
             f"Lower selector value = picked. spearman/kendall: rank correlation of -selector "
             f"with accuracy; regret: best accuracy minus the picked one's; gain_vs_loss: the "
             f"loss's regret minus the selector's (> 0: better than the loss). {level:.0%} "
             f"intervals and p from a cluster bootstrap over runs.")
    return intro + "\n\n" + to_markdown(table, digits, formats={"p": ".2g"})


def selection_figure(table: pd.DataFrame, path: Path) -> Path:
    """Two panels: each selector's Spearman and regret with their intervals, random beside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 0.5 + 0.45 * max(3, table.selector.nunique())))
    FigureCanvasAgg(fig)
    names = list(dict.fromkeys(table.selector))
    for ax, statistic in zip(fig.subplots(1, 2), ("spearman", "regret"), strict=True):
        part = table[table.statistic == statistic].set_index("selector").reindex(names)
        y = np.arange(len(names))
        # a percentile interval of a max/min statistic need not contain the point: clip
        err = np.vstack([part.value - part.ci_low, part.ci_high - part.value])
        ax.errorbar(part.value, y, xerr=np.clip(np.nan_to_num(err), 0, None), fmt="o", capsize=3)
        ax.set_yticks(y, [plain_name(n) for n in names])
        ax.locator_params(axis="x", nbins=4)  # regrets of 1e-3 crowd the axis otherwise
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_xlabel(statistic + (" (higher: better ranking)" if statistic == "spearman"
                                   else " (lower: better pick)"))
        ax.invert_yaxis()
    fig.suptitle(f"Selection by flatness vs loss; {table.attrs.get('rule', '')}")
    fig.tight_layout()
    write_figure(fig, path, dpi=110)
    return path


SELECTION_FILES = ("selection.md", "selection.csv", "selection.png")  # what write_selection writes


def write_selection(df, out: Path, acc_key: str, selectors=None, **kw) -> list[Path]:
    """``selection.md`` / ``.csv`` / ``.png`` under ``out``: the figure only with candidates
    from ``MIN_RUNS`` runs or more, the CSV's rows only then (``too_few_runs``); written whole,
    never through a link (``analysis.output``), ``out`` refused if it is one or holds one."""
    out = report_dir(out, files=SELECTION_FILES)
    table = selection_table(df, acc_key, selectors, **kw)
    if too_few_runs(table):
        table = table.iloc[:0]  # its attrs, and so its markdown, kept
    write_file(out / "selection.md", selection_markdown(table) + "\n")
    write_csv(table, out / "selection.csv")
    paths = [out / "selection.md", out / "selection.csv"]
    if len(table):
        paths.append(selection_figure(table, out / "selection.png"))
    return paths


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runs = p.add_mutually_exclusive_group(required=True)
    runs.add_argument("--experiment", help="MLflow experiment name")
    runs.add_argument("--trials", type=Path, help="a root of trial directories instead")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--tracking-uri", default=None)
    p.add_argument("--task", default=None, help="probe task (default: the first measured)")
    rule = p.add_mutually_exclusive_group(required=True)
    rule.add_argument("--kl-threshold", type=POSITIVE, default=None)
    rule.add_argument("--loss-tolerance", type=NON_NEGATIVE, default=None)
    p.add_argument("--selectors", default=None,
                   help="comma-separated metric columns, lower = picked (default: every flat/* "
                        "measure and pretrain/loss)")
    p.add_argument("--n-boot", type=COUNT, default=2000)
    p.add_argument("--seed", type=SEED, default=0)
    p.add_argument("--no-log", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:  # a password, a link for --out, no store, no such directory, no accuracy, a selector
        if args.tracking_uri:  # a password is refused, never echoed
            refuse_password(args.tracking_uri)
        args.out = report_dir(args.out, files=SELECTION_FILES)  # before any work
        df, uri = load_table(args)
        if df.empty:
            print("no runs to select from", file=sys.stderr)
            return 1
        acc_key = accuracy_key(df.columns, args.task)
        selectors = args.selectors.split(",") if args.selectors else None
        paths = write_selection(df, args.out, acc_key, selectors, n_boot=args.n_boot,
                                seed=args.seed, kl_threshold=args.kl_threshold,
                                loss_tolerance=args.loss_tolerance)
    except ValueError as e:  # one line, no traceback
        raise SystemExit(f"error: {e}") from None
    print((args.out / "selection.md").read_text())
    if uri is not None and not args.no_log:
        run_id = log_report(uri, report_experiment(args.experiment), paths,
                            {"experiment": args.experiment, "accuracy": acc_key,
                             "n_boot": args.n_boot, "seed": args.seed}, run_name="selection")
        print(f"logged to MLflow experiment {report_experiment(args.experiment)!r}, run "
              f"{run_id} ('selection')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
