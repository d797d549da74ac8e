"""``flatlm trial``'s terminal: one updating progress line (``flatlm.runs.trial_progress``)
under the checkpoints' short lines, and the files and summary it ends with
(``flatlm.runs.closing``).

On a terminal the progress line is redrawn in place every second, the time of a measurement part
under way counting; in a file or a pipe (a log) it is written as a line of its own when what runs
changes and at least every ``LOG_EVERY_S`` seconds, so a log never goes quiet for longer.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from flatlm.runs.trial_progress import Snapshot, line_of

TTY_EVERY_S = 1.0  # redraws of the line on a terminal
LOG_EVERY_S = 10.0  # a progress line in a log at least this often (issue 42: none silent > 30 s)
CLEAR = "\r\x1b[K"  # back to the line's start, erase it


class Console:
    """The progress line of trial ``trial`` of ``n_trials`` on ``status`` (stderr, as tqdm's
    bars), the other lines on ``out`` (stdout). ``show`` is a ``TrialProgress`` sink."""

    def __init__(self, trial: int = 1, n_trials: int = 1, *, status: TextIO | None = None,
                 out: TextIO | None = None, tty: bool | None = None,
                 every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.trial, self.n_trials = trial, n_trials
        self.status = status or sys.stderr
        self.out = out or sys.stdout
        self.tty = self.status.isatty() if tty is None else tty
        self.every_s = every_s or (TTY_EVERY_S if self.tty else LOG_EVERY_S)
        self.clock = clock
        self.last: Snapshot | None = None
        self.drawn = False  # a line is on the terminal, to erase before another is printed
        self.next_draw = 0.0
        self.lock = threading.Lock()

    def show(self, snapshot: Snapshot) -> None:
        """Draws ``snapshot`` now if what runs changed, else when a draw is due."""
        with self.lock:
            changed = self.last is None or snapshot.doing != self.last.doing
            self.last = snapshot
            if changed or self.clock() >= self.next_draw:
                self._draw()

    def redraw(self) -> None:
        """Draws the last snapshot again when due (the ticker's call: time keeps counting)."""
        with self.lock:
            if self.last is not None and self.clock() >= self.next_draw:
                self._draw()

    def say(self, text: str) -> None:
        """A line of its own on ``out``, above the progress line."""
        with self.lock:
            self._erase()
            print(text, file=self.out, flush=True)
            if self.tty and self.last is not None:
                self._draw()

    def close(self) -> None:
        with self.lock:
            self._erase()

    @contextmanager
    def ticking(self) -> Iterator[Console]:
        """Redraws from a daemon thread while the block runs (a measurement part may run for
        minutes between two events); erases the line after it."""
        stop = threading.Event()

        def tick():
            while not stop.wait(min(self.every_s, 1.0)):
                self.redraw()

        thread = threading.Thread(target=tick, name="progress-line", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.close()

    def _draw(self) -> None:
        line = line_of(self.last, self.trial, self.n_trials)
        if self.tty:
            self.status.write(CLEAR + line)
            self.drawn = True
        else:
            self.status.write(line + "\n")
        self.status.flush()
        self.next_draw = self.clock() + self.every_s

    def _erase(self) -> None:
        if self.drawn:
            self.status.write(CLEAR)
            self.status.flush()
            self.drawn = False
