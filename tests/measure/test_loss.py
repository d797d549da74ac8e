"""pretrain_loss: CE = entropy + KL, against brute force (an enumerated grammar, one forward pass
per masked word), in float64."""

import math

import numpy as np
import pytest
import torch

from flatlm.measure import ENTROPY, KL, LOSS, per_sentence_key, se_key
from flatlm.measure.loss import LOSS_DATA, LossConfig, loss_terms, masked_pairs, pretrain_loss
from flatlm.models import MASK_ID, WORD_OFFSET, build_model, encode, parse_model
from flatlm.sources import load
from flatlm.sources.reference import conditionals_from_joint, enumerate_yields

KEYS = (LOSS, ENTROPY, KL, LOSS_DATA)
TINY_MODEL = "d16-h2-l1-i32"
TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                        "roots": 2}, "seed": 0}  # 2-4 words; 1548 sentences




@pytest.fixture(scope="module")
def model(src):
    return build_model(parse_model(TINY_MODEL), src.V, src.max_length, seed=0)


@pytest.fixture(scope="module")
def language(src):
    """Every sentence of the tiny grammar as (tokens, lengths, Pr(x))."""
    joint = enumerate_yields(src.grammar, src.max_length)
    T = src.max_length
    tokens = torch.tensor([list(x) + [-1] * (T - len(x)) for x in joint])
    lengths = torch.tensor([len(x) for x in joint])
    return tokens, lengths, torch.tensor(list(joint.values()), dtype=torch.float64), joint


@pytest.mark.parametrize("positions", ["one", "all"])
def test_loss_is_entropy_plus_kl_per_sentence_and_on_average(src, model, positions):
    tokens, lengths = src.sample(64, seed=1)
    cfg = LossConfig(positions=positions, batch_size=50, seed=2)
    terms = loss_terms(model, src, tokens, lengths, cfg)
    assert all(terms[k].dtype == torch.float64 and terms[k].shape == (64,) for k in KEYS)
    torch.testing.assert_close(terms[LOSS], terms[ENTROPY] + terms[KL], rtol=0, atol=1e-6)
    assert bool((terms[KL] > 0).all()) and bool((terms[ENTROPY] > 0).all())
    out = pretrain_loss(model, src, tokens, lengths, cfg)
    assert abs(out[LOSS] - out[ENTROPY] - out[KL]) < 1e-6
    L = lengths.double()
    for key in KEYS:  # per token: length-weighted; per sentence: plain mean, s.e. over sentences
        assert out[key] == pytest.approx(float((terms[key] * L).sum() / L.sum()), abs=1e-12)
        sentence_key = per_sentence_key(key)
        assert out[sentence_key] == pytest.approx(float(terms[key].mean()), abs=1e-12)
        assert out[se_key(sentence_key)] == pytest.approx(float(terms[key].std()) / 8,
                                                          abs=1e-12)


def test_per_token_entropy_is_the_sources_and_loss_is_entropy_plus_kl_exactly(src, model,
                                                                               language):
    """Over every sentence of the language (each once), the per-token entropy with all positions
    masked is exactly ``Source.sentence_entropies`` pooled by token, and loss = entropy + KL."""
    tokens, lengths = language[0], language[1]
    out = pretrain_loss(model, src, tokens, lengths, LossConfig(positions="all",
                                                                batch_size=4096))
    sums = src.sentence_entropies(tokens, lengths)
    assert out[ENTROPY] == pytest.approx(sums.sum() / float(lengths.sum()), abs=1e-12)
    assert out[LOSS] == pytest.approx(out[ENTROPY] + out[KL], abs=1e-12)
    assert out[ENTROPY] != pytest.approx(out[per_sentence_key(ENTROPY)], abs=1e-3)


def test_expected_loss_equals_one_hot_loss_over_the_whole_language(src, model, language):
    """E_x mean_t -log q(x_t | x_{-t}) = E_x mean_t CE(Pr(.|x_{-t}), q): exact when x runs over
    every sentence of the grammar weighted by Pr(x); this ties the truth's positions to the
    model's."""
    tokens, lengths, prob, _ = language
    assert prob.sum().item() == pytest.approx(1.0, abs=1e-12)
    terms = loss_terms(model, src, tokens, lengths, LossConfig(positions="all", batch_size=2048))
    expected, one_hot = (prob * terms[LOSS]).sum(), (prob * terms[LOSS_DATA]).sum()
    assert abs(float(expected - one_hot)) < 1e-9


