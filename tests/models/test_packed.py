"""flatlm.models.packed: K BERTs as one model give each member's logits and gradients of its
single model, bit for bit on the CPU, with dropout drawn from the member's generator in the
state of the single model's global RNG."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from flatlm.models.bert import build_model, word_logits
from flatlm.models.packed import PackedBert
from flatlm.models.presets import parse_model

V, T, N = 12, 4, 8


def _batch(K, seed=0, padded=None):
    """Each member's batch: with padded sentences (``padded[k]``, default all members) or
    without any padding (the single model's attention then gets no mask)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, V + 4, (K, N, T + 2), generator=g)
    ids[..., 0], ids[..., -1] = 2, 3
    for k in range(K):
        if padded is None or padded[k]:
            ids[k, :3, -2:] = 0  # padded sentences
            ids[k, :3, -3] = 3
    return ids, (ids != 0).long(), torch.randint(0, 2, (K, N), generator=g), \
        torch.randint(0, V, (K, N), generator=g)


@pytest.mark.parametrize("padded", [None, (False,) * 3, (True, False, True)],
                         ids=["padded", "unpadded", "some-padded"])
@pytest.mark.parametrize("dropout", [(0.1, 0.1, 0.1), (0.0, 0.0, 0.0), (0.0, 0.1, 0.2)],
                         ids=["dropout", "none", "mixed"])
def test_members_are_their_single_models(dropout, padded):
    shape = parse_model("d32-h2-l2-i64")
    models = [build_model(dataclasses.replace(shape, dropout=p), V, T, seed=k)
              for k, p in enumerate(dropout)]
    pack = PackedBert(models)
    ids, mask, positions, targets = _batch(len(models), padded=padded)
    single = []
    for k, m in enumerate(models):
        torch.manual_seed(100 + k)  # the single model's dropout: the global RNG
        logits = word_logits(m, ids[k], mask[k], positions[k])
        F.cross_entropy(logits, targets[k], reduction="sum").backward()
        single.append(logits.detach())
    generators = [torch.Generator().manual_seed(100 + k) for k in range(len(models))]
    logits = pack.word_logits(ids, mask, positions, dropout=dropout, generators=generators)
    sum(F.cross_entropy(x, t, reduction="sum")
        for x, t in zip(logits, targets, strict=True)).backward()
    for k, m in enumerate(models):
        assert torch.equal(logits[k].detach(), single[k])
        for name, p in m.named_parameters():
            assert torch.equal(pack.p(name).grad[k], p.grad), (k, name)


def test_keep_drops_members_and_load_member_gives_one_back():
    models = [build_model(parse_model("d32-h2-l1-i64"), V, T, seed=k) for k in range(3)]
    pack = PackedBert(models)
    pack.keep([2, 0])
    assert pack.k == 2
    fresh = pack.load_member(0, build_model(parse_model("d32-h2-l1-i64"), V, T, seed=9))
    for a, b in zip(fresh.state_dict().values(), models[2].state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_refuses_what_it_does_not_batch():
    with pytest.raises(ValueError, match="only the post-LN BERT"):
        PackedBert([build_model(parse_model("d32-h2-l1-i64-pre"), V, T, seed=0)])
