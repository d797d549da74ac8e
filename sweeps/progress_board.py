"""Where each running trial of a sweep is, on the driver's console: ``[<trial>] trial 2 of 3
step 450/2000  12.3 steps/s  2 min 6 s left``, or the measurement part under way.

Tune hears of a trial only when it reports a checkpoint (minutes apart), so the steps travel
another way: each trial posts its ``flatlm.runs.trial_progress.Snapshot`` (at most every
``POST_EVERY_S``, and at once when a measurement part starts) to a small named actor, the
``ProgressBoard``, which the driver starts before the experiment (no CPU reserved: it only holds
a dict). A Tune callback on the driver (``ProgressLines``) reads the board between the
controller's steps and prints a line per running trial when it has news, and at least every
``LINE_EVERY_S`` while a trial runs, so no stretch goes silent. An actor rather than a file in the
trial directory: on a cluster the trials write on their own nodes, out of the driver's sight.
Plain lines rather than a line redrawn in place: Ray prints the workers' output on the driver's
console too, between ours, and a redraw would erase it.
"""

from __future__ import annotations

import time

from flatlm.runs.trial_progress import Snapshot, line_of
from sweeps.console import trial_label
from sweeps.rayenv import ray, tune

BOARD = "flatlm-progress"  # the board actor's name, in the sweep's Ray job
POST_EVERY_S = 2.0  # a trial's posts while training
LINE_EVERY_S = 10.0  # a running trial's line at least this often (issue 42: none silent > 30 s)
READ_EVERY_S = 1.0  # the driver's reads of the board


@ray.remote(num_cpus=0)
class ProgressBoard:
    """The last snapshot of every trial (by name), as plain dicts."""

    def __init__(self):
        self.snapshots: dict[str, dict] = {}

    def post(self, trial: str, snapshot: dict) -> None:
        self.snapshots[trial] = snapshot

    def read(self) -> dict[str, dict]:
        return self.snapshots


def start_board():
    """The sweep's board (before the experiment: its trials look it up by name)."""
    return ProgressBoard.options(name=BOARD).remote()


def poster(trial: str):
    """A trial's ``run_trial(on_progress=...)`` sink: posts to the board, at most every
    ``POST_EVERY_S`` unless what runs changed. None (no progress shown) when there is no board
    (a sweep started before it existed, resumed by an older driver)."""
    try:
        board = ray.get_actor(BOARD)
    except ValueError:
        return None
    last = {"at": 0.0, "doing": None}

    def post(snapshot: Snapshot) -> None:
        now = time.monotonic()
        if snapshot.doing == last["doing"] and now - last["at"] < POST_EVERY_S:
            return
        last.update(at=now, doing=snapshot.doing)
        board.post.remote(trial, snapshot.to_dict())  # not awaited: training never waits

    return post


class ProgressLines(tune.Callback):
    """Prints the running trials' progress lines from the board; ``n_trials``: the sweep's
    planned number of trials (``sweeps.spec.planned_trials``). Pickled with the experiment's
    state: it holds plain data only, and finds the board again after a restore."""

    def __init__(self, n_trials: int, every_s: float = LINE_EVERY_S):
        self.n_trials, self.every_s = n_trials, every_s
        self.printed: dict[str, tuple[float, dict]] = {}  # trial -> (when, snapshot)
        self.reported: dict[str, int] = {}  # trial -> the last checkpoint Tune has heard of
        self.next_read, self.board = 0.0, None

    def __getstate__(self):
        return {"n_trials": self.n_trials, "every_s": self.every_s}

    def __setstate__(self, state):
        self.__init__(**state)

    def on_trial_start(self, iteration, trials, trial, **info):
        print(f"[{trial}] trial {self._index(trials, trial)} of {self._total(trials)} started",
              flush=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.reported[trial_label(trial)] = result.get("step", -1)

    def on_step_end(self, iteration, trials, **info):
        now = time.monotonic()
        if now < self.next_read:
            return
        self.next_read = now + READ_EVERY_S
        snapshots = self._read()
        for trial in trials:
            snapshot = snapshots.get(trial_label(trial))
            if trial.status == "RUNNING" and snapshot is not None:
                self._print(trial, trials, snapshot, now)

    def _print(self, trial, trials, snapshot: dict, now: float) -> None:
        name = trial_label(trial)
        if snapshot["doing"] and snapshot["step"] <= self.reported.get(name, -1):
            return  # the board lags Tune: that checkpoint's measurement is over, reported
        when, shown = self.printed.get(name, (0.0, None))
        news = shown is None or snapshot["doing"] != shown["doing"]
        if news or now - when >= self.every_s:
            line = line_of(Snapshot(**snapshot), self._index(trials, trial), self._total(trials))
            print(f"[{trial}] {line}", flush=True)
            self.printed[name] = (now, snapshot)

    def _read(self) -> dict[str, dict]:
        try:
            self.board = self.board or ray.get_actor(BOARD)
            return ray.get(self.board.read.remote(), timeout=5)
        except (ValueError, ray.exceptions.RayError):  # a timeout is a RayError too
            self.board = None
            return {}  # no board (yet, or any more): no lines, the sweep goes on

    def _index(self, trials, trial) -> int:
        return trials.index(trial) + 1 if trial in trials else 0

    def _total(self, trials) -> int:
        return max(self.n_trials, len(trials))
