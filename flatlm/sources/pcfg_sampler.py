"""Fast PCFG sampling: every sentence of a batch is expanded one tree level at a time, in numpy.

The batch is a flat array of symbols in sentence order (sentence id alongside). One step draws a
rule for every nonterminal at once (inverse CDF with one ``searchsorted`` over all nonterminals'
rule tables, keyed by ``A + u``) and rewrites each into one word or two children with
``np.repeat``, which keeps the order. A sentence is dropped as soon as its current length exceeds
the length filter (symbols never vanish, so the current length is a lower bound), which also
bounds the work on recursive grammars.
"""

from __future__ import annotations

import numpy as np

from flatlm.sources.grammar import Grammar


class RuleTable:
    """Every nonterminal's outcomes (binary rules, then words), as one flat table."""

    def __init__(self, g: Grammar):
        lhs, kind, a, b, cum = [], [], [], [], []
        for A in range(g.N):
            rules = np.flatnonzero(g.binary_parent == A)
            words = np.flatnonzero(g.emission[A] > 0)
            probs = np.concatenate([g.binary_prob[rules], g.emission[A, words]])
            c = np.cumsum(probs) / probs.sum()
            c[-1] = 1.0
            lhs += [A] * len(probs)
            kind += [0] * len(rules) + [1] * len(words)  # 0: binary, 1: word
            a += list(g.binary_left[rules]) + list(words)
            b += list(g.binary_right[rules]) + [-1] * len(words)
            cum += list(A + c)
        self.kind = np.array(kind, dtype=np.int8)
        self.first = np.array(a, dtype=np.int64)  # left child, or the word
        self.second = np.array(b, dtype=np.int64)  # right child
        self.key = np.array(cum)  # block A holds A + cumulative probabilities, ending at A + 1
        self.last = np.searchsorted(np.array(lhs), np.arange(g.N), side="right") - 1
        root_cum = np.cumsum(g.root)
        root_cum[-1] = 1.0
        self.root_cum = root_cum

    def draw(self, A: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One outcome index per nonterminal in ``A``."""
        j = np.searchsorted(self.key, A + rng.random(len(A)), side="right")
        return np.minimum(j, self.last[A])


def _expand(sym, is_word, sent, table, rng):
    """Rewrites every nonterminal once; returns the new (sym, is_word, sent)."""
    nt = ~is_word
    j = np.full(len(sym), -1)
    j[nt] = table.draw(sym[nt], rng)
    counts = np.where(nt & (table.kind[j] == 0), 2, 1)
    idx = np.repeat(np.arange(len(sym)), counts)
    second = np.zeros(len(idx), bool)
    second[1:] = idx[1:] == idx[:-1]
    rj = j[idx]
    expanded = rj >= 0
    new_sym, new_word = sym[idx], is_word[idx]
    pick = np.where(second, table.second[rj], table.first[rj])
    new_sym[expanded] = pick[expanded]
    new_word[expanded] = table.kind[rj[expanded]] == 1
    return new_sym, new_word, sent[idx]


def sample_batch(table: RuleTable, m: int, max_length: int, rng: np.random.Generator):
    """Samples m trees; returns (flat words, sentence ids) of the ones within ``max_length``."""
    sym = np.searchsorted(table.root_cum, rng.random(m), side="right").astype(np.int64)
    is_word = np.zeros(m, bool)
    sent = np.arange(m)
    while not is_word.all():
        sym, is_word, sent = _expand(sym, is_word, sent, table, rng)
        too_long = np.bincount(sent, minlength=m) > max_length
        if too_long.any():
            keep = ~too_long[sent]
            sym, is_word, sent = sym[keep], is_word[keep], sent[keep]
    return sym, sent


def pad_sentences(words: np.ndarray, sent: np.ndarray, n: int, T: int):
    """Flat (words, sentence ids) of the first n kept sentences -> tokens (n, T), lengths (n,)."""
    ids, starts, lengths = np.unique(sent, return_index=True, return_counts=True)
    ids, starts, lengths = ids[:n], starts[:n], lengths[:n]
    tokens = np.full((len(ids), T), -1, dtype=np.int64)
    rows = np.repeat(np.arange(len(ids)), lengths)
    cols = np.arange(lengths.sum()) - np.repeat(starts, lengths)
    tokens[rows, cols] = words[: lengths.sum()]  # kept sentences are contiguous from 0
    return tokens, lengths.astype(np.int64)


def sample_sentences(table: RuleTable, n: int, max_length: int, T: int, seed: int):
    """n sentences passing the length filter: tokens (n, T) padded with -1, lengths (n,)."""
    rng = np.random.default_rng(seed)
    toks, lens, have = [], [], 0
    m = n
    while have < n:
        words, sent = sample_batch(table, m, max_length, rng)
        t, ln = pad_sentences(words, sent, n - have, T)
        toks.append(t)
        lens.append(ln)
        have += len(ln)
        kept = max(len(np.unique(sent)), 1) / m
        m = int(min(max((n - have) / kept * 1.2 + 16, 16), 50 * n + 16))
    return np.concatenate(toks), np.concatenate(lens)
