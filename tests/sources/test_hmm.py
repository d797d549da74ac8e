"""HMM source: forward-backward against sums over all hidden paths, sampler against exact laws."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from flatlm.sources import SourceError, load
from flatlm.sources.hmm import (
    HMM,
    brute_force_conditionals,
    brute_force_posteriors,
    sequence_logprob,
)


def tiny_hmm(seed, vocab=4, states=3, length=5, blocks=2, leakage=0.2, concentration=1.0):
    return HMM.from_spec({"kind": "hmm", "seed": seed, "vocab": vocab, "states": states,
                          "length": length, "blocks": blocks, "leakage": leakage,
                          "concentration": concentration})


def all_sentences(src):
    """Every sentence of length T, with its exact probability by the path sum."""
    T = src.max_length
    tokens = torch.tensor(list(itertools.product(range(src.V), repeat=T)))
    lengths = torch.full((len(tokens),), T)
    return tokens, lengths, np.exp(sequence_logprob(src, tokens, lengths))


def padded_batch(src, seed, n=12):
    """Sampled sentences cut to random lengths 1..T (padding -1), plus uniform random words."""
    rng = np.random.default_rng(seed)
    tokens, _ = src.sample(n, seed)
    tokens[n // 2 :] = torch.from_numpy(rng.integers(0, src.V, (n - n // 2, src.max_length)))
    lengths = torch.from_numpy(rng.integers(1, src.max_length + 1, n))
    tokens[torch.arange(src.max_length)[None, :] >= lengths[:, None]] = -1
    return tokens, lengths


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_conditionals_equal_path_sum(seed):
    src = tiny_hmm(seed)
    tokens, lengths = padded_batch(src, seed)
    exact = brute_force_conditionals(src, tokens, lengths)
    fast64 = src.conditionals(tokens, lengths, dtype=torch.float64).numpy()
    fast32 = src.conditionals(tokens, lengths, dtype=torch.float32).numpy()
    np.testing.assert_allclose(fast64, exact, rtol=0, atol=1e-9)
    np.testing.assert_allclose(fast32, exact, rtol=0, atol=1e-5)
    real = torch.arange(src.max_length)[None, :] < lengths[:, None]
    np.testing.assert_allclose(fast64.sum(-1)[real.numpy()], 1.0, atol=1e-12)
    assert (fast64[~real.numpy()] == 0).all()


def test_conditionals_survive_long_peaked_sentences():
    src = HMM.from_spec({"kind": "hmm", "seed": 5, "vocab": 30, "states": 20, "length": 64,
                         "blocks": 5, "leakage": 0.01, "concentration": 0.05})
    tokens, lengths = src.sample(64, seed=0)
    p32 = src.conditionals(tokens, lengths, dtype=torch.float32)
    p64 = src.conditionals(tokens, lengths, dtype=torch.float64)
    assert torch.isfinite(p32).all()
    torch.testing.assert_close(p32.sum(-1), torch.ones(64, 64), rtol=0, atol=1e-5)
    torch.testing.assert_close(p32.double(), p64, rtol=0, atol=1e-4)


def test_sampler_matches_exact_sentence_probabilities():
    src = tiny_hmm(7, vocab=3, states=2, length=3, blocks=1)
    tokens, lengths, probs = all_sentences(src)
    assert probs.sum() == pytest.approx(1.0, abs=1e-12)
    n = 30_000
    sample, _ = src.sample(n, seed=11)
    index = (sample * torch.tensor([9, 3, 1])).sum(1).numpy()  # base-3 sentence id
    counts = np.bincount(index, minlength=len(probs))
    assert chisquare(counts, n * probs).pvalue > 1e-3


def test_sample_with_states_and_determinism():
    src = tiny_hmm(0, vocab=20, states=10, length=16, blocks=2)
    tokens, lengths = src.sample(500, seed=3)
    tokens2, lengths2, states = src.sample_with_states(500, seed=3)
    assert torch.equal(tokens, tokens2) and torch.equal(lengths, lengths2)
    assert tokens.dtype == states.dtype == torch.int64 and tuple(states.shape) == (500, 16)
    assert (lengths == 16).all() and tokens.min() >= 0 and tokens.max() < src.V
    assert not torch.equal(tokens, src.sample(500, seed=4)[0])
    assert torch.equal(tokens, src.sample(500, seed=3)[0])


def test_leakage_zero_stays_in_one_block():
    src = tiny_hmm(1, vocab=12, states=6, length=10, blocks=3, leakage=0.0)
    _, _, states = src.sample_with_states(200, seed=0)
    block = states * 3 // 6
    assert (block == block[:, :1]).all()


def test_impossible_contexts_give_zero_rows():
    src = tiny_hmm(1, vocab=4, states=2, length=4, blocks=2, leakage=0.0)
    # words 0, 1 belong to block 0 and 2, 3 to block 1: a sentence cannot mix them
    tokens, lengths = torch.tensor([[0, 1, 2, 3], [0, 0, 2, 0], [0, 1, 0, 1]]), torch.full((3,), 4)
    got = src.conditionals(tokens, lengths, dtype=torch.float64)
    np.testing.assert_allclose(got.numpy(), brute_force_conditionals(src, tokens, lengths),
                               rtol=0, atol=1e-12)
    assert (got[0] == 0).all() and got[1].sum(-1).tolist() == [0, 0, 1, 0]
    assert src.labels(tokens, lengths, "task-1").tolist()[:2] == [-1, -1]


def test_labels_posterior_and_sampled():
    src = tiny_hmm(4)
    tokens, lengths, states = src.sample_with_states(20, seed=2)
    post = brute_force_posteriors(src, tokens, lengths)
    assert src.tasks == ("task-1", "task-2", "task-3", "task-4", "task-5")
    for k in (1, 3, 5):
        got = src.labels(tokens, lengths, f"task-{k}")
        assert got.tolist() == post[:, k - 1].argmax(-1).tolist()
        sampled = src.labels(tokens, lengths, f"task-{k}", rule="sampled", states=states)
        assert torch.equal(sampled, states[:, k - 1])
    assert src.num_classes("task-2") == 3
    short = src.labels(tokens[:2], torch.tensor([2, 5]), "task-3")
    assert short[0] == -1
    with pytest.raises(ValueError, match="sample_with_states"):
        src.labels(tokens, lengths, "task-1", rule="sampled")
    with pytest.raises(ValueError, match="task-k"):
        src.labels(tokens, lengths, "task-6")


def test_file_round_trip(tmp_path):
    src = tiny_hmm(9)
    path = src.save(tmp_path / "hmm.npz")
    loaded = load({"kind": "hmm", "file": str(path), "length": 5})
    assert loaded.spec == {"kind": "hmm", "file": str(path), "length": 5}
    assert loaded.fingerprint() == src.fingerprint()
    tokens, lengths = src.sample(30, seed=1)
    assert torch.equal(loaded.conditionals(tokens, lengths, dtype=torch.float64),
                       src.conditionals(tokens, lengths, dtype=torch.float64))
    assert load(f"hmm:{path}").max_length == 16  # length defaults to the paper's 16


@pytest.mark.parametrize(
    "array, edit, message",
    [
        ("transition", lambda a: a.__setitem__((1, 0), a[1, 0] + 0.01), "'transition' row 1 sums"),
        ("emission", lambda a: a.__setitem__((2, 1), np.nan), "'emission' row 2 has a NaN"),
        ("initial", lambda a: a.__setitem__(0, -a[0]), "'initial' has a negative"),
    ],
    ids=["row-sum", "nan", "negative"],
)
def test_invalid_file_names_array_and_row(tmp_path, array, edit, message):
    arrays = dict(zip(("initial", "transition", "emission"),
                      tiny_hmm(0)._fingerprint_arrays(), strict=True))
    edit(arrays[array])
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(SourceError, match=message) as err:
        load({"kind": "hmm", "file": str(path)})
    assert "bad.npz" in str(err.value)


def test_invalid_file_shapes_and_missing(tmp_path):
    pi, A, E = tiny_hmm(0)._fingerprint_arrays()
    np.savez(tmp_path / "shape.npz", initial=pi, transition=A[:2], emission=E)
    with pytest.raises(SourceError, match="'transition' has shape"):
        load({"kind": "hmm", "file": str(tmp_path / "shape.npz")})
    np.savez(tmp_path / "missing.npz", initial=pi, transition=A)
    with pytest.raises(SourceError, match="missing array.*emission"):
        load({"kind": "hmm", "file": str(tmp_path / "missing.npz")})
    with pytest.raises(SourceError, match="does not exist"):
        load({"kind": "hmm", "file": str(tmp_path / "nope.npz")})
    np.savez(tmp_path / "complex.npz", initial=pi.astype(complex), transition=A, emission=E)
    with pytest.raises(SourceError, match="'initial' has dtype complex128; probabilities must "
                                          "be real"):  # not cast to real with a numpy warning
        load({"kind": "hmm", "file": str(tmp_path / "complex.npz")})


def test_entropy_matches_enumeration():
    src = tiny_hmm(3, vocab=3, states=2, length=4, blocks=1, concentration=0.5)
    tokens, lengths, probs = all_sentences(src)
    p = src.conditionals(tokens, lengths, dtype=torch.float64)
    h = -(p * torch.where(p > 0, p.log(), 0)).sum(-1).mean(-1).numpy()  # (N,) per-token
    exact = float(probs @ h)
    mean, se = src.entropy(20_000, seed=5)
    assert 0 < se < 0.01
    assert abs(mean - exact) < 4 * se


def test_spec_is_normalised_and_rebuilds():
    src = load("hmm:seed=3,vocab=20,states=10")
    assert src.spec == {"kind": "hmm", "seed": 3, "vocab": 20, "states": 10, "blocks": 10,
                        "leakage": 0.05, "concentration": 0.1, "length": 16}
    assert load(src.spec).fingerprint() == src.fingerprint()
    assert load("hmm:seed=4,vocab=20,states=10").fingerprint() != src.fingerprint()
    assert src.vocab[:2] == ["w0", "w1"] and src.V == 20


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"kind": "hmm", "sead": 1}, "unknown key 'sead'.*allowed keys are kind, seed"),
        ({"kind": "hmm", "file": "x.npz", "seed": 1}, "unknown key 'seed'.*kind, file, length"),
        ({"kind": "hmm", "leakage": 1.5}, "'leakage' must be"),
        ({"kind": "hmm", "states": 5, "blocks": 10}, "'blocks'"),
        ({"kind": "hmm", "length": 0}, "'length' must be"),
    ],
    ids=["typo", "file-and-seed", "leakage", "blocks", "length"],
)
def test_bad_specs_raise(spec, message):
    with pytest.raises(SourceError, match=message):
        load(spec)
