"""Dyck source (paper section 5): conditionals by counting, g*, the +-e_t encoding, samplers."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from flatlm.sources import SourceError, load
from flatlm.sources.dyck import Dyck, brute_force_conditionals


def every_string(T):
    tokens = torch.tensor(list(itertools.product((0, 1), repeat=T)))
    return tokens, torch.full((len(tokens),), T)


@pytest.mark.parametrize("T", [4, 6, 8])
def test_conditionals_equal_counting(T):
    src = Dyck(T)
    tokens, lengths = every_string(T)  # balanced and unbalanced
    got = src.conditionals(tokens, lengths, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(got, brute_force_conditionals(src, tokens, lengths))
    balanced = (tokens == 0).sum(1) == T // 2
    assert (got[balanced.numpy()].sum(-1) == 1).all()


def test_conditionals_with_padding():
    src = Dyck(6)
    tokens = torch.tensor([[0, 1, 1, 0, -1, -1], [1, 0, 0, -1, -1, -1], [0, 0, 1, 1, 1, 0]])
    lengths = torch.tensor([4, 3, 6])
    got = src.conditionals(tokens, lengths, dtype=torch.float64).numpy()
    np.testing.assert_array_equal(got, brute_force_conditionals(src, tokens, lengths))
    assert (got[0, :4].sum(-1) == 1).all() and (got[0, 4:] == 0).all()
    assert (got[1] == 0).all()  # odd length: no balanced string
    # the masked bracket is the one that restores the balance
    assert got[2, 0].tolist() == [1.0, 0.0] and got[2, 4].tolist() == [0.0, 1.0]


def test_g_star_labels():
    src = load("dyck:4")
    tokens = torch.tensor([[0, 1, 0, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    labels = src.labels(tokens, torch.full((4,), 4), "g_star")
    assert labels.tolist() == [0, 4, -2, -4] and labels.dtype == torch.int64
    assert src.label_offset == 4 and src.num_classes("g_star") == 9
    assert (labels + src.label_offset).min() >= 0
    assert (src.labels(*src.sample(100, seed=0)) == 0).all()


def test_encoding_matches_paper():
    T = 8
    src = Dyck(T)
    tokens, lengths, _ = src.sample_downstream(200, seed=1)
    x = src.encode(tokens)
    assert tuple(x.shape) == (200, T, 2 * T) and x.dtype == torch.float32
    # g*(x) = -<1_T, [sum_t x_t]_{1:T}>
    assert torch.equal(-x.sum(1)[:, :T].sum(1).long(), src.labels(tokens, lengths))
    assert (x.abs().sum(-1) == 1).all()
    assert torch.equal(x[:, torch.arange(T), torch.arange(T)], 1.0 - 2.0 * tokens)


def test_encoding_of_masked_positions():
    T = 6
    src = Dyck(T)
    tokens, _ = src.sample(500, seed=2)
    where = torch.arange(500) % T
    x = src.encode(tokens, where, torch.Generator().manual_seed(0))
    rows = x[torch.arange(500), where]  # (500, 2T)
    v = rows[torch.arange(500), where + T]
    assert set(v.tolist()) == {-1.0, 1.0} and abs(v.mean()) < 0.2
    assert (rows.abs().sum(-1) == 1).all()
    again = src.encode(tokens, where, torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
    mask = torch.zeros(500, T, dtype=torch.bool)
    mask[torch.arange(500), where] = True
    assert torch.equal(src.encode(tokens, mask, torch.Generator().manual_seed(0)), x)
    with pytest.raises(ValueError, match="Generator"):
        src.encode(tokens, where)


def test_sampler_uniform_over_balanced_strings():
    T, n = 6, 20_000
    tokens, lengths = Dyck(T).sample(n, seed=3)
    assert (lengths == T).all() and ((tokens == 0).sum(1) == T // 2).all()
    index = (tokens * 2 ** torch.arange(T - 1, -1, -1)).sum(1).numpy()
    counts = np.bincount(index, minlength=2**T)
    balanced = [sum(b) == T // 2 for b in itertools.product((0, 1), repeat=T)]
    assert counts[~np.array(balanced)].sum() == 0
    observed = counts[np.array(balanced)]
    assert len(observed) == math.comb(T, T // 2)
    assert chisquare(observed).pvalue > 1e-3
    assert torch.equal(tokens, Dyck(T).sample(n, seed=3)[0])


def test_downstream_sampler_is_uniform():
    tokens, _, _ = Dyck(8).sample_downstream(20_000, seed=4)
    assert abs(tokens.double().mean() - 0.5) < 0.01
    assert tokens.sum(1).unique().numel() == 9  # every count 0..8 occurs


def test_spec_and_errors():
    assert load("dyck:6").spec == {"kind": "dyck", "length": 6}
    assert load({"kind": "dyck"}).max_length == 8
    assert load("dyck:6").vocab == ["<", ">"]
    assert load("dyck:6").fingerprint() != load("dyck:8").fingerprint()
    for bad in ("dyck:7", "dyck:0", "dyck:-2", 'dyck:"8"'):
        with pytest.raises(SourceError, match="'length' must be an even integer"):
            load(bad)
    with pytest.raises(SourceError, match="unknown key 'lenght'"):
        load({"kind": "dyck", "lenght": 8})
