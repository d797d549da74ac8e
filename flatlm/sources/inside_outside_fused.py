"""Inside-outside with all splits of a span width at once: one gather and one scatter per width.

The same scaled cells, rules and answers as ``inside_outside`` (whose module docstring has the
log-space scheme), with the work of a width batched over its splits: ``inside_outside`` visits
split by split (about 7 small ops per split inside and 30 outside, T^2 / 2 splits per chart), which
on a GPU leaves the kernels waiting on their launches below tens of thousands of sentences. Here
the charts of all widths are stacked into one tensor per orientation: by start (``start[row, i]``:
the cell starting at word i) and by end (``end[row, e]``: the cell ending before word e), rows
``offset[w] .. offset[w] + N_w`` holding width w's active symbols. The left child of span (i, i+w)
starts at i and its right child ends at i+w for every split, so each is one row gather over the
same start / end range; log scales are stacked the same way, by width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flatlm.sources.inside_outside import NEG_INF, Chart, Plan, word_conditionals


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """0 where x is -inf: log scales here are finite or -inf, never NaN or +inf, so one compare
    does what ``isfinite`` (four kernels) does in ``inside_outside``."""
    return x.masked_fill(x == NEG_INF, 0.0)


def _normalised(val: torch.Tensor, shift: torch.Tensor):
    """As ``inside_outside._normalised``: val (N, ...) >= 0 rescaled to max 1 over symbols, and
    shift + log(max) (log(0) = -inf: an all-zero cell)."""
    mx = val.amax(0) if val.shape[0] else torch.zeros_like(shift)
    return val / torch.where(mx > 0, mx, 1.0), shift + mx.log()


@dataclass(frozen=True)
class WidthRules:
    """Every rule building a width-w span, over all its splits with any rule."""

    left: torch.Tensor  # (R,) flat row of the left child (width k)
    right: torch.Tensor  # (R,) flat row of the right child (width w - k)
    parent: torch.Tensor  # (R,) index into active[w]
    prob: torch.Tensor  # (R, 1, 1)
    split: torch.Tensor  # (R,) index into ks
    ks: torch.Tensor  # (K,) the left widths k of the splits with any rule
    left_rows: torch.Tensor  # (sum N_k,) the rows of the widths in ks
    left_row_split: torch.Tensor  # their index into ks
    right_rows: torch.Tensor  # (sum N_{w-k},) the rows of the widths w - ks
    right_row_split: torch.Tensor  # their index into ks


@dataclass(frozen=True)
class FusedPlan:
    """``Plan`` with rows in one stacked chart per orientation and rules per width."""

    plan: Plan
    offset: list  # offset[w]: the first row of width w; offset[T + 1] = total rows
    widths: list  # widths[w]: WidthRules or None (no rule builds width w)

    @classmethod
    def of(cls, plan: Plan) -> FusedPlan:
        sizes = [0] + [len(plan.active[w]) for w in range(1, plan.T + 1)]
        offset = [sum(sizes[:w]) for w in range(plan.T + 2)]
        dev = plan.root.device
        widths = [None] * (plan.T + 1)
        for w in range(2, plan.T + 1):
            if plan.splits[w]:
                widths[w] = _width_rules(plan.splits[w], w, offset, dev)
        return cls(plan, offset, widths)

    def rows(self, w: int) -> slice:
        return slice(self.offset[w], self.offset[w + 1])


def _width_rules(splits, w: int, offset: list, dev) -> WidthRules:
    def rows_of(widths):  # (rows of each width, concatenated; their index into the list)
        rows = [torch.arange(offset[v], offset[v + 1], device=dev) for v in widths]
        which = [torch.full((len(r),), j, device=dev) for j, r in enumerate(rows)]
        return torch.cat(rows), torch.cat(which)

    ks = [r.k for r in splits]
    left_rows, left_row_split = rows_of(ks)
    right_rows, right_row_split = rows_of([w - k for k in ks])
    return WidthRules(
        left=torch.cat([r.left + offset[r.k] for r in splits]),
        right=torch.cat([r.right + offset[w - r.k] for r in splits]),
        parent=torch.cat([r.parent for r in splits]),
        prob=torch.cat([r.prob for r in splits])[:, None, None],
        split=torch.cat([torch.full((len(r.left),), j, device=dev)
                         for j, r in enumerate(splits)]),
        ks=torch.tensor(ks, device=dev), left_rows=left_rows, left_row_split=left_row_split,
        right_rows=right_rows, right_row_split=right_row_split)


@dataclass
class Stacked:
    """Cells of all widths by start and by end, with their log scales by width."""

    start: torch.Tensor  # (rows, T, B)
    end: torch.Tensor  # (rows, T + 1, B)
    s_start: torch.Tensor  # (T + 1, T, B)
    s_end: torch.Tensor  # (T + 1, T + 1, B)

    @classmethod
    def empty(cls, rows: int, T: int, like: torch.Tensor) -> Stacked:
        B = like.shape[-1]
        return cls(like.new_zeros(rows, T, B), like.new_zeros(rows, T + 1, B),
                   like.new_full((T + 1, T, B), NEG_INF), like.new_full((T + 1, T + 1, B), NEG_INF))

    def write(self, rows: slice, w: int, p: torch.Tensor, s: torch.Tensor) -> None:
        """Stores width w's cells p (N_w, T - w + 1, B) and scales s (T - w + 1, B)."""
        nI = p.shape[1]
        self.start[rows, :nI], self.end[rows, w:] = p, p
        self.s_start[w, :nI], self.s_end[w, w:] = s, s


