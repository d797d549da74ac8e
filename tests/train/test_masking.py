"""BERT's masking rule: which words are predicted, what their inputs become, the cap."""

import pytest
import torch

from flatlm.core.seeds import generator
from flatlm.core.tokens import MASK_ID, WORD_OFFSET, encode
from flatlm.train import TrainConfig
from flatlm.train.data import mask_batch

V, T, N = 50, 16, 20_000


def sentences(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (N,), generator=g)
    tokens = torch.randint(0, V, (N, T), generator=g)
    tokens[torch.arange(T)[None, :] >= lengths[:, None]] = -1
    return tokens, lengths


def outcome(batch, tokens):
    """Fractions of predicted words whose input is [MASK], another word, the word itself."""
    chosen = batch.positions if batch.positions.dtype == torch.bool else \
        torch.zeros_like(tokens, dtype=torch.bool).scatter_(1, batch.positions[:, None], True)
    inputs = batch.input_ids[:, 1:-1][chosen]
    words = tokens[chosen]
    n = len(words)
    return ((inputs == MASK_ID).sum() / n, (inputs == words + WORD_OFFSET).sum() / n,
            chosen, n)


@pytest.mark.parametrize("mask", ["one", 0.15])
def test_80_10_10_frequencies(mask):
    tokens, lengths = sentences()
    batch = mask_batch(tokens, lengths, mask, generator(0, "mask", 0), n_words=V,
                       replace=(0.8, 0.1, 0.1))
    masked, kept, chosen, n = outcome(batch, tokens)
    se = (0.1 * 0.9 / n) ** 0.5
    # "kept" = unchanged (0.1) + a random word that happens to equal the word (0.1 / V)
    assert abs(float(masked) - 0.8) < 5 * (0.16 / n) ** 0.5
    assert abs(float(kept) - (0.1 + 0.1 / V)) < 5 * se
    ids, _ = encode(tokens, lengths)
    assert torch.equal(batch.input_ids[:, 1:-1][~chosen], ids[:, 1:-1][~chosen])  # rest intact
    replaced = batch.input_ids[:, 1:-1][chosen]
    others = replaced[(replaced != MASK_ID) & (replaced != tokens[chosen] + WORD_OFFSET)]
    assert len(others) > 0.08 * n and int(others.min()) >= WORD_OFFSET
    assert int(others.max()) < V + WORD_OFFSET
    if mask == 0.15:
        assert abs(n / float(lengths.sum()) - 0.15) < 0.005


def test_prediction_cap_keeps_a_uniform_subset():
    tokens, lengths = sentences(1)
    capped = mask_batch(tokens, lengths, 0.5, generator(0, "mask", 3), n_words=V,
                        max_predictions=2)
    counts = capped.positions.sum(1)
    assert int(counts.max()) == 2 and bool((counts <= lengths).all())
    full = mask_batch(tokens, lengths, 0.5, generator(0, "mask", 3), n_words=V)
    assert bool((capped.positions <= full.positions).all())  # a subset of the rate's choice
    long = lengths == T
    kept = capped.positions[long].float().mean(0)  # (T,): each position equally likely kept
    assert float(kept.max() - kept.min()) < 0.05
    assert torch.equal(capped.targets, torch.where(capped.positions, tokens, -1))


def test_plain_mask_rule_draws_nothing_more():
    """(1, 0, 0) without a cap: only [MASK], and the same batch as before the rule existed."""
    tokens, lengths = sentences(2)
    for mask in ("one", 0.15):
        batch = mask_batch(tokens, lengths, mask, generator(0, "mask", 1))
        masked, _, _, _ = outcome(batch, tokens)
        assert float(masked) == 1.0
    gen = generator(0, "mask", 1)
    mask_batch(tokens, lengths, 0.15, gen)
    ref = generator(0, "mask", 1)
    torch.rand(N, T, generator=ref)
    assert torch.equal(torch.rand(3, generator=gen), torch.rand(3, generator=ref))


def test_config_checks_the_rule():
    assert TrainConfig().mask_replace == (0.8, 0.1, 0.1)
    with pytest.raises(ValueError, match="train.mask_replace"):
        TrainConfig(mask_replace=(0.8, 0.1, 0.2))
    with pytest.raises(ValueError, match="train.max_predictions"):
        TrainConfig(max_predictions=0)
    with pytest.raises(ValueError, match="train.schedule"):
        TrainConfig(schedule="cosine")


def test_linear_schedule_decays_to_zero_at_the_last_step(src, tiny_model, tmp_path):
    from flatlm.core.schedules import learning_rate
    from flatlm.train import train

    cfg = TrainConfig(steps=8, batch_size=8, warmup_steps=2, schedule="linear", log_every=1,
                      lr=1e-3)
    lrs = [r["train/lr"] for r in train(cfg, src, tiny_model, tmp_path, progress=False).history]
    want = [learning_rate(s, peak=1e-3, warmup_steps=2, total_steps=8) for s in range(8)]
    assert lrs == pytest.approx(want) and lrs[1] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-3 / 6)
