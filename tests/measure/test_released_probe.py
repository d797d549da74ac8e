"""The released probe (budget_bert_pretraining/run_lp.py of Liuhong99/implicitbiasmlmcode) as
flatlm runs it: its settings, the positions it reads, feature dropout and the encoder in train
mode while the head trains, eval mode when it is scored."""

import dataclasses

import pytest
import torch
from torch import nn

import flatlm.measure.probes.probe_batched as probe_batched
from flatlm.core.config import apply_overrides
from flatlm.core.tokens import PAD_ID, SEP_ID
from flatlm.experiments.paper import build
from flatlm.experiments.protocols import protocol_overrides
from flatlm.measure.probes.probe import (
    RELEASED,
    ProbeConfig,
    dropout_multipliers,
    encoder_probe_features,
    head_seeds,
    initial_heads,
    linear_probe_accuracy,
    probe,
    split_indices,
    train_heads,
    train_mode_features,
)
from flatlm.measure.probes.probe_batched import train_heads_batched
from flatlm.measure.probes.probe_rows import probe_rows
from flatlm.measure.run import MeasureConfig, eval_data, measure_model
from flatlm.models import build_model, encode, encoder_features, parse_model

# What run_lp.py does, read off the released code (the README's run_lp.py command line; run_lp.py
# lines 464-470, 519-539; pretraining/modeling.py BertForSequenceClassificationL, BertPoolerC,
# _init_weights; pretraining/args/model_args.py for dropout 0.1 and initializer_range 0.02).
RELEASED_PROBE = {
    "batch_size": 512, "epochs": 50, "lr": 1e-3, "weight_decay": 0.01, "schedule": "linear",
    "warmup_steps": 50, "grad_clip": None, "standardize": False, "positions": "1..T",
    "zero_padding": False, "feature_dropout": 0.1, "encoder_train_mode": True,
    "head_init_std": 0.02,
}
# The paper's text (A.5) where it says, flatlm's reading where it does not.
PAPER_PROBE = {
    "batch_size": 64, "epochs": 100, "lr": 1e-3, "weight_decay": 0.01, "schedule": "constant",
    "warmup_steps": 50, "grad_clip": 1.0, "standardize": True, "positions": "all",
    "zero_padding": True, "feature_dropout": 0.0, "encoder_train_mode": False,
    "head_init_std": None,
}


def _probe_settings(cfg: ProbeConfig) -> dict:
    return {k: getattr(cfg, k) for k in RELEASED_PROBE}


def test_released_settings_are_the_released_codes():
    assert RELEASED == RELEASED_PROBE
    assert _probe_settings(ProbeConfig(**RELEASED)) == RELEASED_PROBE
    assert _probe_settings(ProbeConfig()) == PAPER_PROBE


# the paper protocol's probe: the text's (A.6: lr 1e-3, 100 epochs) and, where it gives none, the
# released batch of 512 (flatlm.experiments.protocols.PAPER); no scale changes a probe setting
PAPER_PROTOCOL_PROBE = {"batch_size": 512, "epochs": 100, "lr": 1e-3}


@pytest.mark.parametrize("protocol, expected", [
    ("paper", {**PAPER_PROBE, **PAPER_PROTOCOL_PROBE}), ("paper-code", RELEASED_PROBE),
    ("paper+released-probe", RELEASED_PROBE)])
@pytest.mark.parametrize("scale", ["sweep", "tiny", "gpu"])
def test_protocols_probe_as_their_source_does(protocol, expected, scale):
    overrides = protocol_overrides(protocol)
    probe_overrides = {k: overrides[f"measure.probe.{k}"] for k in RELEASED_PROBE
                       if f"measure.probe.{k}" in overrides}
    assert probe_overrides == (PAPER_PROTOCOL_PROBE if protocol == "paper" else RELEASED_PROBE)
    for _, cfg in build("steps", scale=scale, protocol=protocol, seeds=(0,)).trials():
        assert _probe_settings(cfg.measure.probe) == expected


