"""Slow, obviously correct references for the fast truth: they ship so anyone can check it.

- ``enumerate_yields``: every sentence of a grammar up to a length, with its exact probability,
  by enumerating derivations (no chart, no dynamic program shared with ``inside_outside``).
- ``conditionals_from_joint``: Pr(x_t = c | x_{-t}) from a table of joint probabilities.
- ``slow_conditionals``: one joint-probability pass per candidate word, the route of paper A.3
  (Pr(x_t = c | x_{-t}) = Pr(x_t = c, x_{-t}) / sum_c' Pr(x_t = c', x_{-t})).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cache

import numpy as np
import torch

from flatlm.sources.grammar import Grammar


def enumerate_yields(g: Grammar, max_length: int) -> dict[tuple[int, ...], float]:
    """Pr(x) for every sentence x of at most ``max_length`` words (summed over derivations).

    Binary rules make every derivation strictly longer, so a length budget makes the
    enumeration finite even for recursive grammars. Exponential: tiny grammars only.
    """

    @cache
    def derive(A: int, budget: int) -> dict:
        out = defaultdict(float)
        for w in np.flatnonzero(g.emission[A] > 0):
            out[(int(w),)] += g.emission[A, w]
        for r in np.flatnonzero(g.binary_parent == A):
            if budget < 2:
                continue
            left = derive(int(g.binary_left[r]), budget - 1)
            for y1, p1 in left.items():
                for y2, p2 in derive(int(g.binary_right[r]), budget - len(y1)).items():
                    out[y1 + y2] += g.binary_prob[r] * p1 * p2
        return dict(out)

    total = defaultdict(float)
    for A in g.root_symbols():
        for y, p in derive(int(A), max_length).items():
            total[y] += g.root[A] * p
    return dict(total)


def conditionals_from_joint(joint: dict, tokens, lengths, V: int) -> np.ndarray:
    """[n, T, V] conditionals of each sentence's positions from a joint probability table."""
    tokens = np.asarray(tokens)
    out = np.zeros((*tokens.shape, V))
    for i, L in enumerate(np.asarray(lengths)):
        x = [int(c) for c in tokens[i, :L]]
        for t in range(L):
            p = np.array([joint.get(tuple(x[:t] + [c] + x[t + 1 :]), 0.0) for c in range(V)])
            out[i, t] = p / p.sum()
    return out


def slow_conditionals(source, tokens, lengths) -> torch.Tensor:
    """[n, T, V] conditionals by one ``source.sentence_logprob`` pass per candidate word."""
    tokens = torch.as_tensor(tokens)
    lengths = torch.as_tensor(lengths)
    n, T = tokens.shape
    V = source.V
    out = torch.zeros(n, T, V, dtype=torch.float64)
    for i in range(n):
        L = int(lengths[i])
        # All (position, candidate) substitutions of sentence i as one batch: (L * V, T).
        batch = tokens[i].repeat(L * V, 1)
        rows = torch.arange(L * V)
        batch[rows, rows // V] = rows % V
        logp = source.sentence_logprob(batch, torch.full((L * V,), L)).view(L, V)
        out[i, :L] = torch.softmax(logp.double(), -1)
    return out


def enumerate_parses(g: Grammar, sentence, symbol: int | None = None):
    """Every parse of ``sentence`` as (probability, frozenset of (A, i, j) spans).

    With ``symbol=None`` parses start at the root (the root rule's probability included);
    otherwise at ``symbol``, so the probabilities sum to inside(symbol, sentence).
    """
    x = [int(c) for c in sentence]

    @cache
    def parses(A: int, i: int, j: int):
        found = []
        if j - i == 1 and g.emission[A, x[i]] > 0:
            found.append((g.emission[A, x[i]], frozenset({(A, i, j)})))
        for r in np.flatnonzero(g.binary_parent == A):
            for k in range(i + 1, j):
                for p1, s1 in parses(int(g.binary_left[r]), i, k):
                    for p2, s2 in parses(int(g.binary_right[r]), k, j):
                        found.append((g.binary_prob[r] * p1 * p2, s1 | s2 | {(A, i, j)}))
        return tuple(found)

    if symbol is not None:
        return list(parses(symbol, 0, len(x)))
    return [(g.root[A] * p, s) for A in g.root_symbols() for p, s in parses(int(A), 0, len(x))]
