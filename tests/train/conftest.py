"""Shared tiny setting for the training tests: a 12-word random PCFG and a one-layer BERT."""

import pytest
import torch

from flatlm.sources import load


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and OpenMP threads competing with other
    processes on a 2-core machine make them up to 50x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


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
