"""The sweep's progress lines (``sweeps.progress_board``): the driver's callback prints a line per
running trial from the board's snapshots, at news and at least every few seconds; the key choice
of the per-checkpoint line is ``flatlm trial``'s. No Ray started here (the board is faked)."""

import pickle
import time

import pytest

pytest.importorskip("ray")

from flatlm.runs.headline import headline_keys, headline_task  # noqa: E402
from flatlm.runs.trial import measured_tasks  # noqa: E402
from flatlm.runs.trial_progress import Snapshot  # noqa: E402
from sweeps import progress_board  # noqa: E402
from sweeps.progress_board import ProgressLines  # noqa: E402
from sweeps.spec import Sweep, planned_trials, shown_metrics  # noqa: E402
from tests.sweeps.test_spec import tiny_sweep  # noqa: E402


class FakeTrial:
    def __init__(self, name: str, status: str = "RUNNING"):
        self.trial_id, self.status, self.config = name, status, {"overrides": {}}

    def __str__(self):
        return self.trial_id


def snapshot(step: int, doing: str | None = None) -> dict:
    now = time.time()
    return Snapshot(step=step, total_steps=200, start_step=0, train_s=step / 10,
                    measure_left_s=0.0, doing=doing, doing_since=now, at=now).to_dict()


def test_each_running_trial_has_a_line_at_news_and_every_few_seconds(monkeypatch, capsys):
    clock = {"t": 100.0}
    monkeypatch.setattr(progress_board.time, "monotonic", lambda: clock["t"])
    board = {}
    monkeypatch.setattr(ProgressLines, "_read", lambda self: board)
    trials = [FakeTrial("a_00000"), FakeTrial("b_00001"), FakeTrial("c_00002", "PENDING")]
    lines = ProgressLines(n_trials=3, every_s=10.0)
    board.update({"a_00000": snapshot(0, "preparing the evaluation data"),
                  "c_00002": snapshot(0)})
    for _ in range(5):  # 5 s of controller steps, one a second: a's news once, c not running
        lines.on_step_end(0, trials)
        clock["t"] += 1.0
    board["a_00000"] = snapshot(50)  # training: new
    board["b_00001"] = snapshot(20, "measuring step 0: probe (2/3)")
    for _ in range(25):
        lines.on_step_end(0, trials)
        clock["t"] += 1.0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[a_00000] trial 1 of 3  preparing the evaluation data for 0 s"
    assert printed[1] == "[a_00000] trial 1 of 3  step 50/200  10 steps/s  15 s left"
    assert printed[2].startswith("[b_00001] trial 2 of 3  measuring step 0: probe (2/3) for ")
    assert len(printed) == 3 + 2 * 2  # then each again after 10 and 20 s
    assert not [line for line in printed if line.startswith("[c_00002]")]


def test_the_callback_travels_in_the_experiment_state_without_its_board():
    lines = ProgressLines(n_trials=4)
    lines.board, lines.printed = object(), {"x": (1.0, {})}  # a handle is not state
    restored = pickle.loads(pickle.dumps(lines))
    assert (restored.n_trials, restored.board, restored.printed) == (4, None, {})


def test_a_trial_without_a_board_runs_without_progress(monkeypatch):
    def no_board(name):
        raise ValueError(f"Failed to look up actor with name '{name}'")
    monkeypatch.setattr(progress_board.ray, "get_actor", no_board)
    assert progress_board.poster("a_00000") is None


@pytest.mark.parametrize(("overrides", "task"), [
    ({}, "A"), ({"train.algorithm": "adversarial", "train.adversarial.task": "B"}, "B")],
    ids=["first-task", "attacked-task"])
def test_the_sweep_line_shows_the_keys_flatlm_trial_shows(overrides, task):
    sweep = tiny_sweep(**overrides)
    attacked = sweep.base.train.settings("adversarial").task
    assert shown_metrics(sweep) == headline_keys(
        headline_task(measured_tasks(sweep.base), attacked)) == (
        "pretrain/loss", "pretrain/kl", "flat/trace_fisher", f"probe/{task}/acc_mean")


def test_planned_trials_count_the_grid_and_its_repeats():
    sweep = Sweep(name="t", base=tiny_sweep().base, num_samples=2,
                  space={"model": {"grid_search": ["a", "b", "c"]},
                         "train.seed": {"grid_search": [0, 1]}, "train.lr": 1e-3})
    assert planned_trials(sweep) == 12


def test_a_measurement_tune_has_heard_the_end_of_is_not_shown_again(monkeypatch, capsys):
    """The board lags Tune's result by up to a post: its snapshot of the measurement that
    result closes would read as if it still ran."""
    board = {"a_00000": snapshot(60, "measuring step 60: probe (3/3)")}
    monkeypatch.setattr(ProgressLines, "_read", lambda self: board)
    trials = [FakeTrial("a_00000")]
    lines = ProgressLines(n_trials=1)
    lines.on_trial_result(0, trials, trials[0], {"step": 60})
    lines.on_step_end(0, trials)
    assert capsys.readouterr().out == ""
