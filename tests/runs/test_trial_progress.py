"""The progress line of a running trial (``flatlm.runs.trial_progress``) and ``flatlm trial``'s
console (``flatlm.runs.console``): the pure formatting, the follower with a fake clock, and the
terminal and log renderings."""

import io
import time

import pytest

from flatlm.runs.console import CLEAR, Console
from flatlm.runs.trial_progress import Snapshot, TrialProgress, duration, line_of, progress_line


def snap(step, total, train_s, *, start=0, left=0.0, doing=None) -> Snapshot:
    return Snapshot(step=step, total_steps=total, start_step=start, train_s=train_s,
                    measure_left_s=left, doing=doing)


@pytest.mark.parametrize(("state", "doing_s", "expected"), [
    # 450 steps in 36.6 s: 12.3 steps/s; 1550 steps left at that rate: 126 s
    (snap(450, 2000, 36.6), 0.0,
     "trial 2 of 3  step 450/2000  12.3 steps/s  2 min 6 s left"),
    # no update yet: no rate to tell a time from
    (snap(0, 2000, 0.0), 0.0, "trial 2 of 3  step 0/2000  starting"),
    # resumed at 1000: the rate counts this process's 100 steps in 10 s
    (snap(1100, 2000, 10.0, start=1000), 0.0,
     "trial 2 of 3  step 1100/2000  10 steps/s  1 min 30 s left"),
    # the measurements to come add to the time left
    (snap(100, 200, 10.0, left=50.0), 0.0,
     "trial 2 of 3  step 100/200  10 steps/s  1 min 0 s left"),
    # a measurement part under way, running for 40 s
    (snap(1000, 2000, 80.0, doing="measuring step 1000: probe (3/7)"), 40.0,
     "trial 2 of 3  measuring step 1000: probe (3/7) for 40 s  ~1 min 20 s left"),
    # the first checkpoint's measurement, before any update: no time left yet
    (snap(0, 200, 0.0, doing="measuring step 0: loss (1/5)"), 3.0,
     "trial 2 of 3  measuring step 0: loss (1/5) for 3 s"),
], ids=["training", "starting", "resumed", "measurements-to-come", "measuring",
        "measuring-before-training"])
def test_progress_line(state, doing_s, expected):
    assert progress_line(2, 3, state, doing_s) == expected


@pytest.mark.parametrize(("seconds", "text"), [
    (0.2, "0 s"), (59.4, "59 s"), (60, "1 min 0 s"), (3599, "59 min 59 s"), (3600, "1 h 00 min"),
    (-3, "0 s")])
def test_duration(seconds, text):
    assert duration(seconds) == text


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_follower_shows_parts_at_once_and_steps_at_most_every_second():
    clock, shown = FakeClock(), []
    watch = TrialProgress(200, (0, 100, 200), shown.append, every_s=1.0, clock=clock, wall=clock)
    watch.preparing("preparing the evaluation data")
    watch.stepped(0)
    watch.measuring(0, "loss (1/2)")
    clock.t += 5
    watch.measuring(0, "probe (2/2)")
    clock.t += 5
    watch.measured(0, 10.0)
    for step in range(1, 101):  # 100 updates, 0.05 s each: 5 s of training
        clock.t += 0.05
        watch.stepped(step)
    assert [s.doing for s in shown[:4]] == ["preparing the evaluation data", None,
                                            "measuring step 0: loss (1/2)",
                                            "measuring step 0: probe (2/2)"]
    training = shown[4:]
    assert training[0].step == 1  # training resumed after the measurement: shown at once
    assert 5 <= len(training) <= 6  # then once a second, not once an update
    last = watch.snapshot()
    assert last.train_s == pytest.approx(5.0)  # the measurement's 10 s are not training
    assert last.measure_left_s == pytest.approx(10.0)  # one checkpoint to come (200) at 10 s
    assert line_of(last, 1, 1, now=clock.t) == (
        "trial 1 of 1  step 100/200  20 steps/s  15 s left")


