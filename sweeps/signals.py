"""A stop the user asks for (SIGINT, SIGTERM): Tune's graceful path, and how the driver learns of
it and counts what was left to do."""

from __future__ import annotations

import contextlib
import signal

from sweeps.rayenv import tune


class Interrupted(Exception):  # noqa: N818 - a stop the user asked for, not a failure
    """The sweep was stopped by SIGINT / SIGTERM; its state is saved for ``--resume``."""

    def __init__(self, signum: int, unfinished: int, killed: list[str]):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum, self.unfinished, self.killed = signum, unfinished, killed

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


_RECEIVED: list[int] = []  # signals that stopped this driver's fit (module-level: the
#   callback below is unpickled from tuner.pkl on --resume, and must still reach it)


class RecordSignals(tune.Callback):
    """Wraps the SIGINT handler Tune installs for ``fit`` so that the driver learns of the
    stop: Tune handles SIGINT gracefully and ``fit`` returns as if the sweep had ended."""

    def setup(self, **info):
        tune_handler = signal.getsignal(signal.SIGINT)
        if not callable(tune_handler):
            return

        def on_int(signum, frame):
            _RECEIVED.append(signum)
            tune_handler(signum, frame)

        signal.signal(signal.SIGINT, on_int)


@contextlib.contextmanager
def sigterm_as_sigint():
    """SIGTERM (a scheduler's stop, ``kill``) takes Tune's graceful SIGINT path: the experiment
    state is saved and ``fit`` returns. Yields the list of the signals received."""
    _RECEIVED.clear()

    def on_term(signum, frame):
        _RECEIVED.append(signum)
        signal.raise_signal(signal.SIGINT)

    old = signal.signal(signal.SIGTERM, on_term)
    try:
        yield _RECEIVED
    finally:
        signal.signal(signal.SIGTERM, old)


def count_unfinished(results) -> int:
    """Trials an interrupted ``fit`` left to do: Tune marks them TERMINATED like the finished
    ones, but only a trial that returned has its last result ``done``; errored ones excluded."""
    return sum(1 for r in results
               if not (r.metrics or {}).get("done") and r.error is None)
