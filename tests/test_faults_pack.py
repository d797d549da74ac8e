"""Issue 52's hostile-user probe, the packs and the processes beside a training: real
``flatlm`` processes, killed with SIGKILL at a chosen point (a patch in the killed process
itself sends the signal, so the point is exact), real damaged files. Each test failed before its
fix; the item number is the issue's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flatlm.cli import main as flatlm
from flatlm.storage.metrics_log import METRICS_FILE, read_metrics
from tests.experiments.fastcfg import fast_set_flags

# three trials of one shape (seeds 0-2), steps 6, checkpoints 0, 3, 6, the loss alone measured
MEMBERS = ("seed0", "seed1", "seed2")
REPLICATE = ["replicate", "--scale", "tiny", "--experiment", "steps", "--protocol", "paper",
             "--seeds", "3", "--pack", "3", *fast_set_flags(), "--set", 'measure.what=["loss"]']


def replicate_killed(out: Path, patch: str) -> subprocess.CompletedProcess:
    """``flatlm replicate`` (REPLICATE) in a process of its own, ``patch`` run first (it sends
    the process SIGKILL where the test wants it)."""
    code = f"import os, signal, sys\n{patch}\nfrom flatlm.cli import main\n" \
           "sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *REPLICATE, "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def member(out: Path, name: str) -> Path:
    return out / "paper" / "steps" / name


def rows_per_step(trial: Path) -> Counter:
    """How many rows of each step ``metrics.jsonl`` holds."""
    return Counter(json.loads(line)["step"] for line in (trial / METRICS_FILE).open())


def untimed(trial: Path) -> dict:
    return {s: {k: v for k, v in r.items() if not k.startswith("time/")}
            for s, r in read_metrics(trial).items()}


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The three trials run once, never stopped: what every recovered run must equal."""
    out = tmp_path_factory.mktemp("straight")
    assert flatlm([*REPLICATE, "--out", str(out)]) == 0
    return out


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


# -- 2: a metrics row written once whatever the resume path -----------------------------------

# killed after seed0's step-3 files, before seed1's: seed0 one checkpoint ahead of the others
KILL_MID_ROUND = """
from flatlm.train import pack
_write = pack.MemberRun.write_due_checkpoint
def _dying(self):
    _write(self)
    if self.step == 3 and self.out_dir.name == "seed0":
        os.kill(os.getpid(), signal.SIGKILL)
pack.MemberRun.write_due_checkpoint = _dying
"""
# killed as the last round starts: every member's step 3 written and measured, none's step 6
KILL_BEFORE_LAST_ROUND = """
from flatlm.train import pack
_write = pack.MemberRun.write_due_checkpoint
def _dying(self):
    if self.step == 6:
        os.kill(os.getpid(), signal.SIGKILL)
    _write(self)
pack.MemberRun.write_due_checkpoint = _dying
"""


def test_2_a_member_killed_one_checkpoint_ahead_has_each_row_once(tmp_path, straight):
    """Before: seed0's step-3 row twice (the rerun measured its newer checkpoint, then resumed
    the pack from step 0, retrained it and measured it again)."""
    out = tmp_path / "run"
    killed = replicate_killed(out, KILL_MID_ROUND)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (member(out, "seed0") / "checkpoints" / "step-3").is_dir()
    assert not (member(out, "seed1") / "checkpoints" / "step-3").exists()
    assert flatlm([*REPLICATE, "--out", str(out)]) == 0
    for name in MEMBERS:
        assert rows_per_step(member(out, name)) == {0: 1, 3: 1, 6: 1}, name
        assert untimed(member(out, name)) == untimed(member(straight, name))
        row = json.loads((member(out, name) / "checkpoints/step-3/metrics.json").read_text())
        assert row["pretrain/loss"] == read_metrics(member(out, name))[3]["pretrain/loss"]


