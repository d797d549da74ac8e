"""Where a running trial is, as one line: ``trial 2 of 3  step 450/2000  12.3 steps/s  2 min 6 s
left``, or ``trial 2 of 3  measuring step 1000: probe (3/7) for 40 s  ~2 min 6 s left``.

``TrialProgress`` follows one trial (``run_trial`` feeds it: the steps, the checkpoint
measurements part by part) and hands plain-data ``Snapshot``\\ s to a sink: ``flatlm trial``'s
console (``flatlm.runs.console``) or, in a sweep, the trial's post to the driver, which draws the
lines of every running trial (``sweeps.progress_board``). ``progress_line`` is the pure formatting.
No Ray, no MLflow here.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """A running trial at one moment, JSON-able (it travels between processes)."""

    step: int  # updates done
    total_steps: int  # train.steps
    start_step: int  # the step this process started training at (a resume: after 0)
    train_s: float  # seconds spent training since start_step (measuring left out)
    measure_left_s: float  # estimated seconds of the checkpoints still to measure
    doing: str | None = None  # None while training; else "measuring step 1000: probe (3/7)"
    doing_since: float = 0.0  # time.time() when ``doing`` began
    at: float = 0.0  # time.time() of the snapshot

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def duration(seconds: float) -> str:
    """``8 s``, ``2 min 6 s``, ``1 h 05 min``: a time a reader takes in at a glance.

    >>> duration(8.4), duration(126), duration(3900)
    ('8 s', '2 min 6 s', '1 h 05 min')
    """
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def progress_line(trial: int, n_trials: int, snap: Snapshot, doing_s: float = 0.0) -> str:
    """The line of trial ``trial`` (1-based) of ``n_trials`` in state ``snap``: its training
    rate since ``snap.start_step``, and the time left (the steps left at that rate, plus
    ``snap.measure_left_s``: the measurements still to come). While ``snap.doing`` runs instead
    of training (a measurement part), it has been running ``doing_s`` seconds.

    >>> at = dict(total_steps=2000, start_step=0, measure_left_s=0.0)
    >>> progress_line(2, 3, Snapshot(step=450, train_s=36.6, **at))
    'trial 2 of 3  step 450/2000  12.3 steps/s  2 min 6 s left'
    >>> progress_line(1, 1, Snapshot(step=1000, train_s=80.0, **at,
    ...                              doing="measuring step 1000: probe (3/7)"), doing_s=40)
    'trial 1 of 1  measuring step 1000: probe (3/7) for 40 s  ~1 min 20 s left'
    >>> progress_line(1, 1, Snapshot(step=0, train_s=0.0, **{**at, "measure_left_s": 500.0},
    ...                              doing="measuring step 0: probe (3/7)"), doing_s=40)
    'trial 1 of 1  measuring step 0: probe (3/7) for 40 s  ~8 min 20 s of measuring left'
    """
    head = f"trial {trial} of {n_trials}"
    step, total_steps, extra_left_s = snap.step, snap.total_steps, snap.measure_left_s
    done = step - snap.start_step
    rate = done / snap.train_s if done > 0 and snap.train_s > 0 else None
    left = None if rate is None else (total_steps - step) / rate + extra_left_s
    if snap.doing is not None:
        tail = "" if left is None else f"  ~{duration(left)} left"
        if left is None and extra_left_s > 0:  # no training yet to time: the measurements' part
            tail = f"  ~{duration(extra_left_s)} of measuring left"
        return f"{head}  {snap.doing} for {duration(doing_s)}{tail}"
    if rate is None:
        return f"{head}  step {step}/{total_steps}  starting"
    return (f"{head}  step {step}/{total_steps}  {rate:.3g} steps/s  "
            f"{duration(left)} left")


def line_of(snapshot: Snapshot, trial: int, n_trials: int, now: float | None = None) -> str:
    """``progress_line`` of a snapshot, read at ``now`` (time.time(); the time of a part under way
    keeps counting after the snapshot was taken)."""
    now = time.time() if now is None else now
    return progress_line(trial, n_trials, snapshot, doing_s=now - snapshot.doing_since)


Sink = Callable[[Snapshot], None]


class TrialProgress:
    """Follows one trial and shows a ``Snapshot`` to ``show``: at once when what runs changes
    (a measurement part starts, training resumes), else at most every ``every_s`` seconds while
    training. ``stepped`` is called after every update, so it costs one clock read.

    The time left counts the measurements still to come, the one under way included, at the
    mean time of those measured so far after the first (the first also builds the evaluation
    data and the reference probes, once a trial); before any is measured, at
    ``measure_prior_s`` a checkpoint (the committed cost table's figure,
    ``flatlm.experiments.costs.checkpoint_seconds``; None: not counted until one is)."""

    def __init__(self, total_steps: int, checkpoint_steps, show: Sink, *, every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, measure_prior_s: float | None = None):
        self.total_steps, self.checkpoints = total_steps, sorted(set(checkpoint_steps))
        self.show, self.every_s, self.clock, self.wall = show, every_s, clock, wall
        self.step, self.start_step = 0, None
        self.train_s, self.training_since = 0.0, None  # clock() while training, else None
        self.doing, self.doing_since = None, 0.0
        self.measured_s: dict[int, float] = {}
        self.measure_prior_s = measure_prior_s
        self.measuring_step, self.measuring_since = None, 0.0  # the checkpoint under way
        self.next_show = 0.0

    def preparing(self, what: str) -> None:
        """Work before training (the evaluation data): shown as what runs."""
        self._pause(what)

    def stepped(self, step: int) -> None:
        """Training is at ``step`` (the first call: where it starts or resumes)."""
        now = self.clock()
        if self.start_step is None:
            self.start_step = step
        if self.training_since is None:
            self.training_since = now
        if self.doing is not None:  # training starts, or goes on after a measurement: shown
            self.doing, self.next_show = None, 0.0
        self.step = step
        if now >= self.next_show:
            self.next_show = now + self.every_s
            self.show(self.snapshot())

    def measuring(self, step: int, part: str) -> None:
        """A part of checkpoint ``step``'s measurement starts: ``probe (3/7)``."""
        self.step = step
        if self.measuring_step != step:
            self.measuring_step, self.measuring_since = step, self.clock()
        self._pause(f"measuring step {step}: {part}")

    def measured(self, step: int, seconds: float) -> None:
        """Checkpoint ``step`` was measured in ``seconds``; training goes on from now."""
        self.measured_s[step] = seconds
        self.measuring_step = None
        self.training_since = self.clock()

    def snapshot(self) -> Snapshot:
        train_s = self.train_s
        if self.training_since is not None:
            train_s += self.clock() - self.training_since
        return Snapshot(step=self.step, total_steps=self.total_steps,
                        start_step=self.step if self.start_step is None else self.start_step,
                        train_s=train_s, measure_left_s=self._measure_left_s(),
                        doing=self.doing, doing_since=self.doing_since, at=self.wall())

    def _pause(self, doing: str) -> None:
        if self.training_since is not None:
            self.train_s += self.clock() - self.training_since
            self.training_since = None
        self.doing, self.doing_since = doing, self.wall()
        self.show(self.snapshot())

    def _measure_left_s(self) -> float:
        per = self._checkpoint_s()
        if per is None:
            return 0.0
        to_come = [s for s in self.checkpoints if s > self.step and s not in self.measured_s]
        left = len(to_come) * per
        if self.measuring_step is not None:  # the one under way: what its mean time leaves
            left += max(per - (self.clock() - self.measuring_since), 0.0)
        return left

    def _checkpoint_s(self) -> float | None:
        """Seconds a checkpoint's measurements take: the mean of those measured after the
        first (else the first), else the prior."""
        later = list(self.measured_s.values())[1:] or list(self.measured_s.values())
        return sum(later) / len(later) if later else self.measure_prior_s