def test_released_settings_travel_as_overrides():
    cfg = apply_overrides(MeasureConfig(), {f"probe.{k}": v for k, v in RELEASED.items()})
    assert _probe_settings(cfg.probe) == RELEASED_PROBE


@pytest.mark.parametrize("kwargs, match", [
    ({"positions": "words"}, "probe.positions"),
    ({"feature_dropout": 1.0}, "probe.feature_dropout"),
    ({"encoder_train_mode": True, "batched": False}, "probe.batched=true"),
    ({"head_init_std": 0.0}, "probe.head_init_std")])
def test_config_rejects_bad_released_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ProbeConfig(**kwargs)


# --- the positions the released probe reads ------------------------------------------------

def _tiny(src, dropout=0.1, seed=0):
    shape = dataclasses.replace(parse_model("d16-h2-l1-i32"), dropout=dropout)
    return build_model(shape, src.V, src.max_length, seed=seed)


def test_released_features_are_positions_1_to_T_with_sep_and_padding_states(src):
    """A known 2-word sentence at T = 4: input [CLS] w w [SEP] [PAD] [PAD]; BertPoolerC's
    hidden_states[:, 1:-1] is w w [SEP] [PAD]: no [CLS], not the last [PAD], and the padding
    state as the encoder computes it (not zero)."""
    T = src.max_length
    assert T == 4
    model = _tiny(src)
    tokens, lengths = torch.tensor([[0, 1, -1, -1]]), torch.tensor([2])
    ids, mask = encode(tokens, lengths)
    model.eval()
    with torch.no_grad():
        states = encoder_features(model, ids, mask)[0]  # (T+2, d): [CLS] w w [SEP] [PAD] [PAD]
    feats = encoder_probe_features(model, tokens, lengths, positions="1..T", zero_padding=False)
    assert feats.shape == (1, T * 16)
    blocks = feats.view(T, 16)
    torch.testing.assert_close(blocks, states[1:T + 1], rtol=0, atol=1e-6)
    assert int(ids[0, 3]) == SEP_ID and int(ids[0, 4]) == PAD_ID  # [SEP] at L + 1 = 3
    torch.testing.assert_close(blocks[2], states[3])  # [SEP]'s state, included
    assert blocks[3].abs().sum() > 0  # a padding state, as computed, included
    assert all(not torch.allclose(block, states[0]) for block in blocks)  # no [CLS]
    assert all(not torch.allclose(block, states[T + 1]) for block in blocks)  # no last position
    paper = encoder_probe_features(model, tokens, lengths).view(T + 2, 16)
    torch.testing.assert_close(paper[:4], states[:4])
    assert bool((paper[4:] == 0).all())  # the paper's default: every position, padding zero


def test_sep_is_dropped_only_from_a_sentence_that_fills_every_position(src):
    """As the released 20-padded input drops an 18-word sentence's [SEP] (its [:, 1:-1])."""
    model = _tiny(src)
    tokens, lengths = torch.tensor([[0, 1, 2, 3]]), torch.tensor([4])
    ids, mask = encode(tokens, lengths)
    model.eval()
    with torch.no_grad():
        states = encoder_features(model, ids, mask)[0]
    feats = encoder_probe_features(model, tokens, lengths, positions="1..T", zero_padding=False)
    torch.testing.assert_close(feats.view(4, 16), states[1:5], rtol=0, atol=1e-6)


# --- the whole measurement: what the heads train on and are scored on ------------------------

def _dropout_modes(model: nn.Module) -> list[bool]:
    """Records ``training`` of the model's dropout layers at every call."""
    seen: list[bool] = []
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.register_forward_pre_hook(lambda m, args: seen.append(m.training))
    return seen