def test_2_a_damaged_member_sends_the_pack_back_and_the_others_rows_stay_once(tmp_path,
                                                                               straight):
    """Killed between rounds, seed1's step 3 then damaged: seed1 resumes from step 0 and the
    others go back with it. Before: seed0's and seed2's steps 0 and 3 twice."""
    out = tmp_path / "run"
    killed = replicate_killed(out, KILL_BEFORE_LAST_ROUND)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    flip_last_byte(member(out, "seed1") / "checkpoints" / "step-3" / "model.safetensors")
    assert flatlm([*REPLICATE, "--out", str(out)]) == 0
    for name in MEMBERS:
        assert rows_per_step(member(out, name)) == {0: 1, 3: 1, 6: 1}, name
        assert untimed(member(out, name)) == untimed(member(straight, name))
    assert (member(out, "seed1") / "checkpoints" / "step-3.corrupt").is_dir()


# -- 3: a damaged checkpoint read only to be measured ------------------------------------------

def lose_step(trial: Path, step: int) -> None:
    """The row of ``step`` gone from metrics.jsonl and from its checkpoint's metrics.json."""
    lines = [line for line in (trial / METRICS_FILE).read_text().splitlines()
             if json.loads(line)["step"] != step]
    (trial / METRICS_FILE).write_text("".join(f"{line}\n" for line in lines))
    (trial / "checkpoints" / f"step-{step}" / "metrics.json").unlink()


# killed as the trial trains its step 3 again (set aside on the rerun before): not yet written
KILL_RETRAINING_STEP_3 = """
from flatlm.train import run
_checkpoint = run.Run.checkpoint
def _dying(self, on_checkpoint):
    if self.step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    _checkpoint(self, on_checkpoint)
run.Run.checkpoint = _dying
"""


