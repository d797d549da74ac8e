"""The toy grammar the PCFG tests share (tests/sources/test_pcfg.py checks its truth against
enumeration; test_inside_outside_fused.py, the fused route's)."""

import numpy as np
import pytest
import torch

from flatlm.sources import load

# Duplicate lines (B -> c twice), a nonterminal with binary and terminal rules (X, A, Y) and a
# recursive rule (A -> A B); sentences are unbounded, so the length filter matters.
TOY = """
S X 0.6
S Y 0.4
X A B 0.5
X A A 0.2
X a 0.3
Y B X 0.7
Y b 0.3
A A B 0.2
A a 0.5
A b 0.3
B b 0.6
B c 0.2
B c 0.2
"""
@pytest.fixture
def toy(tmp_path):
    path = tmp_path / "toy.txt"
    path.write_text(TOY)
    return load({"kind": "pcfg", "grammar": str(path), "max_length": 6, "spans": {"B": 2}})


def all_sentences(joint, T):
    """(sentences, tokens [n, T] padded -1, lengths [n]): every sentence of ``joint``
    (``reference.enumerate_yields``), shortest first."""
    sentences = sorted(joint, key=lambda y: (len(y), y))
    tokens = np.full((len(sentences), T), -1)
    for i, y in enumerate(sentences):
        tokens[i, : len(y)] = y
    return sentences, torch.tensor(tokens), torch.tensor([len(y) for y in sentences])
