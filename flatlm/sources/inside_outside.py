"""Batched inside-outside for a PCFG in normal form, in log space, in torch.

Charts are indexed by span start and width: cell (b, i, w) holds, for every nonterminal A, the
inside score Pr(A =>* x_i .. x_{i+w-1}) of sentence b (width 0 unused). Spans that run into
padding score 0, so sentences of different lengths can share one batch.

Log space, one log per cell: a cell is stored as a probability vector scaled so its largest
entry is 1 (``Chart.p``) and the log of that scale (``Chart.s``; -inf for an all-zero cell), so
log score = log(p) + s. Combining cells multiplies and sums scaled vectors and adds their log
scales, so nothing underflows as sentences grow (a 32-word sentence has probability far below
float32's 1e-38), and no exp or log runs over whole charts. An entry is lost only when it is
below 1e-38 (float32; 1e-308 in float64) of the largest entry of its own cell, far beneath the
precision of the answer.

Per span, the splits are contracted first with one batched matmul (an N x N table of child-pair
scores), then the sparse rule list (parent, left * N + right, prob) reads that table: the cost per
span is O(splits x N^2 + rules), not O(splits x rules) gathers or O(N^3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from flatlm.sources.grammar import Grammar

NEG_INF = float("-inf")


@dataclass(frozen=True)
class RuleTensors:
    """A grammar's tensors on one device and dtype."""

    parent: torch.Tensor  # (R,) int64
    left: torch.Tensor  # (R,) int64
    right: torch.Tensor  # (R,) int64
    prob: torch.Tensor  # (R,)
    emission: torch.Tensor  # (N, V)
    emission_t: torch.Tensor  # (V, N)
    root: torch.Tensor  # (N,)
    pair: torch.Tensor  # (R,) int64, left * N + right: the rule's cell in an (N, N) pair table

    @classmethod
    def of(cls, g: Grammar, device, dtype) -> RuleTensors:
        def t(a, dt=dtype):
            return torch.as_tensor(a, device=device).to(dt)

        emission = t(g.emission)
        return cls(t(g.binary_parent, torch.int64), t(g.binary_left, torch.int64),
                   t(g.binary_right, torch.int64), t(g.binary_prob), emission,
                   emission.T.contiguous(), t(g.root),
                   t(g.binary_left * g.N + g.binary_right, torch.int64))

    @property
    def N(self) -> int:
        return self.emission.shape[0]


class Chart(NamedTuple):
    """Scaled cells: score[b, i, w, A] = p[b, i, w, A] * exp(s[b, i, w])."""

    p: torch.Tensor  # (B, T, T+1, N), each nonzero cell's max is 1
    s: torch.Tensor  # (B, T, T+1) log scale, -inf for an all-zero cell

    def log(self, rows, i, w) -> torch.Tensor:
        """Log scores of cells (rows, i, w): (..., N)."""
        return _log(self.p[rows, i, w]) + self.s[rows, i, w][..., None]


def _empty(B, T, N, like: torch.Tensor) -> Chart:
    return Chart(like.new_zeros(B, T, T + 1, N), like.new_full((B, T, T + 1), NEG_INF))


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.ones_like(x)).log().masked_fill(x <= 0, NEG_INF)


def _normalised(val: torch.Tensor, shift: torch.Tensor):
    """Rescales val (..., N) to max 1; returns (p, s) with s = shift + log(max)."""
    mx = val.amax(-1)
    p = val / torch.where(mx > 0, mx, torch.ones_like(mx))[..., None]
    return p, shift + _log(mx)


def _split_index(T: int, w: int, device):
    """Starts I (nI, 1) and left widths K (1, nK) of every split of every width-w span."""
    nI = T - w + 1
    return (torch.arange(nI, device=device)[:, None], torch.arange(1, w, device=device)[None, :])


