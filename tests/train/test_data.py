"""Batches: pure functions of (seed, step); masking uniform over words; corpora read in epochs."""

import dataclasses

import pytest
import torch

from flatlm.models import MASK_ID, WORD_OFFSET, encode
from flatlm.train import TrainConfig, train
from flatlm.train.config import AdversarialConfig
from flatlm.train.data import (
    BatchPipeline,
    CorpusBatches,
    DownstreamPool,
    FreshSamples,
    derive_seed,
    generator,
    mask_batch,
    prefetch_depth,
)


def test_derive_seed_is_stable_and_separates_streams():
    assert derive_seed(0, "data", 3) == derive_seed(0, "data", 3)
    seeds = {derive_seed(s, name, i) for s in (0, 1) for name in ("data", "mask") for i in (0, 1)}
    assert len(seeds) == 8
    assert all(0 <= s < 2**63 for s in seeds)


def test_fresh_batches_are_a_function_of_the_step(src):
    stream = FreshSamples(src, 16, seed=3)
    a, b = stream.batch_at(5), stream.batch_at(4)
    assert torch.equal(stream.batch_at(5)[0], a[0]) and not torch.equal(a[0], b[0])


def test_one_masked_word_per_sentence_uniform_over_its_words():
    n, T = 40_000, 4
    lengths = torch.tensor([1, 2, 3, 4]).repeat(n // 4)
    tokens = torch.arange(T).repeat(n, 1).masked_fill(torch.arange(T) >= lengths[:, None], -1)
    batch = mask_batch(tokens, lengths, "one", generator(0, "mask", 0))
    assert torch.equal(batch.targets, tokens.gather(1, batch.positions[:, None]).squeeze(1))
    ids, _ = encode(tokens, lengths)
    changed = batch.input_ids != ids
    assert changed.sum(1).eq(1).all() and (batch.input_ids[changed] == MASK_ID).all()
    for L in (1, 2, 3, 4):
        freq = torch.bincount(batch.positions[lengths == L], minlength=T).float() / (n // 4)
        expected = torch.tensor([1 / L] * L + [0.0] * (T - L))
        torch.testing.assert_close(freq, expected, rtol=0, atol=0.02)  # ~5 standard errors


def test_masking_at_a_rate():
    n, T = 4000, 6
    lengths = torch.randint(1, T + 1, (n,), generator=torch.Generator().manual_seed(0))
    tokens = torch.full((n, T), 2).masked_fill(torch.arange(T) >= lengths[:, None], -1)
    batch = mask_batch(tokens, lengths, 0.15, generator(0, "mask", 0), count="bernoulli")
    real = tokens >= 0
    assert not (batch.positions & ~real).any()  # never padding
    assert abs(batch.positions.sum().item() / real.sum().item() - 0.15) < 0.01
    assert (batch.input_ids[:, 1:-1][batch.positions] == MASK_ID).all()
    assert (batch.input_ids[:, 1:-1][real & ~batch.positions] == 2 + WORD_OFFSET).all()
    assert torch.equal(batch.targets >= 0, batch.positions)


def test_corpus_epochs_cover_every_sentence_once():
    tokens = torch.arange(10)[:, None].repeat(1, 3)
    stream = CorpusBatches(tokens, torch.full((10,), 3), batch_size=4, seed=0)
    rows = torch.cat([stream.indices_at(i) for i in range(5)])  # 20 rows = 2 epochs
    assert sorted(rows[:10].tolist()) == list(range(10)) == sorted(rows[10:].tolist())
    assert not torch.equal(rows[:10], rows[10:])  # reshuffled
    assert torch.equal(stream.indices_at(2), rows[8:12])  # straddles the epochs; pure
    assert torch.equal(stream.batch_at(1)[0][:, 0], rows[4:8])


def test_downstream_pool_draws_disjoint_labelled_sets(src):
    pool = DownstreamPool(src, "B", size=200, d1=30, d2=20, seed=0)
    probe = pool.draw(3)
    assert probe.n1 == 30 and len(probe.labels) == 50 and (probe.labels >= 0).all()
    assert len({tuple(r) for r in probe.input_ids.tolist()}) <= 50
    assert not torch.equal(pool.draw(4).labels, probe.labels)
    assert torch.equal(pool.draw(3).input_ids, probe.input_ids)


@pytest.mark.parametrize("depth", [1, 3])
@pytest.mark.parametrize("stream", ["fresh", "corpus"])
@pytest.mark.parametrize("mask", ["one", 0.2])
def test_prefetching_changes_nothing(src, mask, stream, depth):
    cfg = TrainConfig(batch_size=8, mask=mask)
    corpus = src.sample(20, seed=3)  # epochs end mid-batch: threads share the permutation cache

    def sentences():
        if stream == "fresh":
            return FreshSamples(src, 8, 0)
        return CorpusBatches(*corpus, 8, 0, n_words=src.V)

    plain = BatchPipeline(cfg, sentences(), torch.device("cpu"))
    ahead = BatchPipeline(cfg, sentences(), torch.device("cpu"), prefetch=depth)
    try:
        for i in (0, 1, 2, 5, 6, 7, 8, 3, 4):
            a, b = plain.inputs_at(i).mlm, ahead.inputs_at(i).mlm
            assert all(torch.equal(x, y) for x, y in zip(
                (a.input_ids, a.positions, a.targets), (b.input_ids, b.positions, b.targets),
                strict=True))
    finally:
        ahead.close()


@pytest.mark.parametrize(("workers", "depth"), [("threads", 2), ("processes", 1)])
def test_a_run_is_bit_for_bit_the_same_with_batches_built_ahead(src, tiny_model, workers, depth,
                                                                  tmp_path):
    """train.prefetch against 0 on a tiny adversarial run (dropout on; a masking rate with
    BERT's 80/10/10 replacement; D1, D2 drawn from the pool at every update): the same loss
    history and the same weights, bit for bit. A worker process is spawned with a copy of the
    pipeline, pool included (one, as each takes seconds to start on a loaded 2-core machine)."""
    cfg = TrainConfig(algorithm="adversarial", steps=5, batch_size=16, mask=0.2, warmup_steps=2,
                      log_every=1, seed=4,
                          sections={"adversarial": AdversarialConfig(pool=64, d1=8, d2=8)},
                      prefetch=0)
    plain = train(cfg, src, tiny_model, tmp_path / "plain", progress=False)
    ahead = train(dataclasses.replace(cfg, prefetch=depth, prefetch_workers=workers), src,
                  tiny_model, tmp_path / "ahead", progress=False)
    assert len(plain.history) == 5 and ahead.history == plain.history
    for (name, a), b in zip(plain.model.state_dict().items(),
                            ahead.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_prefetch_auto_builds_none_ahead_on_the_cpu_and_up_to_4_on_cuda():
    assert prefetch_depth(TrainConfig(), torch.device("cpu")) == 0
    assert 1 <= prefetch_depth(TrainConfig(), torch.device("cuda")) <= 4
    assert prefetch_depth(TrainConfig(prefetch="3"), torch.device("cpu")) == 3  # a command line
    assert prefetch_depth(TrainConfig(prefetch=0), torch.device("cuda")) == 0


def test_split_into_micro_batches(src):
    batch = mask_batch(*src.sample(12, 0), "one", generator(0, "mask", 0))
    parts = batch.split(4)
    assert [len(p) for p in parts] == [4, 4, 4]
    assert torch.equal(torch.cat([p.targets for p in parts]), batch.targets)


def test_train_reads_a_corpus_on_disk(src, tiny_model, tmp_path):
    from flatlm.corpus import CorpusConfig, corpus_tensors, load_corpus, make_corpus
    from flatlm.train import train
    from flatlm.train.data import read_corpus

    corpus = make_corpus(src, CorpusConfig(n_train=50, n_entropy=0), tmp_path / "corpus",
                         progress=False)
    tokens, lengths = read_corpus(corpus, src)
    expected = corpus_tensors(load_corpus(corpus)[0]["train"])
    assert torch.equal(tokens, expected[0]) and torch.equal(lengths, expected[1])
    cfg = TrainConfig(steps=4, batch_size=16, warmup_steps=1, data=str(corpus))
    result = train(cfg, src, tiny_model, tmp_path / "run", progress=False)
    assert len(result.history) == 1 and result.history[0]["step"] == 4
