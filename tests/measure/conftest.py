"""The tiny language the measurement tests share, and the probes' separable features."""

import pytest
import torch

from flatlm.sources import load

# 6 words, sentences of 2-4 words (1548 of them): small enough to enumerate.
TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                        "roots": 2}, "seed": 0}


@pytest.fixture(scope="session")
def src():
    return load(TINY_PCFG)


def blobs(seed, n=300, D=20, C=4, noise=0.1):
    """Features = one-hot(label) + small noise: separable by the identity map."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    x = noise * torch.randn(n, D, generator=g)
    x[torch.arange(n), y] += 1.0
    return x, y
