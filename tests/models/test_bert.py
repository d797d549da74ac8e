"""Token layout, build_model and the helpers, on small BERTs."""

import dataclasses

import pytest
import torch
from transformers import BertForMaskedLM

from flatlm.models import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    build_model,
    cls_features,
    count_parameters,
    encode,
    encoder_features,
    mask_positions,
    model_layout,
    parameter_count,
    parse_model,
    word_logits,
)
from tests.models.conftest import random_sentences

SMALL = parse_model("d32-h2-l2-i64")
V, T = 7, 5


def _batch(seed: int, n: int = 6, T: int = T):
    return random_sentences(seed, n, V, T)


def test_encode_layout():
    tokens = torch.tensor([[5, 0, 2], [1, -1, -1], [6, 6, 6]])
    ids, mask = encode(tokens, torch.tensor([3, 1, 3]))
    assert ids.tolist() == [
        [CLS_ID, 9, 4, 6, SEP_ID],
        [CLS_ID, 5, SEP_ID, PAD_ID, PAD_ID],
        [CLS_ID, 10, 10, 10, SEP_ID],
    ]
    assert mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert ids.dtype == mask.dtype == torch.int64


def test_encode_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths"):
        encode(torch.tensor([[1, 2]]), torch.tensor([3]))
    with pytest.raises(ValueError, match="word ids"):
        encode(torch.tensor([[1, -1]]), torch.tensor([2]))


def test_mask_positions_masks_one_word_and_copies():
    ids, _ = encode(*_batch(0))
    positions = torch.zeros(len(ids), dtype=torch.int64)
    masked = mask_positions(ids, positions)
    assert (masked[:, 1] == MASK_ID).all()
    assert torch.equal(masked[:, 2:], ids[:, 2:]) and torch.equal(masked[:, 0], ids[:, 0])
    assert (ids[:, 1] != MASK_ID).all()  # the input is untouched
    with pytest.raises(ValueError, match="past the sentence"):
        mask_positions(ids, torch.full((len(ids),), T, dtype=torch.int64))  # [SEP] or [PAD]


def test_build_model_matches_config_and_analytic_count():
    model = build_model(SMALL, V, T, seed=0)
    assert isinstance(model, BertForMaskedLM) and model.training
    config = model.config
    assert (config.vocab_size, config.max_position_embeddings) == (V + 4, T + 2)
    assert (config.type_vocab_size, config.pad_token_id) == (1, PAD_ID)
    assert config._attn_implementation == "sdpa"
    assert model.bert.pooler is None
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert count_parameters(model) == parameter_count(SMALL, V, T)
    assert model_layout(model).vocab_size == V + 4


def test_seed_fixes_init_without_touching_global_rng():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a, b = build_model(SMALL, V, T, seed=1), build_model(SMALL, V, T, seed=1)
    assert torch.equal(torch.rand(3), before)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q), name
    c = build_model(SMALL, V, T, seed=2)
    assert not torch.equal(a.bert.embeddings.word_embeddings.weight,
                           c.bert.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_word_logits_at_positions_equals_full_gathered(attention):
    cfg = dataclasses.replace(SMALL, attention=attention)
    model = build_model(cfg, V, T, seed=3).eval()
    tokens, lengths = _batch(4)
    positions = (torch.rand(len(lengths), generator=torch.Generator().manual_seed(5))
                 * lengths).long()  # uniform real word position per sentence
    ids, mask = encode(tokens, lengths)
    masked = mask_positions(ids, positions)
    with torch.no_grad():
        full = word_logits(model, masked, mask)  # (n, T+2, V)
        at = word_logits(model, masked, mask, positions)  # (n, V)
        hf = model(input_ids=masked, attention_mask=mask).logits  # (n, T+2, V+4)
    assert full.shape == (len(ids), T + 2, V) and at.shape == (len(ids), V)
    torch.testing.assert_close(at, full[torch.arange(len(ids)), positions + 1], atol=1e-6, rtol=0)
    torch.testing.assert_close(full, hf[..., 4:], atol=1e-6, rtol=0)


def test_sdpa_and_eager_agree():
    tokens, lengths = _batch(6)
    ids, mask = encode(tokens, lengths)
    out = {}
    for attention in ("sdpa", "eager"):
        cfg = dataclasses.replace(SMALL, attention=attention)
        model = build_model(cfg, V, T, seed=7).eval()
        assert model.config._attn_implementation == attention
        with torch.no_grad():
            out[attention] = word_logits(model, ids, mask)
    torch.testing.assert_close(out["sdpa"], out["eager"], atol=1e-5, rtol=0)


def test_features_shapes_and_padding_invariance():
    model = build_model(SMALL, V, T + 3, seed=8).eval()  # room for the wide batch below
    tokens, lengths = _batch(9)
    wide = torch.cat([tokens, torch.full((len(tokens), 3), -1)], dim=1)  # 3 more pad columns
    with torch.no_grad():
        h = encoder_features(model, *encode(tokens, lengths))
        h_wide = encoder_features(model, *encode(wide, lengths))
        c = cls_features(model, *encode(tokens, lengths))
    assert h.shape == (len(tokens), T + 2, SMALL.d_model) and c.shape == (len(tokens), 32)
    torch.testing.assert_close(c, h[:, 0])
    real = (torch.arange(T + 2)[None, :] < (lengths + 2)[:, None])
    # padding is masked out of attention; only its positions (not its count) could matter
    torch.testing.assert_close(h[real], h_wide[:, : T + 2][real], atol=1e-5, rtol=0)


def test_helpers_reject_foreign_models():
    with pytest.raises(TypeError, match="build_model"):
        encoder_features(torch.nn.Linear(2, 2), torch.zeros(1, 3).long(), torch.ones(1, 3))