def test_heads_train_on_train_mode_draws_of_positions_1_to_T_and_are_scored_in_eval_mode(
        src, monkeypatch):
    cfg = MeasureConfig(what=("probe",), n_eval=4, n_downstream=80, tasks=("A",),
                        sections=dict(probe=ProbeConfig(**{**RELEASED, "epochs": 3, "seeds": 2,
                                                           "batch_size": 16, "ridge": False})))
    data = eval_data(src, cfg)
    model = _tiny(src)
    modes = _dropout_modes(model)
    captured = {}

    def spy(x, y, num_classes, seeds, probe_cfg, **kwargs):
        draws = [kwargs["epoch_features"](epoch) for epoch in range(probe_cfg.epochs)]
        captured.update(x=x, draws=draws, again=kwargs["epoch_features"](0))
        return train_heads_batched(x, y, num_classes, seeds, probe_cfg, **kwargs)

    monkeypatch.setattr(probe_batched, "train_heads_batched", spy)
    model.eval()
    out = measure_model(model, src, data, cfg, "cpu")
    assert not model.training  # the mode is put back
    assert 0.0 <= out["probe/A/acc_mean"] <= 1.0
    # what the heads are scored on: eval-mode states of positions 1..T, padding as computed
    keep = data.classes["A"] >= 0
    train, _ = split_indices(int(keep.sum()), cfg.probe.test_fraction, cfg.probe.seed)
    ids, mask = encode(data.downstream_tokens[keep], data.downstream_lengths[keep])
    with torch.no_grad():
        states = encoder_features(model, ids, mask)
    expected = states[:, 1:-1].flatten(1)[train]  # BertPoolerC's [:, 1:-1]
    torch.testing.assert_close(captured["x"][0], expected, rtol=0, atol=1e-5)
    # what they train on: a fresh train-mode draw of the same positions every epoch, seeded
    draws = captured["draws"]
    assert all(d.shape == (1, *expected.shape) for d in draws)
    assert not torch.allclose(draws[0], captured["x"])  # dropout on: not the eval features
    assert not torch.allclose(draws[0], draws[1])  # another draw every epoch
    torch.testing.assert_close(captured["again"], draws[0], rtol=0, atol=0)  # seeded
    assert True in modes and False in modes  # train mode for the draws, eval for scoring


def test_without_dropout_the_train_mode_draws_are_the_eval_features(src):
    model = _tiny(src, dropout=0.0)
    tokens, lengths = src.sample(30, seed=3)
    cfg = ProbeConfig(**RELEASED)
    draw = train_mode_features(model, tokens, lengths, cfg)
    rows = torch.arange(5, 25)
    eval_features = encoder_probe_features(model, tokens[rows], lengths[rows],
                                           positions="1..T", zero_padding=False)
    torch.testing.assert_close(draw(rows, 0), eval_features, rtol=0, atol=1e-6)


def test_train_mode_draws_leave_the_global_generator_alone(src):
    model = _tiny(src)
    tokens, lengths = src.sample(20, seed=4)
    draw = train_mode_features(model, tokens, lengths, ProbeConfig(**RELEASED))
    state = torch.get_rng_state()
    first = draw(torch.arange(20), 7)
    assert torch.equal(torch.get_rng_state(), state)
    torch.testing.assert_close(draw(torch.arange(20), 7), first, rtol=0, atol=0)
    assert model.training  # built in train mode, put back


def test_encoder_train_mode_needs_the_draws(src):
    tokens, lengths = src.sample(40, seed=5)
    classes = {"A": src.labels(tokens, lengths, "A")}
    features = torch.randn(40, 8)
    with pytest.raises(ValueError, match="encoder_train_mode"):
        probe_rows(features, src, classes, ProbeConfig(**RELEASED), "probe")
    with pytest.raises(ValueError, match="encoder_train_mode"):
        probe(_tiny(src), src, tokens, lengths, classes["A"], "A", ProbeConfig(**RELEASED))


# --- the head: feature dropout, initialisation, no clipping ---------------------------------

def _features(seed, n=90, D=12):
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


def _labels(x, C, seed):
    g = torch.Generator().manual_seed(seed)
    return (x @ torch.randn(x.shape[1], C, generator=g)
            + torch.randn(len(x), C, generator=g)).argmax(1)


