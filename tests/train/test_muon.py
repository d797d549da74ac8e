"""Algorithm "muon" (flatlm/train/muon.py): torch's Muon on the encoder's hidden matrices and
AdamW on the rest; it learns the language, its settings are keys ``train.muon.*``, one update is
the two torch optimizers' by hand, and its saved state is read where it can be. Resume bit for
bit: tests/train/test_resume.py (case "muon")."""

import contextlib
import copy
import dataclasses

import pytest
import torch

from flatlm.core.config import apply_overrides, to_dict
from flatlm.core.schedules import learning_rate
from flatlm.measure.landscape.optimizer_state import saved_optimizer
from flatlm.models import build_model, parse_model
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.algorithms import StepContext, build_optimizer, mlm_loss_sum, standard_step
from flatlm.train.data import StepInputs, generator, mask_batch
from flatlm.train.muon import MuonWithAdamW, hidden_matrices
from flatlm.train.muon_config import MuonConfig
from tests.train.conftest import assert_learns

MODEL = "d16-h1-l1-i64"


def _model(shape=MODEL):
    """A fresh tiny BERT for the tests' grammar (12 words, 4 positions), without dropout."""
    shape = dataclasses.replace(parse_model(shape), dropout=0.0)
    return build_model(shape, vocab_size=12, max_length=4, seed=0)


def _muon(**fields) -> TrainConfig:
    return resolve(TrainConfig(algorithm="muon", steps=4, batch_size=16, **fields))


def test_muon_lowers_kl_to_truth(src, eval_sentences, tmp_path):
    cfg = TrainConfig(algorithm="muon", steps=60, batch_size=64, lr=3e-3, warmup_steps=5,
                      checkpoint_steps=(0, 60), seed=1)
    assert_learns(cfg, src, MODEL, eval_sentences, tmp_path)


@pytest.mark.parametrize("shape", [MODEL, MODEL + "-pre"])
def test_every_encoder_matrix_is_muon_s_and_nothing_else(shape):
    model = _model(shape)
    optimizer = build_optimizer(_muon(), model)
    assert isinstance(optimizer, MuonWithAdamW)
    assert isinstance(optimizer.muon, torch.optim.Muon)
    assert isinstance(optimizer.adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = [names[id(p)] for g in optimizer.muon.param_groups for p in g["params"]]
    adamw = [names[id(p)] for g in optimizer.adamw.param_groups for p in g["params"]]
    matrices = [n for n, p in model.named_parameters() if ".encoder." in n and p.dim() == 2]
    assert muon == matrices and len(matrices) == 6  # query, key, value, output, MLP in, MLP out
    assert all(n.endswith(".weight") and ".layer.0." in n for n in muon)
    assert sorted(muon + adamw) == sorted(names.values())  # each parameter once
    assert any("embeddings.word_embeddings" in n for n in adamw)  # the head's decoder, tied
    assert any(n.endswith("dense.weight") and ".encoder." not in n for n in adamw)  # the head's


def test_the_adamw_part_is_build_optimizer_s_adamw_on_the_rest():
    cfg = _muon(weight_decay=0.03, beta1=0.8, beta2=0.9, eps=1e-7)
    adamw = build_optimizer(cfg, _model()).adamw
    decayed, undecayed = adamw.param_groups
    assert decayed["weight_decay"] == 0.03 and undecayed["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decayed["params"])
    assert all(p.dim() < 2 for p in undecayed["params"])
    assert decayed["betas"] == (0.8, 0.9) and decayed["eps"] == 1e-7 and decayed["lr"] == cfg.lr


def _inputs(src, n=16, seed=3):
    tokens, lengths = src.sample(n, seed)
    return StepInputs(mask_batch(tokens, lengths, "one", generator(seed, "mask", 0)))


def test_one_update_is_torch_s_muon_and_adamw_by_hand(src):
    settings = MuonConfig(lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.1, ns_steps=3)
    cfg = dataclasses.replace(_muon(lr=2e-3, warmup_steps=0, dropout=0.0),
                              sections=(("muon", settings),))
    model, ref = _model(), _model()
    inputs = _inputs(src)
    ctx = StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model),
                      autocast=contextlib.nullcontext, mlm_loss=mlm_loss_sum)
    standard_step(ctx, inputs)

    hidden = hidden_matrices(ref)
    rest = [p for p in ref.parameters() if all(p is not q for q in hidden)]
    by_hand = [torch.optim.Muon(hidden, lr=0.05, momentum=0.9, nesterov=False, weight_decay=0.1,
                                ns_steps=3),
               torch.optim.AdamW([{"params": [p for p in rest if p.dim() >= 2],
                                   "weight_decay": cfg.weight_decay},
                                  {"params": [p for p in rest if p.dim() < 2],
                                   "weight_decay": 0.0}],
                                 lr=2e-3, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)]
    batch = inputs.mlm
    (mlm_loss_sum(ref, batch) / len(batch)).backward()
    for optimizer in by_hand:
        optimizer.step()
    for (name, a), b in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_muon_follows_the_schedule_at_its_own_peak(src, tmp_path):
    cfg = apply_overrides(TrainConfig(algorithm="muon", steps=4, batch_size=16, lr=1e-3,
                                      warmup_steps=2, schedule="linear", checkpoint_steps=(1, 4)),
                          {"muon.lr": 0.04})
    train(cfg, src, MODEL, tmp_path, progress=False)
    for step in (1, 4):  # the rates of the update before each checkpoint, as saved
        state = torch.load(tmp_path / "checkpoints" / f"step-{step}" / "training_state.pt",
                           weights_only=True)["optimizer"]
        lr = learning_rate(step - 1, peak=1e-3, warmup_steps=2, total_steps=4, schedule="linear")
        muon, adamw = state["muon"]["param_groups"][0], state["adamw"]["param_groups"][0]
        assert adamw["lr"] == lr and "lr_scale" not in adamw
        assert muon["lr"] == pytest.approx(40 * lr, rel=1e-12) and muon["lr_scale"] == 40


