"""Batched inside-outside for a PCFG in normal form, in log space, in torch.

The chart is stored by span width: for width w, ``p[w]`` has shape (B, T - w + 1, N_w) and holds,
for span (i, i + w) of sentence b, the inside scores Pr(A =>* x_i .. x_{i+w-1}) of the N_w
nonterminals that can derive a string of exactly w words at all (``Plan.active[w]``). In a layered
grammar like the paper's most symbols cannot cover most widths (a preterminal never spans 9
words), so this skips most of the work; on a recursive grammar every symbol is active and nothing
is lost. Spans that run into padding score 0, so sentences of different lengths can share a batch.

Log space, one log per cell: a cell is a probability vector scaled so its largest entry is 1
(``p``) and the log of that scale (``s``; -inf for an all-zero cell): log score = log(p) + s.
Combining cells multiplies scaled vectors and adds their log scales, so nothing underflows as
sentences grow (a 32-word sentence has probability far below float32's 1e-38), and no exp or log
runs over whole charts. An entry is lost only when it is below 1e-38 (float32; 1e-308 in float64)
of the largest entry of its own cell, far beneath the precision of the answer.

Per (width, split) only the rules whose three symbols are active there are visited; they are
gathered, multiplied and scattered with ``index_add_``, all sentences and start positions at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flatlm.sources.grammar import Grammar

NEG_INF = float("-inf")


def derivable_widths(g: Grammar, T: int) -> np.ndarray:
    """can[w, A]: nonterminal A derives some string of exactly w words (w = 0..T)."""
    can = np.zeros((T + 1, g.N), bool)
    can[1] = g.emission.sum(1) > 0
    for w in range(2, T + 1):
        for k in range(1, w):
            ok = can[k][g.binary_left] & can[w - k][g.binary_right]
            can[w][g.binary_parent[ok]] = True
    return can


@dataclass(frozen=True)
class SplitRules:
    """Rules usable to build a width-w span from a width-k left part: local symbol indices."""

    k: int
    left: torch.Tensor  # (R_k,) index into active[k]
    right: torch.Tensor  # (R_k,) index into active[w - k]
    parent: torch.Tensor  # (R_k,) index into active[w]
    prob: torch.Tensor  # (R_k,)


@dataclass(frozen=True)
class Plan:
    """Everything inside-outside needs for sentences of at most T words, on one device."""

    T: int
    N: int
    active: list  # active[w]: (N_w,) int64 ids of the symbols that can span w words
    splits: list  # splits[w]: the SplitRules with any rule, for w = 2..T
    emission: torch.Tensor  # (N_1, V) Pr(A -> c) of the width-1 symbols
    root: torch.Tensor  # (N,) Pr(S -> A)

    @classmethod
    def of(cls, g: Grammar, T: int, device, dtype) -> Plan:
        can = derivable_widths(g, T)
        active = [torch.as_tensor(np.flatnonzero(c), device=device) for c in can]
        local = [np.cumsum(c) - 1 for c in can]  # symbol id -> index in active[w]
        splits = [[] for _ in range(T + 1)]
        for w in range(2, T + 1):
            for k in range(1, w):
                ok = can[k][g.binary_left] & can[w - k][g.binary_right]
                if ok.any():
                    splits[w].append(SplitRules(
                        k, *(torch.as_tensor(a, device=device) for a in (
                            local[k][g.binary_left[ok]], local[w - k][g.binary_right[ok]],
                            local[w][g.binary_parent[ok]])),
                        torch.as_tensor(g.binary_prob[ok], device=device, dtype=dtype)))
        emission = torch.as_tensor(g.emission[can[1]], device=device, dtype=dtype)
        return cls(T, g.N, active, splits, emission,
                   torch.as_tensor(g.root, device=device, dtype=dtype))


    def rule_applications(self) -> int:
        """Binary-rule applications of one inside pass over one sentence of a chart T words
        wide: (rule, split, span start) triples, sum_w R_w (T - w + 1) with R_w the rules over
        all splits of width w. The outside pass applies each twice (to the left and the right
        child); bench/truth.py reports these per second, so grammars of other sizes compare."""
        return sum(len(r.left) * (self.T - w + 1) for w in range(2, self.T + 1)
                   for r in self.splits[w])


class Chart:
    """Scaled cells by width, symbol-major: score(b, i, w)[a] = p[w][a, i, b] * exp(s[w][i, b]).

    Symbol-major layout, because the rules gather and scatter whole symbol rows: copying
    contiguous (starts, B) blocks is several times faster than gathering along a last axis.
    """

    def __init__(self, plan: Plan, B: int, like: torch.Tensor):
        self.plan = plan
        self.p = [like.new_zeros(len(plan.active[w]), plan.T - w + 1, B) if w else None
                  for w in range(plan.T + 1)]
        self.s = [like.new_full((plan.T - w + 1, B), NEG_INF) if w else None
                  for w in range(plan.T + 1)]

    def log(self, i: int, widths: torch.Tensor) -> torch.Tensor:
        """Log scores (B, N) over all nonterminals of span (i, i + widths[b]) of each sentence."""
        B = len(widths)
        out = self.p[1].new_full((B, self.plan.N), NEG_INF)
        for w in widths.unique().tolist():
            rows = (widths == w).nonzero().squeeze(-1)
            cell = _log(self.p[w][:, i, rows].T) + self.s[w][i, rows, None]
            out[rows[:, None], self.plan.active[w][None, :]] = cell
        return out


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x > 0, x, torch.ones_like(x)).log().masked_fill(x <= 0, NEG_INF)


def _normalised(val: torch.Tensor, shift: torch.Tensor):
    """Rescales val (N, ...) to max 1 over symbols; returns (p, s) with s = shift + log(max)."""
    mx = val.amax(0) if val.shape[0] else torch.zeros_like(shift)
    return val / torch.where(mx > 0, mx, torch.ones_like(mx)), shift + _log(mx)


def _rule_terms(rows: torch.Tensor, index: torch.Tensor, other: torch.Tensor,
                other_index: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """rows[index] * other[other_index] * scale, (R, n, B), with one temporary."""
    terms = torch.index_select(rows, 0, index)
    terms.mul_(torch.index_select(other, 0, other_index))
    return terms.mul_(scale)


def inside(tokens: torch.Tensor, plan: Plan) -> Chart:
    """Inside chart of a padded batch (B, T) (padding -1)."""
    B, T = tokens.shape
    chart = Chart(plan, B, plan.root)
    real = tokens >= 0
    first = plan.emission.T[tokens.clamp(min=0)] * real[..., None]  # (B, T, N_1)
    chart.p[1] = first.permute(2, 1, 0).contiguous()  # (N_1, T, B)
    chart.s[1] = torch.where(real, 0.0, NEG_INF).to(plan.root.dtype).T.contiguous()
    for w in range(2, T + 1):
        nI = T - w + 1
        if not plan.splits[w]:
            continue
        s = torch.stack([chart.s[r.k][:nI] + chart.s[w - r.k][r.k : r.k + nI]
                         for r in plan.splits[w]])  # (splits, nI, B)
        M = _finite_or_zero(s.amax(0))  # (nI, B)
        weight = (s - M).exp()
        val = chart.p[w].new_zeros(chart.p[w].shape)  # (N_w, nI, B)
        for r, wt in zip(plan.splits[w], weight, strict=True):
            left = chart.p[r.k][:, :nI]  # (N_k, nI, B)
            right = chart.p[w - r.k][:, r.k : r.k + nI]  # (N_{w-k}, nI, B)
            # the split's weight scales the N_k left rows, not the R_k rule terms
            terms = _rule_terms(left * wt, r.left, right, r.right, r.prob[:, None, None])
            val.index_add_(0, r.parent, terms)
        chart.p[w], chart.s[w] = _normalised(val, M)
    return chart


def _accumulate(chart: Chart, w: int, start: int, p_new, s_new) -> None:
    """Adds scaled contributions (p_new (N_w, n, B), s_new (n, B)) to cells [start, start+n).

    The sum keeps the larger of the two log scales and is not renormalised here (values may
    exceed 1); ``outside`` renormalises each width once, when all its contributions are in.
    """
    n = p_new.shape[1]
    p_old, s_old = chart.p[w][:, start : start + n], chart.s[w][start : start + n]
    m = torch.maximum(s_old, s_new)
    m_safe = _finite_or_zero(m)
    val = p_old * (s_old - m_safe).exp() + p_new * (s_new - m_safe).exp()
    chart.p[w][:, start : start + n], chart.s[w][start : start + n] = val, m


def _init_root(out: Chart, lengths: torch.Tensor, plan: Plan) -> None:
    for L in lengths.unique().tolist():
        rows = (lengths == L).nonzero().squeeze(-1)
        root = plan.root[plan.active[L]]
        if root.numel() and root.max() > 0:
            out.p[L][:, 0, rows] = (root / root.max())[:, None]
            out.s[L][0, rows] = root.max().log()


def outside(chart: Chart, lengths: torch.Tensor, plan: Plan) -> Chart:
    """Outside chart; the root span of sentence b is (0, lengths[b]).

    A parent cell o sends o[A] Pr(A -> B C) right[C] to its left child's B and
    o[A] Pr(A -> B C) left[B] to its right child's C.
    """
    T, B = chart.p[1].shape[1:]
    out = Chart(plan, B, plan.root)
    _init_root(out, lengths, plan)
    for w in range(T, 1, -1):
        nI = T - w + 1
        out.p[w], out.s[w] = _normalised(out.p[w], _finite_or_zero(out.s[w]))
        parent, parent_s = out.p[w], out.s[w]  # (N_w, nI, B), (nI, B)
        for r in plan.splits[w]:
            left = chart.p[r.k][:, :nI]
            right = chart.p[w - r.k][:, r.k : r.k + nI]
            top = torch.index_select(parent, 0, r.parent).mul_(r.prob[:, None, None])
            to_left = left.new_zeros(left.shape).index_add_(
                0, r.left, torch.index_select(right, 0, r.right).mul_(top))
            to_right = right.new_zeros(right.shape).index_add_(
                0, r.right, torch.index_select(left, 0, r.left).mul_(top))
            _accumulate(out, r.k, 0, to_left, parent_s + chart.s[w - r.k][r.k : r.k + nI])
            _accumulate(out, w - r.k, r.k, to_right, parent_s + chart.s[r.k][:nI])
    out.p[1], out.s[1] = _normalised(out.p[1], _finite_or_zero(out.s[1]))
    return out


def sentence_logprob(chart: Chart, lengths: torch.Tensor, plan: Plan) -> torch.Tensor:
    """log Pr(x) of each sentence (B,) from its inside chart."""
    return torch.logsumexp(chart.log(0, lengths) + plan.root.log(), -1)


def word_conditionals(out: Chart, plan: Plan) -> torch.Tensor:
    """Pr(x_t = c | x_{-t}) (B, T, V) from the outside scores of the width-1 spans.

    Pr(x_t = c, x_{-t}) = sum_A outside(A, t) Pr(A -> c); outside(A, t) does not involve x_t.
    Rows of padded positions (all-zero) stay zero.
    """
    joint = out.p[1].permute(2, 1, 0) @ plan.emission  # (B, T, V); the cell scale cancels
    total = joint.sum(-1, keepdim=True)
    return joint / torch.where(total > 0, total, torch.ones_like(total))