@pytest.mark.parametrize("pending", ["alone", "in-a-pack", "killed-while-recovering"])
def test_3_a_damaged_unmeasured_checkpoint_is_set_aside_and_trained_again(tmp_path, straight,
                                                                          capsys, pending):
    """A finished pack; seed1's step 3 flipped and its measurements deleted ("in-a-pack":
    seed2's step-6 row deleted too, so both run as one pack; "killed-while-recovering": the
    first rerun killed before it wrote step 3 again). Before: every rerun exited 2 ("SHA-256
    differs from the manifest's") and nothing was set aside."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(straight, out)
    seed1 = member(out, "seed1")
    flip_last_byte(seed1 / "checkpoints" / "step-3" / "model.safetensors")
    lose_step(seed1, 3)
    if pending == "in-a-pack":
        lose_step(member(out, "seed2"), 6)
    if pending == "killed-while-recovering":
        killed = replicate_killed(out, KILL_RETRAINING_STEP_3)
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        assert not (seed1 / "checkpoints" / "step-3").exists()
    capsys.readouterr()
    assert flatlm([*REPLICATE, "--out", str(out)]) == 0, capsys.readouterr().err[-2000:]
    assert (seed1 / "checkpoints" / "step-3.corrupt").is_dir()
    for name in MEMBERS:
        assert untimed(member(out, name)) == untimed(member(straight, name)), name
        assert set(rows_per_step(member(out, name)).values()) == {1}, name



def test_3_the_background_measurer_sets_a_damaged_checkpoint_aside_for_the_rerun(tmp_path):
    """``measure_in="background"``: the follower meets a damaged checkpoint it was to measure.
    Before: ``flatlm measure --follow`` stopped at it (exit 2) on every rerun."""
    from flatlm.runs.follow import follow_trial
    from flatlm.runs.trial import run_trial
    from tests.test_trial import tiny

    cfg = tiny(**{"train.steps": 4, "train.checkpoint_steps": [0, 2, 4],
                  "measure.what": ["loss"]})
    in_process = run_trial(cfg, tmp_path / "here")
    out = tmp_path / "beside"
    run_trial(cfg, out, measure_in="background")
    flip_last_byte(out / "checkpoints" / "step-2" / "model.safetensors")
    assert sorted(follow_trial(out)) == [0, 4]  # step 2 set aside, not measured
    assert (out / "checkpoints" / "step-2.corrupt").is_dir()
    run_trial(cfg, out, measure_in="background")  # the rerun trains step 2 again
    assert sorted(follow_trial(out)) == [0, 2, 4]
    assert rows_per_step(out) == {0: 1, 2: 1, 4: 1}
    assert untimed(out) == {s: {k: v for k, v in r.items() if not k.startswith("time/")}
                            for s, r in in_process.items()}


# -- 10: one pack member diverging alone --------------------------------------------------------

def test_10_a_pack_member_diverging_at_a_checkpoint_stops_alone_as_its_trial_would(tmp_path):
    """flatlm replicate's runner, a pack of three where the lr-3 member's loss passes twice
    the initial one at step 3, a checkpoint step (finite weights). The others finish as they
    would alone; the diverged one is recorded and never retried. Before: the pack still wrote
    the diverged member's step-3 checkpoint (alone: none after step 2)."""
    from dataclasses import replace

    from flatlm.experiments.paper import build
    from flatlm.experiments.runner import run_experiment, trial_dir
    from flatlm.runs.trial import run_trial
    from flatlm.storage.diverged import divergence
    from flatlm.train.run import Diverged
    from flatlm.train.state import find_checkpoints
    from tests.experiments.fastcfg import FAST

    every_step = {**FAST, "model": "d16-h2-l1-i32", "train.algorithm": "sgd",
                  "train.warmup_steps": 0, "train.divergence_factor": 2.0, "train.log_every": 1,
                  "train.checkpoint_steps": list(range(7)), "measure.what": ["loss"]}
    exp = replace(build("steps", protocol="paper", seeds=(0,), overrides=every_step),
                  grid={"train.lr": [0.1, 3.0, 0.05]})
    states: dict[str, list[str]] = {}
    assert run_experiment(exp, tmp_path / "packed", pack=3, on_trial=lambda name, state:
                          states.setdefault(name, []).append(state))
    (good, _), (bad, bad_cfg), (other, _) = exp.trials()
    assert all(s[0].startswith("start (a pack of 3") for s in states.values())
    assert states[bad][-1].startswith("diverged:") and states[good][-1] == "done"
    with pytest.raises(Diverged) as alone:
        run_trial(bad_cfg, tmp_path / "alone")
    diverged = trial_dir(tmp_path / "packed", exp, bad)
    assert divergence(diverged)["step"] == alone.value.step == 3
    assert list(find_checkpoints(diverged)) == list(find_checkpoints(tmp_path / "alone"))
    assert untimed(diverged) == untimed(tmp_path / "alone")
    assert run_experiment(exp, tmp_path / "alone-all")  # each trial alone
    for name in (good, other):
        assert untimed(trial_dir(tmp_path / "packed", exp, name)) == untimed(
            trial_dir(tmp_path / "alone-all", exp, name)) != {}
    before = {p: p.stat().st_mtime_ns for p in diverged.rglob("*")}
    states.clear()
    run_experiment(exp, tmp_path / "packed", pack=3, on_trial=lambda name, state:
                   states.setdefault(name, []).append(state))
    assert states[bad] == ["diverged at step 3 (recorded in diverged.json; delete the "
                           "directory to run it again)"] and states[good] == ["skip"]
    assert {p: p.stat().st_mtime_ns for p in diverged.rglob("*")} == before  # not retried

# -- processes beside the training: a batch worker (7), the background measurer (10) ------------

SOURCE = json.dumps({"kind": "pcfg", "random": {"vocab": 12, "depth": 2,
                                                "nonterminals_per_level": 3, "roots": 2},
                     "seed": 0})
TINY_TRAIN = ["--source", SOURCE, "--model", "d16-h1-l1-i32", "--batch-size", "8",
              "--warmup-steps", "0", "--no-progress", "--device", "cpu"]


