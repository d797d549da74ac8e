"""``flatlm replicate --jobs N``: N worker processes share one grid, each trial runs once, and
the result equals a one-process run's; the testbed's default seeds per experiment."""

import json
import re

import pytest

from flatlm.cli import build_parser, main
from flatlm.commands.replicate import experiments_from_args, worker_arguments
from flatlm.storage.metrics_log import read_metrics
from tests.experiments.fastcfg import fast_set_flags


def _measured(out):
    return {step: {k: v for k, v in row.items() if not k.startswith("time/")}
            for step, row in read_metrics(out).items()}


def test_two_workers_run_every_trial_once_and_equal_one_process(tmp_path, capfd):
    common = ["replicate", "--scale", "tiny", "--experiment", "steps", "--protocol", "paper",
                 "--seeds", "2",
              *fast_set_flags()]
    assert main([*common, "--out", str(tmp_path / "two"), "--jobs", "2"]) == 0
    log = capfd.readouterr().out
    for seed in range(2):  # started by exactly one worker; the other finds it busy or done
        assert log.count(f"paper/steps/seed{seed}: start") == 1, log
        assert log.count(f"paper/steps/seed{seed}: done") == 1, log
    assert main([*common, "--out", str(tmp_path / "one")]) == 0
    for seed in range(2):
        two = tmp_path / "two" / "paper" / "steps" / f"seed{seed}"
        one = tmp_path / "one" / "paper" / "steps" / f"seed{seed}"
        assert _measured(two) == _measured(one)  # bit for bit: one torch thread each on a CPU
        assert json.loads((two / "config.json").read_text()) == json.loads(
            (one / "config.json").read_text())


def test_one_process_trains_on_one_torch_thread_as_each_worker_does(tmp_path, monkeypatch):
    """A record from ``--jobs 1`` must rerun bit for bit where a worker's does: the CPU kernels'
    reduction order follows the thread count (a v2 trial on 2 threads: 76 of 540 metrics
    differ in the 8th digit from its rerun on 1)."""
    import torch

    import flatlm.experiments.runner as runner
    seen = []
    monkeypatch.setattr(runner, "run_experiment",
                        lambda *a, **k: seen.append(torch.get_num_threads()) or True)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["replicate", "--scale", "tiny", "--experiment", "steps", "--protocol",
                     "paper", "--seeds", "1", "--device", "cpu", "--out",
                     str(tmp_path / "one")]) == 0
        assert seen == [1] and torch.get_num_threads() == 2  # the caller's count restored
    finally:
        torch.set_num_threads(before)


def test_a_worker_gets_every_option_back():
    argv = ["replicate", "--out", "o", "--experiment", "sizes", "--protocol", "paper",
            "--scale", "testbed", "--seeds", "2", "--models", "a,b", "--minutes", "3",
            "--algorithms", "adamw,sam", "--without-selection-measures",
            "--set", "train.lr=0.1", "--jobs", "4", "--pack", "3"]
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(["replicate", *worker_arguments(args)])
    assert {**vars(again), "jobs": 4} == vars(args)
    assert again.jobs == 1


def test_the_testbed_replicates_five_seeds_of_steps_and_sizes_and_three_of_the_others():
    args = build_parser().parse_args(["replicate", "--out", "o", "--scale", "testbed",
                                      "--protocol", "paper"])
    seeds = {exp.name: sorted({cfg.train.seed for _, cfg in exp.trials()})
             for exp in experiments_from_args(args)}
    assert seeds == {"steps": [0, 1, 2, 3, 4], "sizes": [0, 1, 2, 3, 4],
                     "algorithms": [0, 1, 2], "sgd": [0, 1, 2]}
    args.seeds = 2  # --seeds wins
    assert {len({c.train.seed for _, c in e.trials()}) for e in experiments_from_args(args)} == {2}


