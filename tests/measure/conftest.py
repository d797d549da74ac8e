"""The tiny language the measurement tests share."""

import pytest

from flatlm.sources import load

# 6 words, sentences of 2-4 words (1548 of them): small enough to enumerate.
TINY_PCFG = {"kind": "pcfg", "random": {"vocab": 6, "depth": 2, "nonterminals_per_level": 2,
                                        "roots": 2}, "seed": 0}


@pytest.fixture(scope="session")
def src():
    return load(TINY_PCFG)
