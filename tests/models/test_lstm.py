"""The bidirectional LSTM masked LM: counts, helpers, padding, loss, save/load, HVPs."""

import pytest
import torch

from flatlm.models import (
    BiLSTMForMaskedLM,
    build_model,
    cls_features,
    count_parameters,
    encode,
    encoder_features,
    mask_positions,
    parameter_count,
    parse_model,
    word_logits,
)
from tests.models.conftest import random_sentences

V, T = 7, 5


def _batch(seed: int, n: int = 6, T: int = T):
    return random_sentences(seed, n, V, T)


@pytest.mark.parametrize("shape", ["lstm-h8-l1", "lstm-h16-l3"])
def test_count_matches_analytic(shape):
    cfg = parse_model(shape)
    model = build_model(cfg, V, T, seed=0)
    assert isinstance(model, BiLSTMForMaskedLM)
    assert count_parameters(model) == parameter_count(cfg, V, T)


def test_bert_config_is_refused():
    with pytest.raises(ValueError, match="arch='lstm'"):
        BiLSTMForMaskedLM(parse_model("bert-2m"), V, T)


def test_word_logits_at_positions_equals_full_gathered():
    model = build_model(parse_model("lstm-h16-l2"), V, T, seed=1).eval()
    tokens, lengths = _batch(2)
    positions = lengths - 1  # the last word of each sentence
    ids, mask = encode(tokens, lengths)
    masked = mask_positions(ids, positions)
    with torch.no_grad():
        full = word_logits(model, masked, mask)
        at = word_logits(model, masked, mask, positions)
        out = model(masked, mask).logits
    assert full.shape == (len(ids), T + 2, V) and at.shape == (len(ids), V)
    torch.testing.assert_close(at, full[torch.arange(len(ids)), positions + 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(full, out[..., 4:], atol=0, rtol=0)


def test_features_ignore_padding_and_are_zero_there():
    model = build_model(parse_model("lstm-h16-l2"), V, T, seed=3).eval()
    tokens, lengths = _batch(4)
    wide = torch.cat([tokens, torch.full((len(tokens), 4), -1)], dim=1)
    with torch.no_grad():
        h = encoder_features(model, *encode(tokens, lengths))  # (n, T+2, 2h)
        h_wide = encoder_features(model, *encode(wide, lengths))
        c = cls_features(model, *encode(tokens, lengths))
    assert h.shape == (len(tokens), T + 2, 32) and c.shape == (len(tokens), 32)
    real = torch.arange(T + 2)[None, :] < (lengths + 2)[:, None]
    assert (h[~real] == 0).all() and (h_wide[:, T + 2:] == 0).all()
    torch.testing.assert_close(h, h_wide[:, : T + 2], atol=1e-6, rtol=0)


def test_loss_is_masked_cross_entropy_and_decoder_is_tied():
    model = build_model(parse_model("lstm-h8-l2"), V, T, seed=5)
    tokens, lengths = _batch(6)
    ids, mask = encode(tokens, lengths)
    labels = torch.full_like(ids, -100)
    labels[:, 1] = ids[:, 1]
    out = model(mask_positions(ids, torch.zeros(len(ids), dtype=torch.int64)), mask, labels)
    expected = torch.nn.functional.cross_entropy(out.logits[:, 1], ids[:, 1])
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    # the decoder reads embed.weight: rows of words never seen as input still get gradient
    assert model.embed.weight.grad.abs().sum(1).gt(0).all()


def test_hessian_vector_product_runs_on_cpu():
    model = build_model(parse_model("lstm-h8-l2"), V, T, seed=7)
    ids, mask = encode(*_batch(8))
    params = [p for p in model.parameters() if p.requires_grad]
    loss = model(ids, mask, labels=ids.masked_fill(mask == 0, -100)).loss
    grads = torch.autograd.grad(loss, params, create_graph=True)
    vs = [torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) for p in params]
    hv = torch.autograd.grad(sum((g * v).sum() for g, v in zip(grads, vs, strict=True)), params)
    assert all(torch.isfinite(h).all() for h in hv)


def test_a_differentiated_eval_forward_leaves_cudnn_for_the_native_kernel():
    """cuDNN's LSTM has no eval-mode or double backward (a GPU measurement of Tr F / Tr H would
    fail): the LSTM runs with cuDNN off exactly then, and keeps it for training and reads."""
    model = build_model(parse_model("lstm-h8-l1"), V, T, seed=0)
    seen = []
    model.lstm.register_forward_pre_hook(lambda m, args: seen.append(
        torch.backends.cudnn.enabled))
    ids, mask = encode(*_batch(3))
    model.train()(ids, mask)
    with torch.no_grad():
        model.eval()(ids, mask)
    model.eval()(ids, mask)
    assert seen == [True, True, False]
    assert torch.backends.cudnn.enabled  # restored


def test_save_and_load_round_trip(tmp_path):
    model = build_model(parse_model("lstm-h16-l2"), V, T, seed=10).eval()
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    loaded = BiLSTMForMaskedLM.from_pretrained(tmp_path)
    assert not loaded.training and loaded.cfg == model.cfg and loaded.layout == model.layout
    ids, mask = encode(*_batch(11))
    with torch.no_grad():
        assert torch.equal(word_logits(loaded, ids, mask), word_logits(model, ids, mask))
