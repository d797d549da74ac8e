"""BERT's masking rule: which words are predicted, what their inputs become, the cap."""

import random

import pytest
import torch

from flatlm.core.seeds import generator
from flatlm.core.tokens import MASK_ID, WORD_OFFSET, encode
from flatlm.sources import load
from flatlm.train import TrainConfig
from flatlm.train.data import BatchPipeline, FreshSamples, fixed_mask_count, mask_batch

V, T, N = 50, 16, 20_000


def released_masked_lms(words: int, masked_lm_prob=0.15, max_predictions_per_seq=5, seed=0):
    """The released create_pretraining_data.py's create_masked_lm_predictions (the positions
    part), transcribed: a sentence of ``words`` words between [CLS] and [SEP]; the masked
    positions it returns."""
    rng = random.Random(seed)
    tokens = ["[CLS]", *(f"w{i}" for i in range(words)), "[SEP]"]
    cand_indexes = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
    rng.shuffle(cand_indexes)
    num_to_predict = min(max_predictions_per_seq,
                         max(1, int(round(len(tokens) * masked_lm_prob))))
    return sorted(cand_indexes[:num_to_predict])


def released_count(words: int, max_predictions: int = 5) -> int:
    return len(released_masked_lms(words, max_predictions_per_seq=max_predictions))


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


@pytest.mark.parametrize("mask, count", [("one", "fixed"), (0.15, "fixed"),
                                         (0.15, "bernoulli")])
def test_80_10_10_frequencies(mask, count):
    tokens, lengths = sentences()
    batch = mask_batch(tokens, lengths, mask, generator(0, "mask", 0), n_words=V,
                       replace=(0.8, 0.1, 0.1), count=count)
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
    if mask == 0.15 and count == "bernoulli":
        assert abs(n / float(lengths.sum()) - 0.15) < 0.005
    if mask == 0.15 and count == "fixed":
        assert torch.equal(chosen.sum(1), torch.tensor(
            [released_count(int(w)) for w in lengths]))


def test_prediction_cap_keeps_a_uniform_subset():
    tokens, lengths = sentences(1)
    capped = mask_batch(tokens, lengths, 0.5, generator(0, "mask", 3), n_words=V,
                        max_predictions=2, count="bernoulli")
    counts = capped.positions.sum(1)
    assert int(counts.max()) == 2 and bool((counts <= lengths).all())
    full = mask_batch(tokens, lengths, 0.5, generator(0, "mask", 3), n_words=V,
                      count="bernoulli")
    assert bool((capped.positions <= full.positions).all())  # a subset of the rate's choice
    long = lengths == T
    kept = capped.positions[long].float().mean(0)  # (T,): each position equally likely kept
    assert float(kept.max() - kept.min()) < 0.05
    assert torch.equal(capped.targets, torch.where(capped.positions, tokens, -1))


def test_plain_mask_rule_draws_nothing_more():
    """(1, 0, 0) without a cap: only [MASK], and the same batch as before the rule existed."""
    tokens, lengths = sentences(2)
    for mask, count in (("one", "fixed"), (0.15, "fixed"), (0.15, "bernoulli")):
        batch = mask_batch(tokens, lengths, mask, generator(0, "mask", 1), count=count)
        masked, _, _, _ = outcome(batch, tokens)
        assert float(masked) == 1.0
        if mask == "one":
            continue
        gen = generator(0, "mask", 1)
        mask_batch(tokens, lengths, 0.15, gen, count=count)
        ref = generator(0, "mask", 1)
        torch.rand(N, T, generator=ref)  # one draw: the positions (a rate, or the keys)
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


@pytest.mark.parametrize("cap", [5, 20, None])
def test_fixed_count_is_the_released_count(cap):
    """max(1, round(0.15 (L + 2))), capped: the released code's count for every length, the
    half-way cases (L = 28: 4.5 -> 4) included."""
    for words in range(1, 130):
        want = released_count(words, 10**9 if cap is None else cap)
        assert fixed_mask_count(words, 0.15, cap) == want, words
    assert [fixed_mask_count(w, 0.15, 5) for w in (1, 4, 5, 8, 12, 16, 28, 30, 40)] == \
        [1, 1, 1, 2, 2, 3, 4, 5, 5]


def test_the_trainer_masks_exactly_the_released_count_per_sentence(src):
    """paper-code's masking through the pipeline the trainer uses: every sentence gets exactly
    max(1, round(0.15 (L + 2))) predictions (none unmasked), a uniform subset of its words."""
    paper = load("pcfg:paper")  # sentences of 2..16 words
    cfg = TrainConfig(batch_size=512, mask=0.15, max_predictions=5)
    assert cfg.mask_count == "fixed"
    pipeline = BatchPipeline(cfg, FreshSamples(paper, 512, 0), torch.device("cpu"))
    for i in range(3):
        lengths = FreshSamples(paper, 512, 0).batch_at(i)[1]
        chosen = pipeline.inputs_at(i).mlm.positions
        want = torch.tensor([released_count(int(w)) for w in lengths])
        assert torch.equal(chosen.sum(1), want)
        assert not (chosen & (torch.arange(chosen.shape[1]) >= lengths[:, None])).any()


def test_the_fixed_count_draws_a_uniform_subset():
    tokens, lengths = sentences(3)
    batch = mask_batch(tokens, lengths, 0.15, generator(0, "mask", 4), count="fixed")
    full = batch.positions[lengths == T].float()  # 3 of the 16 words each
    assert torch.equal(full.sum(1), torch.full((len(full),), 3.0))
    freq = full.mean(0)  # each position chosen with probability 3/16
    assert float((freq - 3 / T).abs().max()) < 5 * (3 / T * (1 - 3 / T) / len(full)) ** 0.5


def test_mask_count_is_checked():
    assert TrainConfig().mask_count == "fixed"
    with pytest.raises(ValueError, match="train.mask_count='exact': use one of fixed, bernoulli"):
        TrainConfig(mask_count="exact")