def test_the_testbed_selection_varies_the_rate_and_takes_its_algorithms():
    """Issue 25's grid: algorithms x the scale's lrs x seeds, with every selection measure;
    --algorithms narrows it; a search cannot be run without a searcher."""
    args = build_parser().parse_args(["replicate", "--out", "o", "--scale", "testbed",
                                      "--protocol", "paper", "--experiment", "selection",
                                      "--algorithms", "adamw"])
    (exp,) = experiments_from_args(args)
    names = [name for name, _ in exp.trials()]
    assert names == [f"adamw_lr{lr}_seed{s}" for lr in ("0.0005", "0.002") for s in range(3)]
    assert {cfg.train.lr for _, cfg in exp.trials()} == {5e-4, 2e-3}
    assert {"llc", "precond", "critical", "eigen", "sharpness"} <= set(exp.base.measure.what)
    args.without_selection_measures = True  # the protocol's measurements alone
    (lean,) = experiments_from_args(args)
    assert not {"llc", "precond", "critical"} & set(lean.base.measure.what)
    assert {"eigen", "sharpness"} <= set(lean.base.measure.what)  # the selection's own
    for bad, field in ((["--experiment", "search"],
                        r"--experiment 'search' is a search \(train.lr, .* drawn by a "
                        r"searcher\): run it with python sweeps/search.py"),
                       (["--experiment", "selection", "--algorithms", "adam"], "--algorithms")):
        args = build_parser().parse_args(["replicate", "--out", "o", *bad])
        with pytest.raises(ValueError, match=field):
            experiments_from_args(args)


def test_a_killed_worker_is_named_and_ends_in_its_own_status(tmp_path, capfd):
    """Issue 43, item 6: ``--jobs 2`` with a worker killed -9 exited 247 without a word. A real
    worker is killed once it has started a trial; the survivor finishes, the command names the
    dead one, exits 6, and a rerun completes the killed trial."""
    import signal
    import subprocess
    import sys
    import time

    common = [sys.executable, "-m", "flatlm", "replicate", "--scale", "tiny",
              "--experiment", "steps",
              "--protocol", "paper", "--seeds", "2", *fast_set_flags(), "--set",
              "train.steps=600", "--set", "train.checkpoint_steps=[0,300,600]",
              "--out", str(tmp_path)]
    parent = subprocess.Popen([*common, "--jobs", "2"], stderr=subprocess.PIPE, text=True)
    children = []
    for _ in range(600):  # the workers, once one holds a trial's lock
        found = subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True,
                               text=True).stdout.split()
        if len(found) == 2 and list(tmp_path.glob("paper/steps/*/.flatlm.lock")):
            children = [int(p) for p in found]
            break
        time.sleep(0.1)
    assert children, "the workers did not start"
    time.sleep(1.0)
    import os

    os.kill(children[0], signal.SIGKILL)
    _, err = parent.communicate(timeout=600)
    assert parent.returncode == 6, err[-2000:]
    assert f"worker {children[0]} was killed by SIGKILL" in err
    assert main(["replicate", "--scale", "tiny", "--experiment", "steps", "--protocol", "paper",
                 "--seeds", "2",
                 *fast_set_flags(), "--set", "train.steps=600", "--set",
                 "train.checkpoint_steps=[0,300,600]", "--out", str(tmp_path)]) == 0


def test_each_trial_says_where_it_is_among_all_of_the_command(tmp_path, capfd):
    """Issue 42: trial n of N over every experiment the command runs, with its step and rate."""
    assert main(["replicate", "--scale", "tiny", "--experiment", "steps", "--protocol", "paper",
                 "--seeds", "2",
                 *fast_set_flags(), "--out", str(tmp_path)]) == 0
    err = capfd.readouterr().err.splitlines()
    for n in (1, 2):
        assert any(line.startswith(f"trial {n} of 2  measuring step 0: ") for line in err)
        assert any(re.match(rf"trial {n} of 2  step \d+/\d+  [\d.]+ steps/s  ", line)
                   for line in err)


def test_a_bad_pack_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # the parser of numeric flags (flatlm.core.flags)
        main(["replicate", "--out", str(tmp_path / "o"), "--pack", "0"])
    assert e.value.code == 2
    assert "argument --pack: 0 is out of range: give a whole number >= 1" in \
        capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_pack_defaults_to_off_on_a_cpu_and_on_on_cuda_and_help_says_so(capsys):
    from flatlm.runs.pack_size import CUDA_PACK, default_pack_size

    assert (default_pack_size("cpu"), default_pack_size("cuda:0")) == (1, CUDA_PACK)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["replicate", "--help"])
    words = " ".join(capsys.readouterr().out.split())
    assert "default: 1 (off) on a CPU" in words and f"{CUDA_PACK} on CUDA" in words
