"""Issue 27's fault-injection suite, the cases that need no Ray (the sweep's are in
tests/sweeps/test_resume_trust.py): real files, real links, a real full filesystem (a tmpfs
mounted for the test where the machine allows it), a real dead MLflow port, real processes.
Each test failed before its fix; the case number is the issue's.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flatlm.cli import main as flatlm
from tests.inprocess import run_main
from tests.sweeps.sweeptools import scaling_here

REPO = Path(__file__).resolve().parents[1]
SOURCE = json.dumps({"kind": "pcfg", "random": {"vocab": 12, "depth": 2,
                                                "nonterminals_per_level": 3, "roots": 2},
                     "seed": 0})
OTHER_GRAMMAR = SOURCE.replace('"seed": 0', '"seed": 1')  # the same 12 words, another language
MODEL = "d16-h1-l1-i32"
TINY = ["--model", MODEL, "--batch-size", "8", "--warmup-steps", "0", "--no-progress",
        "--device", "cpu"]
PAGE = os.sysconf("SC_PAGE_SIZE")


def train(out, *extra, source=SOURCE):
    return flatlm(["train", "--source", source, *TINY, "--out", str(out), *extra])


def cli(args: list[str], *, limit_memory: bool = False, limit_file: int | None = None,
        env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m flatlm.cli ARGS`` in a process of its own: an allocation the fix failed to
    stop meets a 4 GiB address-space limit, not the machine's memory."""
    def limits():
        if limit_memory:
            resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        if limit_file is not None:  # writes past it fail with EFBIG (Python ignores SIGXFSZ)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file, limit_file))

    return subprocess.run([sys.executable, "-m", "flatlm.cli", *args], capture_output=True,
                          text=True, timeout=timeout, preexec_fn=limits,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


# -- 2: no write through a symbolic link ---------------------------------------------------------

@pytest.fixture
def victim(tmp_path):
    file = tmp_path / "victim.txt"
    file.write_text("keep me")
    return file


def test_2_a_planted_lock_link_is_refused_not_truncated(tmp_path, victim, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / ".flatlm.lock").symlink_to(victim)
    assert train(out, "--steps", "2") == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "keep me"


@pytest.mark.parametrize("planted", ["train_log.jsonl.tmp", "train_log.jsonl"])
def test_2_a_planted_train_log_link_is_refused_not_written_or_renamed_over(
        tmp_path, victim, capsys, planted):
    out = tmp_path / "run"
    out.mkdir()
    (out / planted).symlink_to(victim)
    assert train(out, "--steps", "2", "--log-every", "1") == 2
    assert f"{planted} is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "keep me" and (out / planted).is_symlink()


def test_2_a_planted_checkpoint_tmp_link_receives_nothing(tmp_path, capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (out / "checkpoints").mkdir(parents=True)
    elsewhere.mkdir()
    (out / "checkpoints" / "step-2.tmp").symlink_to(elsewhere, target_is_directory=True)
    assert train(out, "--steps", "2") == 2
    assert "step-2.tmp is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_2_out_a_link_to_a_directory_is_a_message(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    assert train(tmp_path / "link", "--steps", "2") == 2
    assert "--out" in capsys.readouterr().err and list(target.iterdir()) == []


@pytest.mark.parametrize("command", [
    ["replicate", "--scale", "tiny", "--experiment", "steps", "--seeds", "1"],
    ["data", "make", SOURCE, "--n", "8", "--no-progress"],
])
def test_2_replicate_and_data_refuse_an_out_that_is_a_link(tmp_path, capsys, command):
    """Issue 43, item 3: ``flatlm replicate --out LINK`` and ``flatlm data make --out LINK``
    wrote through the link."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    assert flatlm([*command, "--out", str(tmp_path / "link")]) == 2
    assert "is a symbolic link" in capsys.readouterr().err and list(target.iterdir()) == []


def test_2_the_spectral_density_is_written_never_through_a_link(tmp_path, victim):
    """Issue 43, item 3: ``flatlm measure --what density`` wrote spectral_density.json and .png
    through planted links."""
    import torch

    from flatlm.core.safe_io import LinkRefusedError
    from flatlm.measure.curvature import spectrum

    grid, phi = torch.linspace(0, 1, 5), torch.ones(5)
    link = tmp_path / "spectral_density.png"
    link.symlink_to(victim)
    with pytest.raises(LinkRefusedError):
        spectrum._plot(grid, phi, link)
    assert victim.read_text() == "keep me"
    link.unlink()
    spectrum._plot(grid, phi, link)
    assert link.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("script", ["replication", "report", "selection"])
def test_2_the_analysis_scripts_refuse_an_out_that_is_a_link(tmp_path, script):
    """Issue 43, item 3: both analysis scripts wrote their reports through a link, and a link
    --out ended in a traceback; now one line, before any work."""
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    trials = tmp_path / "trials"
    trials.mkdir()
    extra = ["--kl-threshold", "0.1"] if script != "replication" else []
    done = run_main(importlib.import_module(f"analysis.{script}").main,
                    ["--trials", trials, "--out", tmp_path / "link", *extra])
    assert done.returncode != 0 and "is a symbolic link" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and list(target.iterdir()) == []


# -- 3: credentials, any scheme case, every entry point, never echoed ------------------------

PASSWORD = "pw-issue27-planted"
UPPER = f"HTTP://alice:{PASSWORD}@127.0.0.1:5078"


@pytest.mark.parametrize("uri", [UPPER, f"Https://alice:{PASSWORD}@mlflow.example.org",
                                 f"http://alice:{PASSWORD}/x@127.0.0.1:5078"])
def test_3_a_password_in_any_scheme_case_is_refused_by_the_library(uri, tmp_path):
    from flatlm.tracking.tracker import (
        MlflowTracker,
        check_tracking_uri,
        ensure_experiment,
        find_run,
    )

    for call in (lambda: check_tracking_uri(uri), lambda: ensure_experiment(uri, "x"),
                 lambda: find_run(uri, "0", "x"),
                 lambda: MlflowTracker(uri, tmp_path, experiment_id="0")):
        with pytest.raises(ValueError, match="MLFLOW_TRACKING_PASSWORD") as e:
            call()
        assert PASSWORD not in str(e.value)
    check_tracking_uri("http://127.0.0.1:5000")  # no credentials: fine
    check_tracking_uri(f"sqlite:///{tmp_path}/a:b@c/mlflow.db")  # a path, not a password


@pytest.mark.parametrize("script", ["report", "selection"])
def test_3_the_analysis_refuses_a_password_without_echoing_it(tmp_path, script):
    done = run_main(importlib.import_module(f"analysis.{script}").main,
                    ["--experiment", "scaling", "--out", tmp_path / "r", "--tracking-uri", UPPER,
                     "--kl-threshold", "0.1"], cwd=tmp_path)
    assert done.returncode != 0 and "MLFLOW_TRACKING_PASSWORD" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    assert not (tmp_path / "r").exists()


def test_3_the_sweep_refuses_an_upper_case_password_before_ray_writes_anything(tmp_path,
                                                                             monkeypatch):
    ray_tmp = tmp_path / "rt"
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    done = scaling_here(monkeypatch, ["--tracking-uri", UPPER, "--workdir", tmp_path / "w"],
                        tmp_path)
    assert done.returncode == 2 and "MLFLOW_TRACKING_PASSWORD" in done.stderr
    assert PASSWORD not in done.stdout + done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert not any(PASSWORD.encode() in p.read_bytes() for p in written)
    assert not (tmp_path / "w" / "ray_results").exists() and not ray_tmp.exists()


# -- 4: resume and measure compare the language, not only V ----------------------------------

@pytest.mark.parametrize("other", ["dyck:8", OTHER_GRAMMAR])
def test_4_resume_on_another_language_is_refused_naming_both(tmp_path, capsys, other):
    out = tmp_path / "run"
    assert train(out, "--steps", "2") == 0
    capsys.readouterr()
    assert train(out, "--steps", "4", "--resume", source=other) == 2
    err = capsys.readouterr().err
    assert "trained on another language" in err and "'kind': 'pcfg'" in err
    assert not (out / "checkpoints" / "step-4").exists()
    assert train(out, "--steps", "4", "--resume") == 0  # its own language: resumes


def test_4_measure_on_another_grammar_of_the_same_words_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--steps", "2") == 0
    ckpt = out / "checkpoints" / "step-2"
    assert flatlm(["measure", str(ckpt), "--source", OTHER_GRAMMAR, "--what", "loss"]) == 2
    assert "trained on another language" in capsys.readouterr().err
    assert flatlm(["measure", str(ckpt), "--source", SOURCE, "--what", "loss",
                   "--n-eval", "32"]) == 0


def test_4_an_older_checkpoint_without_a_fingerprint_is_checked_by_its_spec(tmp_path, capsys):
    out = tmp_path / "run"
    assert train(out, "--steps", "2") == 0
    info_file = out / "checkpoints" / "step-2" / "flatlm.json"
    info = json.loads(info_file.read_text())
    del info["extra"]["source_fingerprint"]
    info_file.write_text(json.dumps(info))
    (out / "checkpoints" / "step-2" / "manifest.json").unlink()  # as written before manifests
    assert flatlm(["measure", str(out / "checkpoints" / "step-2"), "--source", OTHER_GRAMMAR,
                   "--what", "loss"]) == 2
    assert "trained on another language" in capsys.readouterr().err


# -- 5: divergence before the first read-out; valid JSON ---------------------------------------

def test_5_divergence_before_the_first_logged_loss_is_caught_against_log_v(tmp_path):
    """At lr 10 the loss jumps from log 12 = 2.5 to ~1500 at once and stays finite: the first
    logged loss (the mean of steps 1-10) is already diverged. Before the fix it was the only
    reference, so the run exited 0 with its diverged step-20 checkpoint."""
    out = tmp_path / "run"
    done = cli(["train", "--source", SOURCE, *TINY, "--out", str(out), "--lr", "10",
                "--steps", "20", "--log-every", "10", "--checkpoint-steps", "0,20"])
    assert done.returncode == 3, done.stderr[-2000:]
    assert "initial loss log V" in done.stderr
    from flatlm.train.state import find_checkpoints

    assert list(find_checkpoints(out)) == [0]  # the step-20 checkpoint was never written


def test_5_a_non_finite_loss_is_written_as_valid_json(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    from flatlm.tracking.tracker import MlflowTracker, default_tracking_uri, ensure_experiment
    from flatlm.train.loop import Diverged
    from sweeps import trainable

    monkeypatch.setenv("FLATLM_FINISH_WAIT_S", "5")
    uri = default_tracking_uri(tmp_path)
    trial = tmp_path / "trial"
    tracker = MlflowTracker(uri, trial, experiment_id=ensure_experiment(uri, "s"), run_name="t")
    trainable.end_diverged(tracker, trial, Diverged(7, float("nan"), "is not finite"))

    def no_constants(name):
        raise AssertionError(f"{name} is not JSON")

    row = json.loads((trial / trainable.DIVERGED_FILE).read_text(),
                     parse_constant=no_constants)
    assert row["step"] == 7 and row["loss"] is None and "nan" in row["message"]


# -- 6: a full disk is exit 5 on every path ------------------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of its own, or None where the machine does not allow a mount."""
    mount = tmp_path / "fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def leave_free(mount: Path, pages: int) -> None:
    """Fills the filesystem so that ``pages`` pages stay free."""
    stat = os.statvfs(mount)
    fill = stat.f_bavail * stat.f_frsize - pages * PAGE
    (mount / "filler").write_bytes(b"\0" * fill)
    stat = os.statvfs(mount)
    assert stat.f_bavail * stat.f_frsize == pages * PAGE


def test_6_safetensors_failing_on_a_full_disk_is_exit_5(small_fs, tmp_path):
    """The model is the first big file of a checkpoint; safetensors raises its own
    SafetensorError (neither OSError nor RuntimeError). Before: a traceback, exit 1."""
    args = ["train", "--source", SOURCE, *TINY, "--steps", "4"]
    if small_fs is not None:  # the lock, config.json and one page: no room for the model
        leave_free(small_fs, 3)
        done = cli([*args, "--out", str(small_fs / "run")])
        out = small_fs / "run"
    else:  # a file-size limit fails the same writer (EFBIG)
        done = cli([*args, "--out", str(tmp_path / "run")], limit_file=8192)
        out = tmp_path / "run"
    assert done.returncode == 5, done.stderr[-2000:]
    assert "could not write checkpoint" in done.stderr and "serializ" in done.stderr
    assert "Traceback" not in done.stderr
    assert not list(out.glob("checkpoints/*"))  # no step-4.tmp left behind


def test_6_the_training_log_failing_after_the_checkpoint_is_exit_5(small_fs):
    """The checkpoint fits (renamed into place, whole), the training log after it does not.
    Before: an OSError traceback and train_log.jsonl.tmp left behind."""
    if small_fs is None:
        pytest.skip("no tmpfs mount allowed here: a file-size limit cannot fail the small log "
                    "alone")
    # one checkpoint of the tiny model: 22 pages (measured), the lock 1, 2 pages to spare;
    # the log of 200 one-step windows needs 4
    leave_free(small_fs, 25)
    done = cli(["train", "--source", SOURCE, *TINY, "--steps", "200", "--log-every", "1",
                "--out", str(small_fs / "run")])
    assert done.returncode == 5, done.stderr[-2000:]
    assert "could not write the training log of" in done.stderr
    assert "Traceback" not in done.stderr
    run = small_fs / "run"
    assert (run / "checkpoints" / "step-200" / "model.safetensors").is_file()
    assert not (run / "train_log.jsonl.tmp").exists()


TRIAL = ["trial", "--source", SOURCE, "--no-progress", "--set", f"model={MODEL}",
         "--set", "train.batch_size=8", "--set", "train.warmup_steps=0",
         "--set", "measure.what=loss", "--set", "measure.n_eval=16"]


def test_6_flatlm_trial_ends_a_divergence_and_a_full_disk_as_flatlm_train_does(tmp_path):
    """Issue 43, items 7-8: ``flatlm trial`` exited 1 with a ``Diverged`` traceback (train: 3),
    and a full disk advised ``--resume``, an option trial does not take. One handler in
    flatlm.cli now ends both for every command."""
    diverged = cli([*TRIAL, "--out", str(tmp_path / "d"), "--set", "train.lr=10",
                    "--set", "train.steps=20", "--set", "train.log_every=10"])
    assert diverged.returncode == 3, diverged.stderr[-2000:]
    assert "training diverged" in diverged.stderr and "Traceback" not in diverged.stderr
    full = cli([*TRIAL, "--out", str(tmp_path / "f"), "--set", "train.steps=4"],
               limit_file=8192)
    assert full.returncode == 5, full.stderr[-2000:]
    assert "run the same command again" in full.stderr and "--resume" not in full.stderr
    assert "Traceback" not in full.stderr


# -- 7: a trial starting during an MLflow outage ---------------------------------------------

def test_7_a_trial_starting_during_an_outage_costs_seconds(tmp_path):
    """What ``sweeps.trainable._tracker`` does at a trial's start (find its run, open the
    tracker), against a port nothing listens on, in a fresh process with MLflow's defaults.
    Before the fix find_run ran with MLflow's 7 retries: 249 s measured."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = ("import sys, time; from flatlm.tracking.tracker import MlflowTracker, find_run; "
            "t = time.monotonic(); "
            f"run = find_run({dead!r}, '1', 'trial_0'); "
            f"tracker = MlflowTracker({dead!r}, sys.argv[1], experiment_id='1', run_id=run, "
            "run_name='trial_0'); "
            "print(f'{time.monotonic() - t:.1f}')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "trial")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    stalled = float(done.stdout.strip().splitlines()[-1])
    print(f"trial start in an outage: {stalled:.1f} s (process {time.monotonic() - start:.1f} s)")
    assert stalled < 30


# -- 8: a damaged shared evaluation cache -------------------------------------------------------

def test_8_a_truncated_eval_cache_file_is_drawn_again(tmp_path, caplog):
    from flatlm.measure.eval_cache import cached_tensors
    from flatlm.measure.run import MeasureConfig
    from flatlm.runs.trial import TrialConfig, run_trial
    from flatlm.train.config import TrainConfig

    cfg = TrialConfig(source=SOURCE, model=MODEL,
                      train=TrainConfig(steps=2, batch_size=8, warmup_steps=0,
                                        checkpoint_steps=(2,)),
                      measure=MeasureConfig(what=("loss",), n_eval=32, n_downstream=32))
    cache = tmp_path / "eval_cache"
    first = run_trial(cfg, tmp_path / "a", eval_cache=cache)
    (file,) = cache.glob("eval-*.pt")
    file.write_bytes(file.read_bytes()[:100])  # truncated: a torn copy, a full disk
    again = run_trial(cfg, tmp_path / "b", eval_cache=cache)
    assert again[2]["pretrain/loss"] == first[2]["pretrain/loss"]  # the same data, redrawn
    assert "does not load" in caplog.text and file.name in caplog.text
    key = file.name.removeprefix("eval-").removesuffix(".pt")
    assert set(cached_tensors(cache, key, lambda: pytest.fail("not cached again")))


# -- 10: bad inputs are messages before work ---------------------------------------------------

@pytest.mark.parametrize(("args", "needle"), [
    (["--source", "dyck:1000000", "--model", MODEL], "source's length"),
    (["--source", "hmm:vocab=1000000000", "--model", MODEL], "'vocab' (1000000000)"),
    (["--source", "dyck:8", "--model", "d1000000-h1-l1-i64"], "--model d1000000-h1-l1-i64"),
])
def test_10_sizes_beyond_memory_are_refused_before_allocation(tmp_path, args, needle):
    done = cli(["train", *args, "--steps", "2", "--out", str(tmp_path / "run"), "--no-progress",
                "--device", "cpu"], limit_memory=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert needle in done.stderr and "needs at least" in done.stderr
    assert "Traceback" not in done.stderr


def test_10_a_binary_grammar_file_is_named(tmp_path, capsys):
    grammar = tmp_path / "grammar.bin"
    grammar.write_bytes(bytes(range(256)) * 4)
    assert train(tmp_path / "run", "--steps", "2", source=f"pcfg:{grammar}") == 2
    err = capsys.readouterr().err
    assert str(grammar) in err and "not UTF-8 text" in err


@pytest.mark.parametrize("make", ["dangling", "file", "proc"])
def test_10_an_unusable_out_is_a_message(tmp_path, capsys, make):
    out = {"dangling": tmp_path / "dangling", "file": tmp_path / "file",
           "proc": Path("/proc/flatlm-issue27/run")}[make]
    if make == "dangling":
        out.symlink_to(tmp_path / "nowhere")
    elif make == "file":
        out.write_text("x")
    assert train(out, "--steps", "2") == 2
    err = capsys.readouterr().err
    assert f"--out {out}" in err and "Traceback" not in err
    assert not (tmp_path / "nowhere").exists()


def test_10_a_set_and_a_flag_naming_one_field_differently_is_an_error(tmp_path, capsys):
    assert train(tmp_path / "run", "--steps", "2", "--set", "train.lr=0.5", "--lr", "0.001") == 2
    assert "--set train.lr=0.5 and --lr 0.001" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert train(tmp_path / "run", "--steps", "2", "--set", "train.lr=0.001", "--lr",
                 "0.001") == 0


def test_10_no_loading_bars_under_no_progress(tmp_path):
    out = tmp_path / "run"
    base = ["train", "--source", SOURCE, *TINY, "--out", str(out)]
    assert cli([*base, "--steps", "2"]).returncode == 0
    done = cli([*base, "--steps", "4", "--resume"])  # loads the step-2 checkpoint
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Loading weights" not in done.stderr


def test_10_resume_of_a_sweep_that_does_not_exist_is_refused(tmp_path, monkeypatch):
    (tmp_path / "ray_results" / "scaling").mkdir(parents=True)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "rt"))
    done = scaling_here(monkeypatch, ["--resume", "--name", "scalng", "--workdir", tmp_path],
                        tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no sweep named 'scalng'" in done.stderr and "scaling" in done.stderr
    assert not (tmp_path / "ray_results" / "scalng").exists()
    assert not (tmp_path / "trials").exists() and not (tmp_path / "rt").exists()