HEAD = ProbeConfig(epochs=6, seeds=3, batch_size=16, warmup_steps=5, grad_clip=None,
                   feature_dropout=0.1, head_init_std=0.02)


@pytest.mark.parametrize("changes", [{}, {"batch_size": None}, {"feature_dropout": 0.5}],
                         ids=["minibatch", "full-batch", "dropout-0.5"])
def test_batched_released_heads_are_the_heads_trained_alone(changes):
    """Feature dropout, N(0, 0.02) init and no clipping in both paths: the same heads."""
    cfg = dataclasses.replace(HEAD, **changes)
    x = torch.stack([_features(0), _features(1)])
    y = torch.stack([_labels(x[0], 4, 2), _labels(x[1], 4, 3)])
    seeds = [11, 12, 13]
    W, b, _ = train_heads_batched(x, y, 4, seeds, cfg)
    for f in range(2):
        for k in range(2):
            W1, b1 = train_heads(x[f], y[k], 4, seeds, cfg)
            torch.testing.assert_close(W[f, :, k].transpose(1, 2), W1, rtol=0, atol=1e-5)
            torch.testing.assert_close(b[f, :, k], b1, rtol=0, atol=1e-5)


def test_feature_dropout_changes_training_not_scoring():
    x = _features(2, n=200)
    y = _labels(x, 3, 4)
    cfg = dataclasses.replace(HEAD, feature_dropout=0.5, epochs=20, standardize=False)
    dropped = linear_probe_accuracy(x, y, 3, cfg)
    plain = linear_probe_accuracy(x, y, 3, dataclasses.replace(cfg, feature_dropout=0.0))
    assert dropped["accs"] != plain["accs"]
    # scored on the clean features: the heads train_heads returns, applied without dropout
    train, test = split_indices(200, cfg.test_fraction, cfg.seed)
    W, b = train_heads(x[train], y[train], 3, head_seeds(cfg), cfg)
    accs = ((torch.einsum("nd,sdc->snc", x[test], W) + b[:, None]).argmax(-1) == y[test])
    assert accs.double().mean(1).tolist() == dropped["accs"]


def test_dropout_multipliers_are_nn_dropouts():
    g = torch.Generator().manual_seed(0)
    m = dropout_multipliers(g, (4, 500, 50), 0.1, "cpu", torch.float32)
    assert m.unique().tolist() == [0.0, pytest.approx(1 / 0.9)]
    assert float((m == 0).double().mean()) == pytest.approx(0.1, abs=0.005)


def test_head_init_is_normal_0_02_with_zero_bias():
    gens = [torch.Generator().manual_seed(s) for s in range(3)]
    W, b = (p.detach() for p in initial_heads(2000, 9, gens, "cpu", torch.float32, std=0.02))
    assert W.shape == (3, 2000, 9) and bool((b == 0).all())
    assert float(W.std()) == pytest.approx(0.02, rel=0.02) and abs(float(W.mean())) < 1e-3
    W0, _ = initial_heads(2000, 9, gens, "cpu", torch.float32)
    assert float(W0.abs().max()) <= 1 / 2000 ** 0.5  # nn.Linear's uniform, the default


def test_no_clipping_lets_a_large_gradient_through():
    """grad_clip=None (released) and 1.0 (default) differ where the gradient norm exceeds 1."""
    x = 50.0 * _features(3, n=60)  # raw, large features: gradient norms >> 1
    y = _labels(x, 3, 5)
    cfg = ProbeConfig(epochs=3, seeds=1, batch_size=20, warmup_steps=0, lr=1e-2,
                      head_init_std=0.02)
    seeds = [1]
    W_none, _ = train_heads(x, y, 3, seeds, dataclasses.replace(cfg, grad_clip=None))
    W_clip, _ = train_heads(x, y, 3, seeds, cfg)
    assert not torch.allclose(W_none, W_clip)
