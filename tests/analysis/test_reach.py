"""What a sweep can conclude, said first (issue 42, item 1): no direction on fewer than 2 s.e.
or at unequal loss, the ceiling named, and the command that would conclude. Hand-built tables
(``tests/analysis/glance_runs``): no Ray, no MLflow."""

import warnings

import pytest

pytest.importorskip("scipy")

from analysis.conclusion import conclusion  # noqa: E402
from analysis.correlate import Bootstrap, correlation_table  # noqa: E402
from analysis.reach import CAN, CANNOT, equal_loss  # noqa: E402
from tests.analysis.glance_runs import algorithm_runs, scaling_runs, steps_runs  # noqa: E402

A, B = "probe/A/acc_mean", "probe/B/acc_mean"
RULE = {"kl_threshold": 0.05}


def _words(df, key):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        table = correlation_table(df, key, boot=Bootstrap(50), **RULE)
    return conclusion(df, table, key, **RULE)


def _sizes_with_room(gain: float, *, seeds: int = 1, kl_gap: float = 0.0):
    """The scaling fixture moved off the ceiling: task B at 0.60 for every model, the largest
    ``gain`` above it, every run's last checkpoint at KL 0.030, and the largest model's never
    below 0.030 + ``kl_gap``; each run repeated over ``seeds`` seeds, 0.4 points apart."""
    import pandas as pd

    df = scaling_runs()
    last = df["step"] == df["step"].max()
    largest = df["model"] == df["model"].iloc[-1]
    df.loc[last, "pretrain/kl"] = 0.030
    df.loc[largest & (df["pretrain/kl"] < 0.030 + kl_gap), "pretrain/kl"] = 0.030 + kl_gap
    df["probe/B/acc_mean"] = 0.60 + gain * largest
    copies = []
    for seed in range(seeds):
        part = df.copy()
        part["run_id"] = part["run_id"] + f"_s{seed}"
        part["train.seed"] = seed
        part["probe/B/acc_mean"] += 0.004 * seed  # a spread over seeds: an s.e.
        copies.append(part)
    return pd.concat(copies, ignore_index=True)


def test_equal_loss_is_two_standard_errors():
    assert equal_loss(0.030, 0.001, 0.032, 0.001)  # 0.002 <= 2 x 0.0014
    assert not equal_loss(0.030, 0.001, 0.034, 0.001)


def test_a_one_se_difference_reads_no_direction():
    """The first-hour complaint: +0.7 points at 1.1 s.e. was read as 'the paper's direction'."""
    words = _words(_sizes_with_room(0.0088), B)  # s.e. hypot(0.008, 0.008) = 0.0113
    assert "here B +0.9 points (0.8 s.e.); within 2 s.e. of 0: no direction" in words
    assert "the paper's direction" not in words.split("Fig. 5")[0]


def test_a_large_difference_at_unequal_loss_reads_no_direction():
    words = _words(_sizes_with_room(0.10, kl_gap=0.01), B)
    assert "here B +10.0 points (8.8 s.e.); at unequal loss: no direction read" in words
    assert words.startswith(CANNOT) and "the losses are not equal" in words.split("\n\n")[0]


def test_at_equal_loss_with_seeds_and_room_the_direction_is_read_and_the_opening_says_so():
    words = _words(_sizes_with_room(0.10, seeds=2), B)
    opening = words.split("\n\n")[0]
    assert opening.startswith(CAN) and "2 runs per model" in opening
    assert "Fig. 3a (a larger model probes better at the same loss): here B +10.0" in words
    assert "the paper's direction" in words


def test_the_opening_names_what_blocks_a_conclusion_and_the_command_that_would_conclude():
    opening = _words(scaling_runs(), A).split("\n\n")[0]
    assert opening.startswith(CANNOT)
    assert "the losses are not equal" in opening and "each model ran once" in opening
    assert "task A sits at the ceiling" in opening  # 0.931: 6.9 points < 2 x 6.9
    assert "`flatlm replicate --scale testbed-v2 --experiment sizes --protocol paper" in opening
    assert "(15 trials, about " in opening and "CPU-minutes (measured)" in opening  # v2 sizes


def test_a_task_within_two_se_of_100_percent_is_the_ceiling():
    df = _sizes_with_room(0.0)
    df["probe/B/acc_mean"] = 0.998  # its s.e. 0.008
    opening = _words(df, B).split("\n\n")[0]
    assert "task B sits at the ceiling (0.998, 3 of 3 within 2 s.e. of 100%)" in opening


def test_a_steps_plateau_whose_kl_still_falls_reads_no_direction():
    words = _words(steps_runs(3), A)
    assert "the losses are not equal (the KL moved" in words.split("\n\n")[0]
    assert words.count("at unequal loss: no direction read") == 2


def test_an_adversary_left_at_a_higher_loss_gets_no_direction():
    words = _words(algorithm_runs(), B)
    claim = words.split("Table 1 (adversarial pre-training probes worse than AdamW)")[1]
    assert claim.split(". ")[0].endswith("at unequal loss: no direction read") or \
        "at unequal loss: no direction read" in claim.split("Table 2")[0]


def test_a_sweep_that_measured_no_accuracy_says_so_and_not_that_it_can_conclude():
    """A --quick sweep (measure.what=loss): no probe, so nothing about accuracy, and no advice
    to train longer for runs that are in the regime."""
    df = scaling_runs()
    df = df[[c for c in df if not c.startswith(("probe/", "random_init/", "lookup/"))]]
    words = _words(df, A)
    assert words.startswith(f"{CANNOT} task A's accuracy was not measured")
    assert "never reached the regime" not in words


def test_the_command_that_would_conclude_carries_the_time_its_dry_run_states():
    import re
    import subprocess
    import sys

    dry = subprocess.run([sys.executable, "-m", "flatlm", "replicate", "--dry-run", "--scale",
                          "testbed-v2", "--experiment", "sizes", "--protocol", "paper", "--out",
                          "unused"], capture_output=True, text=True, check=True).stdout
    trials, minutes = re.search(r"sizes: (\d+) trials, about (\d+) CPU-min", dry).groups()
    opening = _words(scaling_runs(), A).split("\n\n")[0]
    assert f"({trials} trials, about {minutes} CPU-minutes (measured)" in opening


def test_the_room_a_sweep_needs_is_its_own_tasks_effect_or_names_the_task_it_borrows():
    """Issue 53: the sizes sweep on task A read Fig. 3a's task-B +6.9 points as A's threshold."""
    import pandas as pd

    from analysis.reach import accuracy_bound, lead_effect

    assert lead_effect("algorithms", "A") == (-0.068, "A")  # Table 1 gives A its own size
    assert lead_effect("sizes", "A") == (0.069, "B")  # Fig. 8 gives A a direction only
    final = pd.DataFrame({"probe/A/acc_mean": [0.95, 0.96]}, index=["small", "large"])
    df = pd.DataFrame({"probe/A/n_test": [4000.0], "probe/A/majority_acc": [0.3]})
    bound = accuracy_bound(final, df, "probe/A/acc_mean", "sizes")
    assert bound.kind == "ceiling" and "(its task B; the paper gives this one none)" in \
        bound.words
