"""The batched loss of K models (flatlm.measure.packed_loss) is each model's pretrain_loss bit for
bit on the CPU (``==``, tolerance 0), with and without the truth, with model batches cut by the
truth's chunks; a member's values do not depend on the others in its pack; a model that does not
stack is refused with the way out."""

import pytest
import torch

import flatlm.measure.loss as loss_module
from flatlm.measure.loss import LossConfig, loss_terms, pretrain_loss
from flatlm.measure.packed_loss import packed_loss_terms, packed_pretrain_loss
from flatlm.models import build_model, parse_model
from flatlm.sources import load

SOURCE = {"kind": "pcfg", "random": {"vocab": 12, "depth": 2, "nonterminals_per_level": 3,
                                     "roots": 2}, "seed": 0}
SHAPE = "d16-h2-l1-i32"


@pytest.fixture(scope="module")
def src():
    return load(SOURCE)


@pytest.fixture(scope="module")
def models(src):
    """Three members of one shape, each initialised from its own seed, then moved by a few
    random steps so that the LayerNorms and biases are not at their initial values either."""
    out = []
    for seed in (1, 2, 3):
        model = build_model(parse_model(SHAPE), src.V, src.max_length, seed=seed)
        with torch.no_grad():
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(0.1 * torch.randn(p.shape, generator=g))
        out.append(model.eval())
    return out


@pytest.fixture(scope="module")
def sentences(src):
    return src.sample_validation(50, seed=5)


class WithoutTruth:
    """The PCFG seen as a source without exact conditionals (as real text is)."""

    has_truth = False

    def __init__(self, source):
        self.V = source.V


@pytest.mark.parametrize("positions", ["one", "all"])
def test_batched_loss_is_each_members_pretrain_loss_exactly(src, models, sentences, positions):
    tokens, lengths = sentences
    cfg = LossConfig(positions=positions, batch_size=16, seed=3)
    packed = packed_pretrain_loss(models, src, tokens, lengths, cfg)
    for k, model in enumerate(models):
        alone = pretrain_loss(model, src, tokens, lengths, cfg)
        assert packed[k] == alone  # every key, every float: tolerance 0
    assert packed[0] != packed[1]  # the members are different models


def test_batches_cut_by_the_truths_chunks_are_loss_terms_batches(src, models, sentences,
                                                                 monkeypatch):
    """With the truth in chunks of 7 sentences, loss_terms runs batches of 1 to 5 pairs (a
    batch never spans two chunks); the packed path must cut them alike (uncut batches of 5
    give other float32 logits: the first assertion proves the cut is seen), and a batch of one
    pair is where the single model's one-row products round otherwise than the pack's."""
    tokens, lengths = sentences
    cfg = LossConfig(positions="all", batch_size=5, seed=0)
    whole = loss_terms(models[0], src, tokens, lengths, cfg)
    monkeypatch.setattr(loss_module, "TRUTH_BYTES", 7 * 8 * src.max_length * src.V)
    assert loss_module.truth_chunk(cfg.batch_size, src.max_length, src.V) == 7
    chunked = loss_terms(models[0], src, tokens, lengths, cfg)
    assert any(not torch.equal(chunked[key], whole[key]) for key in chunked)
    packed = packed_loss_terms(models, src, tokens, lengths, cfg)
    for k, model in enumerate(models):
        alone = loss_terms(model, src, tokens, lengths, cfg)
        assert packed[k].keys() == alone.keys()
        for key in alone:
            assert torch.equal(packed[k][key], alone[key]), key


def test_a_source_without_truth_gives_the_one_hot_loss_of_each_member(src, models, sentences):
    tokens, lengths = sentences
    plain = WithoutTruth(src)
    cfg = LossConfig(positions="all", batch_size=32)
    packed = packed_pretrain_loss(models, plain, tokens, lengths, cfg)
    for k, model in enumerate(models):
        assert packed[k] == pretrain_loss(model, plain, tokens, lengths, cfg)
        assert "pretrain/kl" not in packed[k]


def test_a_members_values_do_not_depend_on_its_pack(src, models, sentences):
    tokens, lengths = sentences
    cfg = LossConfig(batch_size=16)
    three = packed_pretrain_loss(models, src, tokens, lengths, cfg)
    reversed_pair = packed_pretrain_loss([models[2], models[0]], src, tokens, lengths, cfg)
    assert reversed_pair == [three[2], three[0]]
    assert packed_pretrain_loss(models[1:2], src, tokens, lengths, cfg) == [three[1]]


def test_models_that_do_not_stack_are_refused_with_the_way_out(src, sentences):
    tokens, lengths = sentences
    lstm = build_model(parse_model("lstm-h16-l1"), src.V, src.max_length, seed=0)
    with pytest.raises(ValueError, match=r"post-LN BERT.*measure these models one by one"):
        packed_pretrain_loss([lstm, lstm], src, tokens, lengths, LossConfig())
    with pytest.raises(ValueError, match="no models"):
        packed_pretrain_loss([], src, tokens, lengths, LossConfig())
