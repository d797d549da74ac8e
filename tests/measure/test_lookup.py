"""The lookup table probes the source's exact conditionals and nothing else."""

import dataclasses

import pytest
import torch

from flatlm.measure import lookup_key
from flatlm.measure.probes.lookup import lookup_features, lookup_table_accuracy
from flatlm.measure.probes.probe import ProbeConfig, linear_probe_accuracy

CFG = ProbeConfig(epochs=20, seeds=2, lr=1e-2)
TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                        "roots": 2}, "seed": 0}  # 2-4 words; 1548 sentences




class NextWordSource:
    """Sentences of 4 i.i.d. words out of 4. Its "truth" at position t puts 0.7 on the next word
    (position t + 1, cyclically) and 0.1 on each other word, and the label is the word at
    position 1, the argmax of the conditional at position 0: a function of the conditionals.
    With ``shuffle`` the conditionals are those of other sentences (a fixed permutation), so the
    tokens still determine the label but the conditionals do not."""

    V, max_length, tasks = 4, 4, ("next",)

    def __init__(self, shuffle=False):
        self.shuffle = shuffle
        self.calls = 0

    def sample(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, 4, (n, 4), generator=g), torch.full((n,), 4)

    def conditionals(self, tokens, lengths, *, device=None, dtype=torch.float32):
        self.calls += 1
        nxt = tokens.roll(-1, dims=1)  # (n, T)
        p = torch.full((*tokens.shape, 4), 0.1, dtype=dtype)
        p.scatter_(2, nxt[..., None], 0.7)
        if self.shuffle:
            p = p[torch.randperm(len(p), generator=torch.Generator().manual_seed(0))]
        return p.to(device)

    def labels(self, tokens, lengths, task):
        return tokens[:, 1].clone()

    def num_classes(self, task):
        return 4


def test_labels_that_are_a_function_of_the_truth_are_read_off_the_lookup_table():
    src = NextWordSource()
    tokens, lengths = src.sample(600, seed=0)
    out = lookup_table_accuracy(src, tokens, lengths, src.labels(tokens, lengths, "next"),
                                "next", CFG)
    assert lookup_key("next") in out and "lookup/next/acc_se" in out
    assert out[lookup_key("next")] >= 0.99 and src.calls == 1


def test_shuffled_truth_control_is_at_chance():
    src = NextWordSource(shuffle=True)
    tokens, lengths = src.sample(600, seed=0)
    out = lookup_table_accuracy(src, tokens, lengths, src.labels(tokens, lengths, "next"),
                                "next", CFG)
    assert out[lookup_key("next")] < 0.4  # chance 0.25; the tokens alone would give 1.0
    assert src.calls == 1


def test_features_are_the_concatenated_conditionals(src):
    tokens, lengths = src.sample(30, seed=1)
    feats = lookup_features(src, tokens, lengths)
    truth = src.conditionals(tokens, lengths)  # (30, T, V)
    assert feats.shape == (30, src.max_length * src.V) and feats.dtype == torch.float32
    assert torch.equal(feats.view(30, src.max_length, src.V), truth)
    assert bool((feats.view(30, src.max_length, src.V)[tokens == -1] == 0).all())


def test_pcfg_lookup_drops_undefined_labels_and_matches_the_probe_on_the_truth(src):
    tokens, lengths = src.sample(200, seed=2)
    labels = src.labels(tokens, lengths, "B")
    cfg = dataclasses.replace(CFG, epochs=5)
    out = lookup_table_accuracy(src, tokens, lengths, labels, "B", cfg)
    keep = labels != -1
    direct = linear_probe_accuracy(lookup_features(src, tokens[keep], lengths[keep]),
                                   labels[keep], src.num_classes("B"), cfg)
    assert out[lookup_key("B")] == pytest.approx(direct["acc_mean"], abs=1e-12)
    assert out == lookup_table_accuracy(src, tokens, lengths, labels, "B", cfg)
