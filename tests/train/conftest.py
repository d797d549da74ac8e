"""Shared tiny setting for the training tests: a 12-word random PCFG and a one-layer BERT."""

import pytest

from flatlm.sources import load


@pytest.fixture(scope="session")
def src():
    """Sentences of 2-4 words over 12 words; tasks A (2 classes), B, C."""
    return load({"kind": "pcfg", "random": {"vocab": 12, "depth": 2, "nonterminals_per_level": 3,
                                            "roots": 2}, "seed": 0})


@pytest.fixture(scope="session")
def tiny_model():
    return "d32-h2-l1-i64"


@pytest.fixture(scope="session")
def eval_sentences(src):
    """Held-out sentences for KL(truth || model), drawn with a seed no run uses."""
    return src.sample(256, seed=10_000)