def test_the_time_left_leaves_out_the_first_measurement():
    """The first checkpoint also builds the evaluation data and the reference probes."""
    clock = FakeClock()
    watch = TrialProgress(300, (0, 100, 200, 300), lambda s: None, clock=clock, wall=clock)
    watch.stepped(0)
    watch.measured(0, 60.0)
    watch.stepped(100)
    watch.measured(100, 4.0)
    watch.stepped(101)
    assert watch.snapshot().measure_left_s == pytest.approx(8.0)  # 200 and 300, 4 s each


def test_before_any_checkpoint_is_timed_the_prior_counts_and_the_one_under_way_too():
    """Issue 53 item 2: the estimate covers the measurements from the first line (the committed
    cost table's figure a checkpoint), and the last measurement's own time is not '~0 s left'."""
    clock = FakeClock()
    watch = TrialProgress(200, (100, 200), lambda s: None, clock=clock, wall=clock,
                          measure_prior_s=30.0)
    watch.stepped(0)
    assert watch.snapshot().measure_left_s == pytest.approx(60.0)  # 100 and 200, 30 s each
    watch.stepped(100)
    watch.measuring(100, "loss (1/3)")
    clock.t += 10
    assert watch.snapshot().measure_left_s == pytest.approx(20.0 + 30.0)  # 100's rest, 200
    watch.measured(100, 40.0)  # timed now: 40 s a checkpoint from here on
    watch.stepped(200)
    watch.measuring(200, "loss (1/3)")
    clock.t += 15
    assert watch.snapshot().measure_left_s == pytest.approx(25.0)  # the last one's rest
    clock.t += 30  # longer than its estimate: nothing below zero
    assert watch.snapshot().measure_left_s == 0.0
    without = TrialProgress(200, (100, 200), lambda s: None, clock=clock, wall=clock)
    without.stepped(0)
    assert without.snapshot().measure_left_s == 0.0  # no prior: counted once one is timed


def snapshot(**changes):
    now = time.time()
    return Snapshot(**{"step": 10, "total_steps": 100, "start_step": 0, "train_s": 1.0,
                       "measure_left_s": 0.0, "doing_since": now, "at": now, **changes})


def test_in_a_log_each_line_stands_alone_and_the_checkpoint_lines_go_to_stdout():
    status, out = io.StringIO(), io.StringIO()
    console = Console(2, 3, status=status, out=out, tty=False, every_s=10.0)
    console.show(snapshot())
    console.show(snapshot(step=11))  # within 10 s, nothing new runs: not drawn
    console.show(snapshot(doing="measuring step 20: probe (2/3)"))  # drawn at once
    console.say("step 20: loss=1")
    assert status.getvalue().splitlines() == [
        "trial 2 of 3  step 10/100  10 steps/s  9 s left",
        "trial 2 of 3  measuring step 20: probe (2/3) for 0 s  ~9 s left"]
    assert out.getvalue() == "step 20: loss=1\n"
    assert "\x1b" not in status.getvalue()


def test_on_a_terminal_the_line_is_redrawn_in_place_under_the_checkpoint_lines():
    status = io.StringIO()
    console = Console(status=status, out=status, tty=True)
    console.show(snapshot())
    console.say("step 20: loss=1")
    console.close()
    line = "trial 1 of 1  step 10/100  10 steps/s  9 s left"
    assert status.getvalue() == (CLEAR + line + CLEAR + "step 20: loss=1\n" + CLEAR + line
                                 + CLEAR)


def test_the_ticker_keeps_a_long_part_in_view():
    """No event comes while one measurement part runs for minutes: the ticker redraws the line
    (its time counting), so a log never goes quiet for longer than ``every_s``."""
    status = io.StringIO()
    console = Console(status=status, tty=False, every_s=0.05)
    with console.ticking():
        console.show(snapshot(doing="measuring step 0: probe (2/3)"))
        time.sleep(0.5)
    lines = status.getvalue().splitlines()
    assert len(lines) >= 4 and all("probe (2/3) for" in line for line in lines)