def test_its_settings_are_keys_with_documented_defaults_and_named_errors():
    cfg = apply_overrides(TrainConfig(algorithm="muon"),
                          {"muon.lr": "0.05", "muon.ns_steps": 3,
                           "muon.nesterov": "false"})
    assert cfg.settings("muon") == MuonConfig(lr=0.05, ns_steps=3, nesterov=False)
    assert to_dict(cfg)["muon"]["lr"] == 0.05
    assert TrainConfig(algorithm="muon").settings("muon") == MuonConfig()
    assert "muon" not in to_dict(TrainConfig())  # a config that sets none writes no key
    defaults = MuonConfig()
    assert (defaults.lr, defaults.momentum, defaults.nesterov, defaults.weight_decay,
            defaults.ns_steps, defaults.adjust_lr) == (0.02, 0.95, True, 0.01, 5, "original")
    for key, value, named in (("lr", 0, "train.muon.lr=0.0: use a rate > 0"),
                              ("momentum", 1.0, r"train.muon.momentum=1.0: use a decay in"),
                              ("ns_steps", 0, r"train.muon.ns_steps=0: use an integer in 1..99"),
                              ("adjust_lr", "x", r"train.muon.adjust_lr='x': use one of "
                                                 "original, match_rms_adamw")):
        with pytest.raises(ValueError, match=named):
            apply_overrides(TrainConfig(algorithm="muon"), {f"muon.{key}": value})


def test_a_model_without_a_transformer_encoder_is_refused_before_work(src, tmp_path):
    with pytest.raises(ValueError, match=r"train.algorithm='muon': model.arch='lstm' has no "
                                         "transformer encoder"):
        train(TrainConfig(algorithm="muon", steps=2, batch_size=8), src, "lstm-h16-l1",
              tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_its_state_round_trips_and_the_landscape_reader_declines_it(src, tmp_path):
    cfg = TrainConfig(algorithm="muon", steps=3, batch_size=16, warmup_steps=1,
                      checkpoint_steps=(3,))
    result = train(cfg, src, MODEL, tmp_path, progress=False)
    state = torch.load(tmp_path / "checkpoints" / "step-3" / "training_state.pt",
                       weights_only=True)["optimizer"]
    assert set(state) == {"muon", "adamw"}
    assert all("momentum_buffer" in s for s in state["muon"]["state"].values())
    fresh = build_optimizer(resolve(cfg), copy.deepcopy(result.model))
    fresh.load_state_dict(state)
    assert fresh.state_dict()["muon"]["param_groups"] == state["muon"]["param_groups"]
    params = list(result.model.parameters())
    saved, why = saved_optimizer(tmp_path / "checkpoints" / "step-3", result.model, params)
    assert saved is None and "not one torch optimizer (muon: Muon and AdamW)" in why
    with pytest.raises(ValueError, match="not Muon's and AdamW's"):
        fresh.load_state_dict(state["adamw"])


def test_a_resume_with_other_muon_settings_is_refused(src, tmp_path, stop_at):
    cfg = apply_overrides(TrainConfig(algorithm="muon", steps=4, batch_size=16, warmup_steps=1,
                                      checkpoint_steps=(2, 4)), {"muon.lr": 0.05})
    with pytest.raises(stop_at.Stopped):
        train(cfg, src, MODEL, tmp_path, progress=False, on_checkpoint=stop_at(2))
    default_lr = dataclasses.replace(cfg, sections=())  # the key left out: 0.02
    for changed in (default_lr, apply_overrides(cfg, {"muon.momentum": 0.9})):
        with pytest.raises(ValueError, match=r"the run changed \(train\.muon\.(lr=0\.05 -> "
                                             r"0\.02|momentum=0\.95 -> 0\.9)\)"):
            train(changed, src, MODEL, tmp_path, progress=False, resume=True)
    same = apply_overrides(default_lr, {"muon.lr": 0.05, "muon.momentum": 0.95})  # as given
    assert train(same, src, MODEL, tmp_path, progress=False, resume=True).step == 4


def test_it_runs_in_one_process_and_says_why():
    with pytest.raises(ValueError, match=r"train\.world_size=2: train\.algorithm='muon' runs in "
                                         r"one process only \(its bfloat16 Newton-Schulz"):
        TrainConfig(algorithm="muon", batch_size=16, world_size=2)
