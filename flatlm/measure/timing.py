"""The timing of a checkpoint's measurements: ``timer``, which records a measurement's wall
time as ``time/<name>_s`` and advances the console progress bar of the ``measure_model`` call
under way (``progress_bar``; quiet when not asked for, as under Ray). The bar lives in a context
variable, so the measurements (``measure.builtin``, a registered one) need not pass it along.
(Not to be confused with a running trial's progress line, ``flatlm.runs.trial_progress``.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from tqdm.auto import tqdm

# the bar of the measure_model call under way; None: no bar
_BAR: ContextVar = ContextVar("measure_progress", default=None)


@contextmanager
def progress_bar(show: bool) -> Iterator[None]:
    """A console bar (tqdm) for the block when ``show``; none otherwise."""
    if not show:
        token = _BAR.set(None)
        try:
            yield
        finally:
            _BAR.reset(token)
        return

    with tqdm(desc="measure", unit="part", leave=False) as bar:
        token = _BAR.set(bar)
        try:
            yield
        finally:
            _BAR.reset(token)


def showing_progress() -> bool:
    """Whether a bar is shown: inner loops (the probe's epochs) may show their own."""
    return _BAR.get() is not None


@contextmanager
def timer(out: dict, name: str) -> Iterator[None]:
    """Records the wall time of the block as ``time/<name>_s`` (and names it on the bar)."""
    bar = _BAR.get()
    if bar is not None:
        bar.set_description_str(f"measure {name}")
    start = time.perf_counter()
    yield
    record(out, name, time.perf_counter() - start)


def record(out: dict, name: str, seconds: float) -> None:
    """``out["time/<name>_s"] = seconds``, and one part done on the bar."""
    out[f"time/{name}_s"] = seconds
    bar = _BAR.get()
    if bar is not None:
        bar.update()
