"""What ``flatlm trial`` ends with: where its files are, and three lines on what they show (the
pre-training loss at the last checkpoint, each task's probe accuracy beside its random-init model
and majority class, and how much of the time went to measuring)."""

from __future__ import annotations

from pathlib import Path

from flatlm.measure import ENTROPY, KL, LOSS, probe_key
from flatlm.runs.trial_progress import duration
from flatlm.storage.metrics_log import METRICS_FILE
from flatlm.train.state import find_checkpoints

QUICK_WHAT = ("loss",)  # what ``flatlm trial --quick`` measures (measure.what): the loss and KL


def closing_lines(out_dir: Path, rows: dict[int, dict], what: tuple[str, ...],
                  quick: bool) -> list[str]:
    """The files under ``out_dir`` and the summary of ``rows`` (step -> that checkpoint's
    metrics, as ``run_trial`` returns them); ``what``: the measurements that ran (the trial's
    ``measure.what``, after every ``--set``), ``quick``: whether ``--quick`` was given."""
    return [*file_lines(out_dir, rows),
            *summary_lines(rows, probed_tasks(rows), tuple(what), quick)]


def probed_tasks(rows: dict[int, dict]) -> tuple[str, ...]:
    """The tasks whose probe accuracy the last checkpoint has, in the order measured."""
    last = rows[max(rows)] if rows else {}
    return tuple(k.split("/")[1] for k in last if k.startswith("probe/")
                 and k.endswith("/acc_mean"))


def file_lines(out_dir: Path, rows: dict[int, dict]) -> list[str]:
    steps = sorted(rows)
    n_metrics = len(rows[steps[-1]]) - 1 if steps else 0  # less "step"
    checkpoints = ", ".join(p.name for p in find_checkpoints(out_dir).values())
    return [f"files in {out_dir}:",
            "  config.json     the trial's config",
            f"  {METRICS_FILE}   {n_metrics} metrics at each checkpoint (steps "
            f"{', '.join(map(str, steps))})",
            f"  checkpoints/    {checkpoints or 'none'}: model, training state, metrics.json"]


def summary_lines(rows: dict[int, dict], tasks: tuple[str, ...], what: tuple[str, ...],
                  quick: bool) -> list[str]:
    if not rows:
        return ["no checkpoint was measured"]
    step = max(rows)
    last = rows[step]
    return [pretraining_line(step, last, rows[min(rows)]),
            probe_line(step, last, tasks), time_line(rows, what, quick)]


def pretraining_line(step: int, last: dict, first: dict) -> str:
    """``loss = entropy + KL`` (nats per masked word) at the last checkpoint; the KL at the
    first beside it."""
    if LOSS not in last:
        return f"step {step}: no pre-training loss measured"
    line = f"step {step}: loss {last[LOSS]:.4g}"
    if ENTROPY in last and KL in last:
        line += f" = entropy {last[ENTROPY]:.4g} + KL {last[KL]:.4g}"
    line += " nats/word"
    if KL in first and first is not last:
        line += f" (KL {first[KL]:.4g} at step {first['step']})"
    return line


def probe_line(step: int, last: dict, tasks: tuple[str, ...]) -> str:
    """Each task's probe accuracy, then in brackets its random-init model's and the majority
    class's: a number travels with its reference points."""
    shown = []
    for task in tasks:
        acc = last.get(probe_key(task))
        if acc is None:
            continue
        refs = [f"{name} {last[key]:.3f}" for name, key in (
            ("random-init", probe_key(task, stage="random_init")),
            ("majority", probe_key(task, "majority_acc"))) if key in last]
        shown.append(f"{task} {acc:.3f}" + (f" ({', '.join(refs)})" if refs else ""))
    if not shown:
        return f"step {step}: no probe measured"
    return f"step {step} probe accuracy: " + "; ".join(shown)


def time_line(rows: dict[int, dict], what: tuple[str, ...], quick: bool) -> str:
    """Training and measuring time over the checkpoints, measuring's share of their sum and
    what was measured (``what``); where measuring took longer, the cheaper mode, in words
    true of the run: none when it measured the loss only, and when ``--quick`` was given
    (``quick``) but a ``--set measure.what`` overrode it, that."""
    measure_s = sum(r.get("time/measure_s", 0.0) for r in rows.values())
    train_s = sum(r.get("time/train_s", 0.0) for r in rows.values())
    total = measure_s + train_s
    share = f"{measure_s / total:.0%} of the time: " if total > 0 else ""
    return (f"time: training {duration(train_s)}, measuring {duration(measure_s)} ({share}"
            f"{', '.join(what)}){_cheaper(what, quick) if measure_s > train_s else ''}; the "
            f"row of every checkpoint is in {METRICS_FILE}")


def _cheaper(what: tuple[str, ...], quick: bool) -> str:
    if tuple(what) == QUICK_WHAT:
        return ""
    if quick:
        return "; --set measure.what overrode --quick (the loss and KL only)"
    return "; --quick measures the loss and KL only"
