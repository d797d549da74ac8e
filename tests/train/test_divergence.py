"""Divergence fails loudly: a non-finite loss, or one above ``train.divergence_factor`` times the
first logged loss, stops the run (``Diverged``, `flatlm train` exit 3) before any later checkpoint;
non-finite config values are errors naming the field."""

import json
import os
import re
import subprocess
import sys

import pytest

from flatlm.cli import main
from flatlm.sources import SourceSpec, load
from flatlm.train.config import AdversarialConfig, SamConfig, TrainConfig
from flatlm.train.loop import Diverged, train
from flatlm.train.state import find_checkpoints

SOURCE = json.dumps({"kind": "pcfg", "random": {"vocab": 12, "depth": 2,
                                                "nonterminals_per_level": 3, "roots": 2},
                     "seed": 0})
MODEL = "d16-h1-l1-i32"


def _cfg(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 30, "batch_size": 16, "warmup_steps": 0, "log_every": 1,
                          "checkpoint_steps": tuple(range(0, 31, 2)), **kw})


def test_cli_lr_1000_exits_3_within_a_few_steps_and_saves_nothing_after(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "flatlm.cli", "train", "--source", SOURCE, "--model", MODEL,
           "--out", str(out), "--lr", "1000", "--steps", "30", "--batch-size", "16",
           "--warmup-steps", "0", "--log-every", "1", "--checkpoint-steps",
           ",".join(str(s) for s in range(0, 31, 2)), "--no-progress", "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 3, done.stderr
    line = next(s for s in done.stderr.splitlines() if "diverged at step" in s)
    step = int(line.split("diverged at step ")[1].split(":")[0])
    assert 1 <= step <= 10 and "train/loss=" in line and "lower train.lr" in line
    saved = find_checkpoints(out)
    assert saved and max(saved) < step  # the checkpoints before it, none at or after it


@pytest.mark.parametrize("algorithm", ["adamw", "sgd"])
def test_nonfinite_loss_raises_even_with_the_factor_off(tmp_path, algorithm):
    # the loss, or at a checkpoint before any loss shows it the logits (issue 52, item 1)
    with pytest.raises(Diverged, match=r"is not finite|logits\) after the last update") as e:
        train(_cfg(algorithm=algorithm, lr=1000.0, divergence_factor=None),
              load(SourceSpec(SOURCE)), MODEL, tmp_path, progress=False)
    assert e.value.step <= 10 and max(find_checkpoints(tmp_path)) < e.value.step


def test_factor_rule_stops_a_finite_blow_up(tmp_path):
    # adamw at lr 1: the loss goes 2.48 -> 13.0 -> 9.6 -> 53.8 (step 4), finite throughout.
    source = load(SourceSpec(SOURCE))
    with pytest.raises(Diverged, match="divergence_factor=10 times") as e:
        train(_cfg(lr=1.0), source, MODEL, tmp_path / "a", progress=False)
    assert e.value.step == 4 and e.value.loss > 10 * 2.4
    assert max(find_checkpoints(tmp_path / "a")) == 2
    with pytest.raises(Diverged, match="divergence_factor=4 times") as e:
        train(_cfg(lr=1.0, divergence_factor=4.0), source, MODEL, tmp_path / "b",
              progress=False)
    assert e.value.step == 2  # 13.0 > 4 * 2.48
    result = train(_cfg(lr=1.0, divergence_factor=None, steps=10, checkpoint_steps=()), source,
                   MODEL, tmp_path / "c", progress=False)  # off: the same run goes on
    assert result.step == 10


def test_checkpoint_between_readouts_checks_the_window(tmp_path):
    # log_every 25 reads the loss out only at step 25; the checkpoint at step 20 must not be
    # written from the NaN parameters.
    with pytest.raises(Diverged) as e:
        train(_cfg(lr=1000.0, log_every=25, checkpoint_steps=(0, 20)),
              load(SourceSpec(SOURCE)), MODEL, tmp_path, progress=False)
    assert e.value.step == 20 and list(find_checkpoints(tmp_path)) == [0]


def test_normal_run_is_unaffected(tmp_path):
    result = train(_cfg(lr=1e-3, steps=10, checkpoint_steps=(10,)), load(SourceSpec(SOURCE)),
                   MODEL, tmp_path, progress=False)
    assert result.step == 10 and list(result.checkpoints) == [10]


@pytest.mark.parametrize(("make", "field"), [
    (lambda x: TrainConfig(lr=x), "train.lr"),
    (lambda x: TrainConfig(weight_decay=x), "train.weight_decay"),
    (lambda x: TrainConfig(eps=x), "train.eps"),
    (lambda x: TrainConfig(beta2=x), "train.beta2"),
    (lambda x: TrainConfig(dropout=x), "train.dropout"),
    (lambda x: TrainConfig(warmup_proportion=x), "train.warmup_proportion"),
    (lambda x: TrainConfig(mask_replace=(x, 0.0, 0.0)), "train.mask_replace"),
    (lambda x: TrainConfig(divergence_factor=x), "train.divergence_factor"),
    (lambda x: SamConfig(rho=x), "train.sam.rho"),
    (lambda x: AdversarialConfig(ridge=x), "train.adversarial.ridge"),
    (lambda x: AdversarialConfig(lambda_=x), "train.adversarial.lambda"),
])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), float("-inf")])
def test_nonfinite_config_values_are_errors_naming_the_field(make, field, value):
    with pytest.raises(ValueError, match=f"^{field}=.*use a finite number"):
        make(value)


@pytest.mark.parametrize("option", ["--lr", "--weight-decay", "--adversarial-ridge"])
@pytest.mark.parametrize("text", ["1e1000", "Infinity", "NaN"])  # what JSON parses as inf/nan
def test_cli_rejects_nonfinite_before_work(tmp_path, capsys, option, text):
    code = main(["train", "--source", SOURCE, "--model", MODEL, "--out", str(tmp_path / "r"),
                 "--device", "cpu", "--no-progress", option, text])
    assert code == 2 and "use a finite number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("poison, part", [
    ("nan", "weights"),
    # Issue 52, item 1: finite weights whose logits overflow (one update at lr 1e20) were saved
    # and measured, Tr(F) then crashing in its label sampling; the outputs are checked too
    ("x1e30", "outputs (logits)"),
])
def test_an_update_that_leaves_non_finite_weights_just_before_a_checkpoint_is_caught(
        tmp_path, monkeypatch, poison, part):
    """Issue 43, item 8: the loss of an update is read before it, so an update just before a
    checkpoint could leave non-finite weights that no loss had shown: the checkpoint was saved
    and measured (flatlm trial: exit 1, a traceback). The weights are checked before saving."""
    import torch

    from flatlm.train import run as run_module

    real = run_module.Run.update_function

    def poisoned(self):
        step = real(self)

        def update(ctx, inputs):
            metrics = step(ctx, inputs)
            if self.step == 4:  # the update into step 5, a checkpoint step; no read-out yet
                with torch.no_grad():
                    if poison == "nan":
                        next(ctx.model.parameters()).fill_(float("nan"))
                    else:
                        for p in ctx.model.parameters():
                            p.mul_(1e30)
            return metrics
        return update

    monkeypatch.setattr(run_module.Run, "update_function", poisoned)
    with pytest.raises(Diverged, match=rf"{re.escape(part)} after the last update are not "
                                       "finite") as e:
        train(_cfg(steps=10, log_every=10, checkpoint_steps=(0, 5, 10)),
              load(SourceSpec(SOURCE)), MODEL, tmp_path, progress=False)
    assert e.value.step == 5 and list(find_checkpoints(tmp_path)) == [0]
