"""Time and cost before a run (issue 42, item 9): the committed table is the committed trials'
own timings, an estimate recomputes what those trials took, and ``flatlm replicate --dry-run``
says the minutes."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from flatlm.cli import main as flatlm
from flatlm.core.config import apply_overrides, from_dict
from flatlm.experiments.costs import (
    budget_line,
    checkpoint_seconds,
    compute_weight,
    cost_table,
    experiment_minutes,
    measure_prior_s,
    trial_estimate,
)
from flatlm.experiments.paper import build
from flatlm.runs.trial import TrialConfig
from tests.inprocess import run_main

ROOT = Path(__file__).resolve().parents[2]
TRIALS = ROOT / "bench" / "results" / "replication_testbed" / "trials"


def dry_run(*args: str) -> str:
    """What ``flatlm replicate --dry-run --scale testbed ARGS`` prints, run in this process (a
    subprocess would import torch for it: about 5 CPU-s)."""
    done = run_main(flatlm, ["replicate", "--dry-run", "--scale", "testbed", *args], cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_committed_table_is_the_records():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "trial_costs.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("protocol", ["paper", "paper-code"])
def test_the_estimates_sum_to_what_the_committed_trials_took(protocol):
    """The median rates, summed over a protocol's trials, give back their recorded CPU time
    within 15% (paper: 465 vs 480 min; paper-code: 542 vs 505)."""
    estimated = recorded = 0.0
    for config in (TRIALS / protocol).glob("*/*/config.json"):
        cfg = from_dict(TrialConfig, json.loads(config.read_text()))
        rows = [json.loads(line) for line in (config.parent / "metrics.jsonl").open()]
        recorded += sum(r.get("time/train_s", 0) + r.get("time/measure_s", 0) for r in rows)
        estimate = trial_estimate(cfg)
        assert estimate.how in ("measured", "nearest row")
        estimated += 60 * estimate.minutes
    assert recorded > 0
    assert abs(estimated / recorded - 1) < 0.15


def test_a_model_not_in_the_table_is_extrapolated_by_compute_and_never_on_a_gpu():
    _, base = build("steps", scale="testbed").trials()[0]
    wide = apply_overrides(base, {"model": "d192-h8-l2-i768"})  # no committed trial of it
    small, large = trial_estimate(base), trial_estimate(wide)
    assert small.how == "measured" and large.how == "extrapolated"
    assert large.minutes > small.minutes
    assert compute_weight("d192-h8-l2-i768") > 3 * compute_weight("d64-h4-l2-i256")
    assert math.isnan(trial_estimate(wide, "gpu").minutes)
    lstm = apply_overrides(base, {"model": "lstm-h64-l1"})
    assert math.isnan(trial_estimate(lstm).minutes)


def test_more_steps_cost_more_in_proportion():
    _, base = build("steps", scale="testbed").trials()[0]
    double = apply_overrides(base, {"train.steps": 20000})
    assert trial_estimate(double).minutes > trial_estimate(base).minutes
    minutes, how, unknown = experiment_minutes([("a", base), ("b", base)])
    assert minutes == pytest.approx(2 * trial_estimate(base).minutes) and unknown == 0


def test_the_dry_run_states_each_experiments_minutes_and_the_total():
    out = dry_run("--protocol", "paper", "--out", "unused")
    assert "  sizes: 15 trials, about " in out and " CPU-min (measured)" in out
    assert "in all: 35 trials, about " in out and "min on 16 cores" in out


@pytest.mark.parametrize("protocol, quoted", [
    ("paper", "the first command is about {} CPU-minutes"),
    ("paper-code", "`--protocol paper-code` about {} CPU-minutes")])
def test_the_readme_states_the_dry_runs_total(protocol, quoted):
    out = dry_run("--protocol", protocol, "--out", "unused")
    total = out.split("in all: 35 trials, about ")[1].split(" CPU-minutes")[0]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert quoted.format(total) in readme


def test_a_checkpoint_measured_on_another_downstream_size_is_scaled_by_the_sizes():
    """A row of the model's measured on 4,000 downstream sentences, read for 20,000: five times
    its seconds, and said to be the nearest row (the probe reads every sentence each epoch)."""
    _, base = build("steps", scale="testbed").trials()[0]
    bigger = apply_overrides(base, {"measure.n_downstream": 5 * base.measure.n_downstream})
    (seconds, how), (scaled, scaled_how) = checkpoint_seconds(base), checkpoint_seconds(bigger)
    assert how == "measured" and scaled_how == "nearest row"
    assert scaled == pytest.approx(5 * seconds)
    assert measure_prior_s(base, "cpu") == seconds


def test_the_budget_line_says_the_measuring_share_and_never_guesses_another_set():
    _, base = build("steps", scale="testbed").trials()[0]
    short = apply_overrides(base, {"train.steps": 200})
    line = budget_line(short, "cpu")
    n = len(short.train.checkpoint_steps)
    seconds, _ = checkpoint_seconds(short)
    share = n * seconds / (n * seconds + 200 *
                           next(r["seconds"] for r in cost_table()["train"]
                                if r["model"] == str(short.model)
                                and r["algorithm"] == short.train.algorithm))
    assert f"measuring {n} checkpoints ({share:.0%})" in line
    loss_only = apply_overrides(short, {"measure.what": ["loss"]})
    assert budget_line(loss_only, "cpu") is None  # no committed row of that set: no figure


def test_the_plan_leaves_out_the_trials_already_done_under_out(tmp_path):
    """A trial whose record holds its last checkpoint (or a recorded divergence) is skipped by
    the run, so the plan's minutes leave it out and say so."""
    exp = build("sizes", scale="testbed")
    (first, cfg), (second, _) = exp.trials()[:2]
    done = tmp_path / "paper" / "sizes" / first
    done.mkdir(parents=True)
    (done / "metrics.jsonl").write_text(json.dumps({"step": max(cfg.train.checkpoint_steps)})
                                        + "\n")
    diverged = tmp_path / "paper" / "sizes" / second
    diverged.mkdir(parents=True)
    (diverged / "diverged.json").write_text(json.dumps({"step": 10, "loss": None,
                                                        "message": "x", "reason": "x"}))
    out = dry_run("--protocol", "paper", "--experiment", "sizes", "--out", str(tmp_path))
    assert "  sizes: 15 trials, 2 done under --out, 13 left, about " in out
    assert "in all: 15 trials (2 done under --out), 13 left, about " in out
