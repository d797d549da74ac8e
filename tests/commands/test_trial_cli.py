"""``flatlm trial`` (one trial, no Ray) and the one ``--set`` key space of every command."""

import json
import re

import pytest

from flatlm.cli import main
from flatlm.experiments.paper import base_of
from flatlm.sources import SourceSpec
from flatlm.storage.metrics_log import read_metrics

TINY = ["--source", "dyck:4", "--set", "model=d16-h1-l1-i32", "--set", "train.steps=4",
        "--set", "train.batch_size=8", "--set", "train.checkpoint_steps=[0,4]",
        "--set", "train.warmup_steps=1", "--set", "measure.n_eval=8",
        "--set", "measure.n_downstream=20", "--set", "measure.what=[\"loss\",\"probe\"]",
        "--set", "measure.probe.epochs=1", "--set", "measure.probe.seeds=2"]


def test_a_trial_trains_and_measures_every_checkpoint(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trial", "--out", str(out), "--no-progress", *TINY]) == 0
    printed = capsys.readouterr().out
    assert "step 0:" in printed and "step 4:" in printed
    metrics = read_metrics(out)
    assert set(metrics) == {0, 4} and "probe/g_star/acc_mean" in metrics[4]
    config = json.loads((out / "config.json").read_text())
    assert SourceSpec(config["source"]) == SourceSpec("dyck:4")
    assert config["train"]["steps"] == 4 and config["model"] == "d16-h1-l1-i32"


def test_the_trial_starts_from_the_scale_and_protocol_base(tmp_path, monkeypatch):
    seen = {}
    monkeypatch.setattr("flatlm.runs.trial.run_trial",
                        lambda cfg, out, report, **kw: seen.setdefault("cfg", cfg) and {})
    assert main(["trial", "--out", str(tmp_path), "--scale", "tiny",
                 "--protocol", "paper-code"]) == 0
    assert seen["cfg"] == base_of("tiny", "paper-code")


@pytest.mark.parametrize(("argv", "match"), [
    (["trial", "--out", "x", "--set", "lr=0.1"], "lr"),
    (["trial", "--out", "x", "--scale", "huge"], "scale='huge': use one of sweep"),
    (["train", "--model", "d16-h1-l1-i32", "--out", "x", "--set", "sam.rho=0.1"],
     "write train.sam.rho=..."),
])
def test_bad_keys_and_names_are_messages(argv, match, capsys):
    assert main(argv) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("make", ["link", "file"])
def test_an_unusable_out_is_a_message(tmp_path, capsys, make):
    """As ``flatlm train`` (issue 27): nothing is written through a link or over a file."""
    target = tmp_path / "target"
    target.mkdir()
    out = tmp_path / "out"
    if make == "link":
        out.symlink_to(target, target_is_directory=True)
    else:
        out.write_text("x")
    assert main(["trial", "--out", str(out), "--no-progress", *TINY]) == 2
    assert f"--out {out}" in capsys.readouterr().err
    assert list(target.iterdir()) == []


def test_train_and_measure_take_the_sweeps_keys():
    """A ``--set`` line copied from a sweep works in ``flatlm train`` and ``flatlm measure``."""
    from argparse import Namespace

    from flatlm.commands.train import config_from_args
    from flatlm.core.config import section_assignments

    args = Namespace(overrides=["train.sam.rho=0.2", "train.steps=7"])
    assert config_from_args(args).settings("sam").rho == 0.2
    assert section_assignments(["measure.probe.seeds=2"], "measure") == {"probe.seeds": "2"}
    with pytest.raises(ValueError, match="write measure.probe.seeds=..."):
        section_assignments(["probe.seeds=2"], "measure")


def test_a_trial_shows_its_progress_short_lines_and_where_its_files_are(tmp_path, capsys):
    """Issue 42: a line that says where the trial is (the step, its rate and the time left, or
    the measurement part under way), the sweeps' few keys per checkpoint (not every metric),
    and at the end its files and what they show."""
    out = tmp_path / "t"
    assert main(["trial", "--out", str(out), *TINY]) == 0
    captured = capsys.readouterr()
    progress = captured.err.splitlines()  # not a terminal: each line stands alone
    assert progress[0] == "trial 1 of 1  preparing the evaluation data for 0 s"
    assert any(line.startswith("trial 1 of 1  measuring step 0: loss (1/3) for") for line
               in progress)
    assert any(line.startswith("trial 1 of 1  measuring step 0: probe (2/3) for") for line
               in progress)
    assert any(re.fullmatch(r"trial 1 of 1  step \d/4  [\d.]+ steps/s  \d+ s left", line)
               for line in progress)
    printed = captured.out.splitlines()
    ending = printed[printed.index(f"files in {out}:"):]
    checkpoint_lines = [line for line in printed[:-len(ending)] if line.startswith("step ")]
    assert [line.split(":")[0] for line in checkpoint_lines] == ["step 0", "step 4"]
    for line in checkpoint_lines:  # loss, KL, (no Tr(F) measured), the task's probe
        assert [kv.split("=")[0] for kv in line.split(": ", 1)[1].split("  ")] == [
            "loss", "kl", "g_star/acc_mean"]
    assert ending[1].split() == ["config.json", "the", "trial's", "config"]
    assert ending[2].startswith("  metrics.jsonl ") and "(steps 0, 4)" in ending[2]
    assert ending[3].startswith("  checkpoints/    step-0, step-4:")
    assert re.fullmatch(r"step 4: loss [\d.]+ = entropy [\d.]+ \+ KL [\d.]+ nats/word "
                        r"\(KL [\d.]+ at step 0\)", ending[4])
    assert re.fullmatch(r"step 4 probe accuracy: g_star [\d.]+ \(random-init [\d.]+, "
                        r"majority [\d.]+\)", ending[5])
    assert re.fullmatch(r"time: training \d+ s, measuring \d+ s \(\d+% of the time: loss, "
                        r"probe\); .*", ending[6])
    assert len(ending) == 7


def test_no_progress_leaves_the_checkpoint_lines_and_the_summary(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["trial", "--out", str(out), "--no-progress", *TINY]) == 0
    captured = capsys.readouterr()
    assert "trial 1 of 1" not in captured.err
    assert f"files in {out}:" in captured.out


def test_quick_measures_the_loss_and_kl_only_and_a_set_key_still_wins(tmp_path, capsys):
    """Issue 42: the cheap mode, named in the help; later --set keys override it."""
    from flatlm.cli import build_parser
    from flatlm.commands.trial import trial_config

    out = tmp_path / "q"
    i = TINY.index('measure.what=["loss","probe"]')
    assert main(["trial", "--out", str(out), "--no-progress", *TINY[:i - 1], *TINY[i + 1:],
                 "--quick"]) == 0
    metrics = read_metrics(out)[4]
    assert "pretrain/kl" in metrics and not any(k.startswith(("probe/", "flat/", "lookup/",
                                                                "random_init/")) for k in metrics)
    args = build_parser().parse_args(["trial", "--out", "x", "--quick", "--set",
                                      'measure.what=["loss","fisher"]'])
    assert trial_config(args).measure.what == ("loss", "fisher")


def test_the_closing_line_describes_the_measurements_that_ran(tmp_path, capsys):
    """Issue 52, item 6: ``--quick --set measure.what=["loss","fisher"]`` measured Tr(F) too
    (the --set wins), yet the closing line said --quick measures only the loss and KL."""
    from flatlm.runs import closing

    i = TINY.index('measure.what=["loss","probe"]')
    argv = ["trial", "--out", str(tmp_path / "q"), "--no-progress", *TINY[:i - 1],
            *TINY[i + 1:], "--quick", "--set", 'measure.what=["loss","fisher"]',
            "--set", "measure.flatness.labels_per_input=2"]
    assert main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "of the time: loss, fisher)" in last
    assert "--quick measures" not in last
    rows = {0: {"step": 0, "time/measure_s": 9.0, "time/train_s": 1.0}}  # measuring dominates
    assert "--set measure.what overrode --quick (the loss and KL only)" in closing.time_line(
        rows, ("loss", "fisher"), quick=True)
    assert "--quick measures the loss and KL only" in closing.time_line(
        rows, ("loss", "probe"), quick=False)
    assert "--quick" not in closing.time_line(rows, ("loss",), quick=True)


def test_trials_beside_each_other_draw_the_evaluation_data_and_references_once(tmp_path):
    first, second = tmp_path / "seed0", tmp_path / "seed1"
    assert main(["trial", "--out", str(first), "--no-progress", *TINY]) == 0
    cache = tmp_path / "eval_cache"
    drawn = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert drawn  # the evaluation data and the random-init probe's rows
    assert main(["trial", "--out", str(second), "--no-progress", *TINY,
                 "--set", "train.seed=1"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == drawn  # read, not redrawn
    a, b = read_metrics(first)[4], read_metrics(second)[4]
    references = [k for k in a if k.startswith("random_init/")]
    assert references and all(a[k] == b[k] for k in references)
    assert a["pretrain/loss"] != b["pretrain/loss"]  # two trials, one set of references
    alone = tmp_path / "alone"
    assert main(["trial", "--out", str(alone), "--no-progress", *TINY,
                 "--eval-cache", "none"]) == 0
    assert {p.name for p in cache.iterdir()} == set(drawn)


def test_a_diverged_trial_is_recorded_and_not_trained_again(tmp_path, capsys, monkeypatch):
    """Issue 52, item 2: a diverged ``flatlm trial`` wrote no diverged.json, and run again
    trained again and diverged again (as ``flatlm replicate`` does not: the same mechanism,
    ``flatlm.runs.trial.run_trial_once``)."""
    from flatlm.commands import DIVERGED_EXIT
    from flatlm.storage.diverged import DIVERGED_FILE, divergence

    out = tmp_path / "d"
    argv = ["trial", "--out", str(out), "--no-progress", *TINY, "--set", "train.lr=1e20",
            "--set", "train.warmup_steps=0"]
    assert main(argv) == DIVERGED_EXIT
    first = capsys.readouterr().err
    assert "diverged at step" in first and divergence(out)["step"] is not None

    def trains(*args, **kwargs):
        raise AssertionError("a recorded divergence was trained again")

    monkeypatch.setattr("flatlm.runs.trial.run_trial", trains)
    assert main(argv) == DIVERGED_EXIT
    again = capsys.readouterr().err
    assert f"recorded in {out / DIVERGED_FILE}" in again and "delete that directory" in again
    assert again.count("\n") == 1  # one line, no traceback


def test_a_rerun_with_other_settings_is_refused_before_it_rewrites_the_config(tmp_path, capsys):
    """Issue 53: ``--quick`` on a finished full trial rewrote its config.json to loss only,
    beside a metrics.jsonl measured under the full one."""
    out = tmp_path / "t"
    assert main(["trial", "--out", str(out), "--no-progress", *TINY]) == 0
    before = (out / "config.json").read_text()
    i = TINY.index('measure.what=["loss","probe"]')  # --set would win over --quick
    assert main(["trial", "--out", str(out), "--no-progress", *TINY[:i - 1], *TINY[i + 1:],
                 "--quick"]) == 2
    err = capsys.readouterr().err
    assert "holds a trial started with another config" in err and "measure.what" in err
    assert (out / "config.json").read_text() == before  # nothing rewritten
