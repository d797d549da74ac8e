"""Posterior span marginals of a PCFG and the per-position features built from them.

The posterior that nonterminal A spans words [i, j) of sentence x is

    mu(A, i, j) = inside(A, i, j) outside(A, i, j) / Pr(x),

from the charts of ``sources.inside_outside``. The feature of position t is the expected number
of constituents labelled A that cover t,

    f(t, A) = sum_{i <= t < j} mu(A, i, j) = E[ #{constituents over t labelled A} | x ],

the soft path from the root down to word t: in a layered grammar (the paper's) each symbol
sits at one depth, so f(t, .) is that path's posterior symbol at every depth. Summed over A it
is the expected depth of word t; at width 1 alone it is the posterior of t's preterminal.
This is the simplest faithful choice: it keeps which symbols sit over each word and leaves out
only the spans' boundaries. ``measure.cka`` compares a model's features with it.
"""

from __future__ import annotations

import torch

from flatlm.sources.inside_outside import Chart, Plan, sentence_logprob


def span_posteriors(chart: Chart, out: Chart, log_px: torch.Tensor, w: int) -> torch.Tensor:
    """mu over the width-``w`` spans: (N_w, T - w + 1, B), rows ``plan.active[w]``, 0 for a
    span past a sentence's end (its inside score is 0); ``log_px`` (B,) log Pr(x)."""
    # chart.s, out.s: each cell's log scale, -inf for an empty cell (never +inf: no nan)
    scale = (chart.s[w] + out.s[w] - log_px[None, :]).exp()  # (nI, B)
    return chart.p[w] * out.p[w] * scale


def covering_posteriors(chart: Chart, out: Chart, lengths: torch.Tensor, plan: Plan
                        ) -> torch.Tensor:
    """f(t, A) of the module docstring: (B, T, N), 0 on padding."""
    T, B = chart.p[1].shape[1:]
    features = chart.p[1].new_zeros(plan.N, T, B)
    log_px = sentence_logprob(chart, lengths, plan)  # (B,)
    for w in range(1, T + 1):
        if not len(plan.active[w]):
            continue
        mu = span_posteriors(chart, out, log_px, w)  # (N_w, T - w + 1, B)
        cover = mu.new_zeros(mu.shape[0], T, B)
        for k in range(w):  # the span starting at i covers i + k, k < w
            cover[:, k : k + mu.shape[1]] += mu
        features.index_add_(0, plan.active[w], cover)
    return features.permute(2, 1, 0)
