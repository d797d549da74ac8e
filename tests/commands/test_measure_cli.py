"""`flatlm measure CHECKPOINT`: one JSON object with every metric key the issue names."""

import json

import pytest

from flatlm.cli import main
from flatlm.models import build_model, parse_model, save_checkpoint
from flatlm.sources import load

SOURCE = {"kind": "pcfg", "random": {"vocab": 8, "depth": 2, "nonterminals_per_level": 2,
                                     "roots": 2}, "seed": 0}


@pytest.fixture
def checkpoint(tmp_path):
    src = load(SOURCE)
    cfg = parse_model("d16-h2-l1-i32")
    model = build_model(cfg, src.V, src.max_length, seed=0)
    return save_checkpoint(model, tmp_path / "ckpt", source_spec=src.spec, model_cfg=cfg)


def test_measure_prints_and_saves_every_key(checkpoint, capsys):
    rc = main(["measure", str(checkpoint), "--what", "loss,fisher,hessian,probe,finetune,lookup",
               "--n-eval", "48", "--n-downstream", "40", "--tasks", "B", "--json",
               "--set", "measure.probe.epochs=3", "--set", "measure.probe.seeds=2",
               "--set", "measure.finetune.epochs=1", "--set", "measure.finetune.seeds=2",
               "--set", "measure.finetune.warmup_steps=2",
               "--set", "measure.flatness.batch_size=16",
               "--set", "measure.flatness.hutchinson_batch_size=16"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    keys = ["pretrain/loss", "pretrain/entropy", "pretrain/kl", "flat/trace_fisher",
            "flat/trace_hessian"]
    for key in keys + [k + "_se" for k in keys] + ["probe/B/acc_mean", "probe/B/acc_std",
                                                   "finetune/B/acc_mean", "lookup/B/acc_mean"]:
        assert isinstance(out[key], float), key
    assert out["pretrain/loss"] == pytest.approx(out["pretrain/entropy"] + out["pretrain/kl"],
                                                 abs=1e-6)
    assert json.loads((checkpoint / "measure.json").read_text())["pretrain/kl"] == out[
        "pretrain/kl"]


@pytest.mark.parametrize("args, match", [
    (["--what", "loss,flatness"], "flatness"),  # not a measurement (sharpness now is)
    (["--tasks", "Q"], "measure.tasks"),
    (["--set", "measure.probe.epoch=3"], "probe.epoch"),
])
def test_bad_options_fail_with_a_message(checkpoint, capsys, args, match):
    assert main(["measure", str(checkpoint), *args]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("poison, part", [
    ("nan", "weights"),
    # Issue 52, item 1: every weight finite but x1e30, so the logits overflow: Tr(F) crashed
    # in its label sampling as on NaN weights, the weights' check saying nothing was wrong
    ("x1e30", "outputs (logits)"),
])
def test_a_model_with_non_finite_weights_or_outputs_reads_nan_instead_of_crashing(
        tmp_path, capsys, caplog, poison, part):
    """Issue 43, item 11: on a model that outputs NaN, Tr(F) crashed in its label sampling
    ("invalid multinomial distribution") and the spectral density in eigh; the loss and probe
    reported NaN as they should."""
    import math

    import torch

    src = load(SOURCE)
    cfg = parse_model("d16-h2-l1-i32")
    model = build_model(cfg, src.V, src.max_length, seed=0)
    with torch.no_grad():
        if poison == "nan":
            next(model.parameters()).fill_(float("nan"))
        else:
            for p in model.parameters():
                p.mul_(1e30)
            assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    ckpt = save_checkpoint(model, tmp_path / "ckpt", source_spec=src.spec, model_cfg=cfg)
    rc = main(["measure", str(ckpt), "--what", "loss,fisher,density", "--n-eval", "16",
               "--json", "--set", "measure.flatness.batch_size=16",
               "--set", "measure.spectrum.slq_probes=2", "--set", "measure.spectrum.slq_steps=4"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    out = json.loads(captured.out.strip().splitlines()[-1])
    assert math.isnan(out["flat/trace_fisher"]) and math.isnan(out["pretrain/kl"])
    assert f"{part} are not finite" in caplog.text


def test_n_eval_sets_n_eval_and_the_old_n_inputs_is_an_error_naming_it(checkpoint, capsys):
    """Issue 39: ``--n-inputs`` set ``measure.n_eval``, not ``measure.flatness.n_inputs``; it is
    now ``--n-eval``, and the old spelling an error naming both keys, before any work."""
    loss = {}
    for n in (24, 96):  # more validation sentences: a smaller s.e. of the same loss
        assert main(["measure", str(checkpoint), "--what", "loss", "--n-eval", str(n)]) == 0
        loss[n] = json.loads((checkpoint / "measure.json").read_text())["pretrain/loss_se"]
    assert loss[96] < loss[24]
    assert main(["measure", str(checkpoint), "--what", "loss", "--n-inputs", "24"]) == 2
    err = capsys.readouterr().err
    assert "--n-inputs 24: renamed --n-eval (it sets measure.n_eval; Tr(F)'s inputs are --set " \
           "measure.flatness.n_inputs=24)" in err