def inside_fused(tokens: torch.Tensor, fplan: FusedPlan) -> tuple[Chart, Stacked]:
    """The inside chart of a padded batch (B, T) (padding -1), as ``inside_outside.inside``, and
    its stacked cells (what ``outside_fused`` reads)."""
    plan = fplan.plan
    B, T = tokens.shape
    real = tokens >= 0
    first = (plan.emission.T[tokens.clamp(min=0)] * real[..., None]).permute(2, 1, 0)
    st = Stacked.empty(fplan.offset[-1], T, first)
    st.write(fplan.rows(1), 1, first, torch.where(real, 0.0, NEG_INF).to(first.dtype).T)
    for w in range(2, T + 1):
        r = fplan.widths[w]
        if r is None:
            continue
        nI = T - w + 1
        s = (st.s_start[:, :nI].index_select(0, r.ks)
             + st.s_end[:, w:].index_select(0, w - r.ks))  # (K, nI, B)
        M = _finite_or_zero(s.amax(0))
        weight = (s - M).exp()
        terms = st.start[:, :nI].index_select(0, r.left)  # (R, nI, B)
        terms.mul_(st.end[:, w:].index_select(0, r.right)).mul_(r.prob)
        terms.mul_(weight.index_select(0, r.split))
        val = terms.new_zeros(len(plan.active[w]), nI, B).index_add_(0, r.parent, terms)
        st.write(fplan.rows(w), w, *_normalised(val, M))
    chart = _chart(plan, [None] + [st.start[fplan.rows(w), : T - w + 1] for w in range(1, T + 1)],
                   [None] + [st.s_start[w, : T - w + 1] for w in range(1, T + 1)])
    return chart, st


def _chart(plan: Plan, p: list, s: list) -> Chart:
    chart = Chart.__new__(Chart)
    chart.plan, chart.p, chart.s = plan, p, s
    return chart


def outside_fused(st: Stacked, lengths: torch.Tensor, fplan: FusedPlan) -> Chart:
    """The outside chart, as ``inside_outside.outside``, from the stacked inside cells.

    Contributions to left children gather by start, to right children by end; each target width's
    accumulated cells are rescaled to the larger of their old and new log scales in one op per
    orientation."""
    plan = fplan.plan
    T, B = st.start.shape[1:]
    acc = Stacked.empty(fplan.offset[-1], T, st.start)
    for L in lengths.unique().tolist():
        root = plan.root[plan.active[L]]
        if root.numel() and root.max() > 0:
            cols = (lengths == L).nonzero().squeeze(-1)
            acc.start[fplan.rows(L), 0][:, cols] = (root / root.max())[:, None]
            acc.s_start[L, 0, cols] = root.max().log()
    p_out, s_out = [None] * (T + 1), [None] * (T + 1)
    for w in range(T, 0, -1):
        p_out[w], s_out[w] = _combined(acc, fplan.rows(w), w, T - w + 1)
        r = fplan.widths[w] if w > 1 else None
        if r is not None:
            _send(acc, st, r, w, p_out[w], s_out[w])
    return _chart(plan, p_out, s_out)


def _combined(acc: Stacked, rows: slice, w: int, nI: int):
    """Width w's outside cells: the by-start and by-end accumulations summed, normalised."""
    a, a_s = acc.start[rows, :nI], acc.s_start[w, :nI]
    b, b_s = acc.end[rows, w:], acc.s_end[w, w:]
    m = _finite_or_zero(torch.maximum(a_s, b_s))
    return _normalised(a * (a_s - m).exp() + b * (b_s - m).exp(), m)


def _send(acc: Stacked, st: Stacked, r: WidthRules, w: int, parent, parent_s) -> None:
    """Adds parent width w's contributions to its left children (by start) and right children
    (by end)."""
    nI = parent.shape[1]
    top = parent.index_select(0, r.parent).mul_(r.prob)  # (R, nI, B)
    right_s = st.s_end[:, w:].index_select(0, w - r.ks)  # (K, nI, B) right child's scale
    left_s = st.s_start[:, :nI].index_select(0, r.ks)
    to_left = top * st.end[:, w:].index_select(0, r.right)
    _merge(acc.start[:, :nI], acc.s_start[:, :nI], r.ks, r.left_rows, r.left_row_split,
           to_left, r.left, r.split, parent_s + right_s)
    to_right = top.mul_(st.start[:, :nI].index_select(0, r.left))
    _merge(acc.end[:, w:], acc.s_end[:, w:], w - r.ks, r.right_rows, r.right_row_split,
           to_right, r.right, r.split, parent_s + left_s)


def _merge(cells, scales, widths, rows, row_split, terms, target, split, new_s) -> None:
    """cells[target] += terms, where a term of split j has log scale new_s[j] and the cells of
    width widths[j] have scales[widths[j]]: both rescaled to the larger (views, in place)."""
    old_s = scales.index_select(0, widths)  # (K, n, B)
    m = torch.maximum(old_s, new_s)
    m_safe = _finite_or_zero(m)
    keep = (old_s - m_safe).exp()  # (K, n, B)
    cells.index_copy_(0, rows, cells.index_select(0, rows).mul_(keep.index_select(0, row_split)))
    cells.index_add_(0, target, terms.mul_((new_s - m_safe).exp().index_select(0, split)))
    scales.index_copy_(0, widths, m)


def conditionals_fused(tokens, lengths, fplan: FusedPlan) -> torch.Tensor:
    """Pr(x_t = c | x_{-t}) (B, T, V), as ``word_conditionals(outside(inside(...)))``."""
    _, st = inside_fused(tokens, fplan)
    return word_conditionals(outside_fused(st, lengths, fplan), fplan.plan)

