"""The runner: trial directories, skip when done, a time budget that pauses and resumes exactly,
and no resuming a trial whose settings changed."""

import json

import pytest

from analysis.trials import load_trials  # noqa: E402
from flatlm.experiments.paper import build  # noqa: E402
from flatlm.experiments.runner import Budget, run_experiment, trial_dir  # noqa: E402
from flatlm.storage.metrics_log import read_metrics  # noqa: E402
from tests.experiments.fastcfg import FAST  # noqa: E402


def steps_experiment(**extra):
    return build("steps", protocol="paper", seeds=(0,), overrides={**FAST, **extra})


def measured(out):
    return {step: {k: v for k, v in row.items() if not k.startswith("time/")}
            for step, row in read_metrics(out).items()}


def test_budget_pauses_after_a_checkpoint_and_the_resumed_trial_equals_an_uninterrupted_one(
        tmp_path):
    exp = steps_experiment()
    states = []
    ticks = iter([0.0, 0.0])  # the budget starts and the trial starts; then it is spent
    budget = Budget(1.0, clock=lambda: next(ticks, 9.0))
    done = run_experiment(exp, tmp_path / "a", budget=budget,
                          on_trial=lambda name, state: states.append(state))
    assert not done and states == ["start", "paused"]
    out = trial_dir(tmp_path / "a", exp, "seed0")
    assert set(read_metrics(out)) == {0}  # stopped after the first checkpoint
    assert set(load_trials(tmp_path / "a")["status"]) == {"RUNNING"}  # the report leaves it out
    assert run_experiment(exp, tmp_path / "a")
    assert set(load_trials(tmp_path / "a")["status"]) == {"FINISHED"}
    assert run_experiment(exp, tmp_path / "b")
    resumed, straight = measured(out), measured(trial_dir(tmp_path / "b", exp, "seed0"))
    assert set(resumed) == {0, 3, 6} and resumed == straight  # bit for bit on the CPU


def test_finished_trials_are_skipped(tmp_path):
    exp = steps_experiment()
    assert run_experiment(exp, tmp_path)
    states = []
    assert run_experiment(exp, tmp_path, on_trial=lambda name, state: states.append(state))
    assert states == ["skip"]


def test_changed_settings_are_refused_before_any_work(tmp_path):
    assert run_experiment(steps_experiment(), tmp_path)
    changed = steps_experiment(**{"train.lr": 2e-3})
    with pytest.raises(ValueError, match="started with another config"):
        run_experiment(changed, tmp_path)
    cfg = json.loads((trial_dir(tmp_path, changed, "seed0") / "config.json").read_text())
    assert cfg["train"]["lr"] == steps_experiment().base.train.lr  # untouched


def test_a_trial_started_before_a_field_was_added_is_skipped_as_finished(tmp_path):
    """A config.json without a field added since (train.world_size) reads as its default."""
    exp = steps_experiment()
    assert run_experiment(exp, tmp_path)
    path = trial_dir(tmp_path, exp, "seed0") / "config.json"
    old = json.loads(path.read_text())
    del old["train"]["world_size"]
    path.write_text(json.dumps(old))
    states = []
    assert run_experiment(exp, tmp_path, on_trial=lambda name, state: states.append(state))
    assert states == ["skip"]


def _hold_lock(directory):
    """Another process holding ``directory``'s writer lock until its stdin closes."""
    import subprocess
    import sys
    code = ("import sys; from flatlm.storage.dirlock import writer_lock\n"
            f"with writer_lock({str(directory)!r}):\n"
            "    print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_trial_another_process_holds_is_left_to_it_and_the_others_run(tmp_path):
    # two ``flatlm replicate --jobs`` workers share a grid: each skips what the other holds
    exp = build("steps", protocol="paper", seeds=(0, 1), overrides=FAST)
    holder = _hold_lock(trial_dir(tmp_path, exp, "seed0"))
    try:
        states = []
        done = run_experiment(exp, tmp_path, on_trial=lambda n, s: states.append((n, s)))
    finally:
        holder.stdin.close()
        holder.wait()
    assert not done  # seed0 is not finished: its holder runs it
    # a trial another process holds is not said to start: the lock is taken before the word
    assert states == [("seed0", "busy (another process runs it)"),
                      ("seed1", "start"), ("seed1", "done")]
    assert not read_metrics(trial_dir(tmp_path, exp, "seed0"))
    assert run_experiment(exp, tmp_path)  # the lock released: seed0 runs, seed1 is skipped


def test_a_diverged_trial_is_recorded_reported_and_skipped_while_the_others_run(tmp_path):
    """Issue 43, item 5: a diverging trial ended ``flatlm replicate`` with a traceback, no later
    trial ran, and every rerun diverged again at the same trial."""
    from dataclasses import replace

    from flatlm.storage.diverged import divergence

    # one experiment whose first trial diverges (lr 1000) and whose second runs (lr 1e-3)
    exp = replace(steps_experiment(), grid={"train.seed": [0], "train.lr": [1000.0, 0.001]})
    states = []
    assert run_experiment(exp, tmp_path, on_trial=lambda name, state: states.append(state))
    (bad, _), (good, cfg) = [(trial_dir(tmp_path, exp, name), cfg) for name, cfg in exp.trials()]
    assert divergence(bad)["step"] > 0 and divergence(good) is None
    assert set(cfg.train.checkpoint_steps) <= set(read_metrics(good))  # it ran to its end
    assert [s.split()[0] for s in states] == ["start", "diverged:", "start", "done"]
    states.clear()
    run_experiment(exp, tmp_path, on_trial=lambda name, state: states.append(state))
    assert states[0].startswith("diverged at step") and states[1] == "skip"


def test_packed_trials_measure_as_unpacked_ones_and_say_so(tmp_path):
    """``pack=3``: four trials (adamw and noreg, two seeds, one shape) run as a pack of three
    and one alone; every trial's measurements equal the unpacked run's bit for bit (CPU)."""
    exp = build("algorithms", protocol="paper", seeds=(0, 1), algorithms=("adamw", "noreg"),
                overrides=FAST, selection_measures=False)
    states = {}
    assert run_experiment(exp, tmp_path / "packed", pack=3,
                          on_trial=lambda name, state: states.setdefault(name, []).append(state))
    assert run_experiment(exp, tmp_path / "alone")
    packed = [n for n, s in states.items() if s[0].startswith("start (a pack of 3")]
    assert len(packed) == 3 and all(s[-1] == "done" for s in states.values())
    for name, _ in exp.trials():
        assert measured(trial_dir(tmp_path / "packed", exp, name)) == measured(
            trial_dir(tmp_path / "alone", exp, name)) != {}
    with pytest.raises(ValueError, match="--pack 0"):
        run_experiment(exp, tmp_path / "packed", pack=0)
