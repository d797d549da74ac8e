"""The few metrics a console shows per checkpoint, and that line: ``flatlm trial``'s printer and
the sweeps' ``OneLinePerResult`` both take them from here, so that the two read alike; the full
record of every checkpoint stays in ``metrics.jsonl``. Also the rounded columns the MLflow runs
table leads with (:func:`display_columns`).

    step 200: loss=4.129  kl=0.4355  trace_fisher=676.9  B/acc_mean=0.9862
"""

from __future__ import annotations

from flatlm.measure import KL, LOSS, TRACE_FISHER, TRACE_HESSIAN, probe_key


def headline_task(tasks: tuple[str, ...], attacked: str | None = None) -> str | None:
    """The downstream task a run is judged on: the one its adversary attacks
    (``train.adversarial.task``, Table 1's B) when it is measured, else the first measured;
    None when nothing is.

    >>> headline_task(("A", "B", "C")), headline_task(("A", "B"), attacked="B")
    ('A', 'B')
    """
    if attacked in tasks:
        return attacked
    return tasks[0] if tasks else None


def headline_keys(task: str | None) -> tuple[str, ...]:
    """Loss, KL, Tr(F) and ``task``'s probe accuracy (none without a task)."""
    return (LOSS, KL, TRACE_FISHER) + ((probe_key(task),) if task else ())


def short_line(step: int, metrics: dict, keys: tuple[str, ...]) -> str:
    """``step N: loss=.. kl=..``: ``keys`` with their stage dropped, those ``metrics`` lack (a
    measurement that did not run) left out.

    >>> short_line(200, {"pretrain/loss": 4.1293, "pretrain/kl": 0.43551, "x": 1.0},
    ...            ("pretrain/loss", "pretrain/kl", "flat/trace_fisher"))
    'step 200: loss=4.129  kl=0.4355'
    """
    shown = "  ".join(f"{k.split('/', 1)[-1]}={metrics[k]:.4g}" for k in keys
                      if isinstance(metrics.get(k), int | float))
    return f"step {step}: {shown}"


def display_columns(tasks: tuple[str, ...]) -> dict[str, str]:
    """The MLflow runs table's rounded columns (``flatlm.tracking.ui.display_tags``): metric key
    -> the column's name, short enough for a narrow column and a valid MLflow tag name (letters,
    digits, spaces and ``_-./:``; no parentheses). Loss, KL, each task's probe accuracy, Tr(F),
    Tr(H).

    >>> list(display_columns(("A", "B")).values())
    ['loss', 'KL', 'acc A', 'acc B', 'Tr F', 'Tr H']
    """
    return {LOSS: "loss", KL: "KL", **{probe_key(t): f"acc {t}" for t in tasks},
            TRACE_FISHER: "Tr F", TRACE_HESSIAN: "Tr H"}
