"""``flatlm trial`` (one trial, no Ray) and the one ``--set`` key space of every command."""

import json

import pytest

from flatlm.cli import main
from flatlm.experiments.paper import base_of
from flatlm.runs.metrics_log import read_metrics
from flatlm.sources import SourceSpec

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
                        lambda cfg, out, report, **kw: seen.setdefault("cfg", cfg))
    assert main(["trial", "--out", str(tmp_path), "--scale", "tiny",
                 "--protocol", "paper-code"]) == 0
    assert seen["cfg"] == base_of("tiny", "paper-code")


@pytest.mark.parametrize(("argv", "match"), [
    (["trial", "--out", "x", "--set", "lr=0.1"], "lr"),
    (["trial", "--out", "x", "--scale", "huge"], "scale 'huge'"),
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
    assert config_from_args(args).sam.rho == 0.2
    assert section_assignments(["measure.probe.seeds=2"], "measure") == {"probe.seeds": "2"}
    with pytest.raises(ValueError, match="write measure.probe.seeds=..."):
        section_assignments(["probe.seeds=2"], "measure")