def inside(tokens: torch.Tensor, rules: RuleTensors) -> Chart:
    """Inside chart of a padded batch (padding -1).

    For a span, the splits are summed first as one small matmul over the split axis,
    pairs[B, C] = sum_k left_k[B] right_k[C], then each rule A -> B C reads pairs[B, C].
    """
    B, T = tokens.shape
    chart = _empty(B, T, rules.N, rules.prob)
    real = (tokens >= 0)[..., None]
    chart.p[:, :, 1] = rules.emission_t[tokens.clamp(min=0)] * real  # (B, T, N)
    chart.s[:, :, 1] = torch.where(real.squeeze(-1), 0.0, NEG_INF)
    for w in range(2, T + 1):
        I, K = _split_index(T, w, tokens.device)
        s = chart.s[:, I, K] + chart.s[:, I + K, w - K]  # (B, nI, nK)
        M = _finite_or_zero(s.amax(-1, keepdim=True))  # (B, nI, 1)
        left = chart.p[:, I, K] * (s - M).exp()[..., None]  # (B, nI, nK, N)
        pairs = left.transpose(-1, -2) @ chart.p[:, I + K, w - K]  # (B, nI, N, N)
        terms = pairs.flatten(-2)[..., rules.pair] * rules.prob  # (B, nI, R)
        val = terms.new_zeros(B, T - w + 1, rules.N).index_add_(-1, rules.parent, terms)
        chart.p[:, : T - w + 1, w], chart.s[:, : T - w + 1, w] = _normalised(val, M.squeeze(-1))
    return chart


def _accumulate(chart: Chart, I, K, p_new, s_new) -> None:
    """chart[:, I, K] += (p_new, s_new), both in scaled form."""
    s_old = chart.s[:, I, K]
    m = _finite_or_zero(torch.maximum(s_old, s_new))
    val = chart.p[:, I, K] * (s_old - m).exp()[..., None] + p_new * (s_new - m).exp()[..., None]
    chart.p[:, I, K], chart.s[:, I, K] = _normalised(val, m)


def outside(chart: Chart, lengths: torch.Tensor, rules: RuleTensors) -> Chart:
    """Outside chart; the root span of sentence b is (0, lengths[b]).

    For a parent span, Q[B, C] = sum_A outside(A) Pr(A -> B C); then a left child with right
    sibling r gets Q r and a right child with left sibling l gets Q^T l, all splits in one matmul.
    """
    B, T = chart.s.shape[:2]
    N = rules.N
    out = _empty(B, T, N, rules.prob)
    rows = torch.arange(B, device=lengths.device)
    out.p[rows, 0, lengths] = rules.root / rules.root.max()
    out.s[rows, 0, lengths] = rules.root.max().log()
    for w in range(T, 1, -1):
        I, K = _split_index(T, w, lengths.device)
        nI = T - w + 1
        parent_p, parent_s = out.p[:, :nI, w], out.s[:, :nI, w, None]  # (B, nI, N), (B, nI, 1)
        Q = parent_p.new_zeros(B, nI, N * N).index_add_(-1, rules.pair,
                                                        parent_p[..., rules.parent] * rules.prob)
        Q = Q.view(B, nI, N, N)  # (B, nI, N_left, N_right)
        _accumulate(out, I, K, chart.p[:, I + K, w - K] @ Q.transpose(-1, -2),
                    parent_s + chart.s[:, I + K, w - K])
        _accumulate(out, I + K, w - K, chart.p[:, I, K] @ Q, parent_s + chart.s[:, I, K])
    return out


def sentence_logprob(chart: Chart, lengths: torch.Tensor, rules: RuleTensors) -> torch.Tensor:
    """log Pr(x) of each sentence (B,) from its inside chart."""
    rows = torch.arange(chart.s.shape[0], device=lengths.device)
    return _log(chart.p[rows, 0, lengths] @ rules.root) + chart.s[rows, 0, lengths]


def word_conditionals(out: Chart, rules: RuleTensors) -> torch.Tensor:
    """Pr(x_t = c | x_{-t}) (B, T, V) from the outside scores of the width-1 spans.

    Pr(x_t = c, x_{-t}) = sum_A outside(A, t) Pr(A -> c); outside(A, t) does not involve x_t.
    Rows of padded positions (all-zero) stay zero.
    """
    joint = out.p[:, :, 1] @ rules.emission  # (B, T, V); the cell scale cancels
    total = joint.sum(-1, keepdim=True)
    return joint / torch.where(total > 0, total, torch.ones_like(total))