def start(args: list[str]) -> subprocess.Popen:
    """``python -m flatlm ARGS`` started, its output in pipes."""
    return subprocess.Popen([sys.executable, "-m", "flatlm", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def children(pid: int) -> dict[int, str]:
    """pid -> command line of every child of process ``pid``."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except FileNotFoundError:  # gone since
                continue
            out[int(child)] = cmdline.replace(b"\0", b" ").decode()
    return out


def wait_for(condition, what: str, timeout: float = 120.0):
    """Polls ``condition()`` until it returns something true; fails naming ``what``."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(0.2)
    pytest.fail(f"waited {timeout:.0f} s for {what}")


def test_7_a_killed_batch_worker_is_one_message_and_the_resume_command(tmp_path):
    """``train.prefetch_workers=processes``, one worker killed -9. Before: a BrokenProcessPool
    traceback, no ``flatlm train:`` line, no resume hint (exit 1)."""
    out = tmp_path / "run"
    trainer = start(["train", *TINY_TRAIN, "--steps", "100000", "--checkpoint-steps", "0,50",
                     "--set", "train.prefetch=1", "--set", "train.prefetch_workers=processes",
                     "--out", str(out)])
    try:
        def a_worker():
            workers = [pid for pid, cmd in children(trainer.pid).items()
                       if "spawn_main" in cmd]
            return workers if (out / "checkpoints" / "step-50").is_dir() and workers else None

        worker = wait_for(a_worker, "a prefetch worker and the step-50 checkpoint")[0]
        os.kill(worker, signal.SIGKILL)
        _, err = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    assert trainer.returncode == 6, err[-2000:]
    assert "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("flatlm train:")]
    assert "batch" in line and "the same command with --resume" in line
    done = subprocess.run([sys.executable, "-m", "flatlm", "train", *TINY_TRAIN, "--steps", "60",
                           "--checkpoint-steps", "0,50,60", "--resume", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "unreadable" not in done.stderr  # resumed from its step-50 checkpoint, intact


QUICK_TRIAL = ["trial", "--quick", "--measure-in", "background", "--no-progress",
               "--eval-cache", "none", "--source", SOURCE,
               "--set", "model=d16-h1-l1-i32", "--set", "train.batch_size=8",
               "--set", "train.warmup_steps=0", "--set", "measure.n_eval=16"]


def background_trial(out: Path, steps: int, every: int) -> list[str]:
    checkpoints = json.dumps(list(range(0, steps + 1, every)))
    return [*QUICK_TRIAL, "--set", f"train.steps={steps}",
            "--set", f"train.checkpoint_steps={checkpoints}", "--out", str(out)]


def follower_of(trainer: subprocess.Popen) -> int | None:
    found = [pid for pid, cmd in children(trainer.pid).items() if "--follow" in cmd]
    return found[0] if found else None


@pytest.mark.slow  # about a minute: two trainings of 2,000 steps beside their measurers
@pytest.mark.parametrize("killed", ["measurer", "trainer"])
def test_10_a_killed_background_process_is_recovered_by_a_rerun(tmp_path, killed):
    """``flatlm trial --measure-in background``, the measuring process or the training one
    killed -9 once a checkpoint was measured. The rerun measures every checkpoint, each once."""
    out = tmp_path / "trial"
    args = background_trial(out, 2000, 500)
    trainer = start(args)
    try:
        follower = wait_for(lambda: follower_of(trainer), "the measuring process")
        wait_for(lambda: (out / METRICS_FILE).is_file(), "a first measured checkpoint")
        os.kill(follower if killed == "measurer" else trainer.pid, signal.SIGKILL)
        _, err = trainer.communicate(timeout=300)
    finally:
        trainer.kill()
    if killed == "measurer":  # the training goes on to its end, then says what happened
        assert trainer.returncode == 6, err[-2000:]
        assert "Traceback" not in err
        (line,) = [line for line in err.splitlines() if line.startswith("flatlm trial:")]
        assert "SIGKILL" in line and "run the same command again" in line
    else:  # the measurer, left alone, ends by itself once nothing holds the trial
        wait_for(lambda: not Path(f"/proc/{follower}").exists()
                 or "zombie" in Path(f"/proc/{follower}/status").read_text(),
                 "the orphaned measurer to stop", timeout=300)
    done = subprocess.run([sys.executable, "-m", "flatlm", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert rows_per_step(out) == {step: 1 for step in range(0, 2001, 500)}