def _reference_terms(model, joint, V, tokens, lengths):
    """One forward pass of the whole HF model per (sentence, position); the truth from the joint
    probability table (no inside-outside, no batching, no word_logits)."""
    truth = conditionals_from_joint(joint, tokens.numpy(), lengths.numpy(), V)  # (n, T, V)
    ids, mask = encode(tokens, lengths)
    out = {k: [] for k in KEYS}
    model.eval()
    with torch.no_grad():
        for i, L in enumerate(lengths.tolist()):
            per = {k: [] for k in KEYS}
            for t in range(L):
                x = ids[i : i + 1].clone()
                x[0, t + 1] = MASK_ID
                logits = model(input_ids=x, attention_mask=mask[i : i + 1]).logits
                log_q = logits[0, t + 1, WORD_OFFSET:].double().log_softmax(-1).numpy()
                p = truth[i, t]
                log_p = np.log(np.where(p > 0, p, 1.0))
                per[LOSS].append(-(p * log_q).sum())
                per[ENTROPY].append(-(p * log_p).sum())
                per[KL].append((p * (log_p - log_q)).sum())
                per[LOSS_DATA].append(-log_q[int(tokens[i, t])])
            for k in KEYS:
                out[k].append(np.mean(per[k]))
    model.train()
    return {k: torch.tensor(v) for k, v in out.items()}


def test_all_positions_match_one_forward_per_masked_word(src, model, language):
    joint = language[3]
    tokens, lengths = src.sample(10, seed=3)
    terms = loss_terms(model, src, tokens, lengths, LossConfig(positions="all", batch_size=7))
    reference = _reference_terms(model, joint, src.V, tokens, lengths)
    for key in KEYS:
        torch.testing.assert_close(terms[key], reference[key], rtol=0, atol=1e-5)
    assert model.training  # mode put back


def test_one_position_is_seeded_uniform_and_batch_size_free(src, model):
    lengths = torch.tensor([4] * 4000 + [2] * 10)
    rows, pos = masked_pairs(lengths, LossConfig(seed=0))
    assert rows.tolist() == list(range(4010)) and bool((pos < lengths).all())
    counts = torch.bincount(pos[:4000], minlength=4)
    assert counts.min() > 900 and counts.max() < 1100  # ~1000 each
    assert torch.equal(pos, masked_pairs(lengths, LossConfig(seed=0))[1])
    assert not torch.equal(pos, masked_pairs(lengths, LossConfig(seed=1))[1])

    tokens, lengths = src.sample(40, seed=4)
    a = pretrain_loss(model, src, tokens, lengths, LossConfig(seed=5, batch_size=3))
    b = pretrain_loss(model, src, tokens, lengths, LossConfig(seed=5, batch_size=64))
    c = pretrain_loss(model, src, tokens, lengths, LossConfig(seed=6, batch_size=64))
    assert all(math.isclose(a[k], b[k], abs_tol=1e-6) for k in a)
    assert a[LOSS] != c[LOSS]


def test_one_hot_truth_has_zero_entropy():
    dyck = load("dyck:4")
    tokens, lengths = dyck.sample(16, seed=0)
    model = build_model(parse_model(TINY_MODEL), dyck.V, dyck.max_length, seed=1)
    out = pretrain_loss(model, dyck, tokens, lengths, LossConfig(positions="all"))
    assert out[ENTROPY] == 0.0 and out[LOSS] == pytest.approx(out[KL], abs=1e-12)
    assert out[LOSS] == pytest.approx(out[LOSS_DATA], abs=1e-9)  # one-hot truth: the same loss


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="positions"):
        LossConfig(positions="some")
    with pytest.raises(ValueError, match="batch_size"):
        LossConfig(batch_size=0)


@pytest.mark.parametrize("positions", ["one", "all"])
def test_truth_in_chunks_changes_no_term(src, model, positions, monkeypatch):
    """The truth computed a few sentences at a time (chunks that cut model batches) gives the
    terms of one call over all sentences: each pair reads its own sentence's conditionals."""
    import flatlm.measure.loss as loss_module

    tokens, lengths = src.sample(40, seed=3)
    cfg = LossConfig(positions=positions, batch_size=6, seed=4)
    whole = loss_terms(model, src, tokens, lengths, cfg)
    per_token = 8 * src.max_length * src.V
    monkeypatch.setattr(loss_module, "TRUTH_BYTES", 7 * per_token)  # chunks of 7 sentences
    assert loss_module.truth_chunk(cfg.batch_size, src.max_length, src.V) == 7
    chunked = loss_terms(model, src, tokens, lengths, cfg)
    for key in KEYS:
        torch.testing.assert_close(chunked[key], whole[key], rtol=0, atol=1e-6)
    assert loss_module.truth_chunk(cfg.batch_size, src.max_length, 10**9) == cfg.batch_size
