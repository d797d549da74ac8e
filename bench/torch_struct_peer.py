"""torch-struct as a peer for the PCFG truth: all-position conditionals from its CKY.

torch-struct (``pip install torch-struct``; Rush 2020) computes a PCFG's log partition function by
CKY in the log semiring and marginals by autograd. Its parameterisation separates nonterminals
(NT, binary rules only) from preterminals (T, words only): terms [B, n, T], rules [B, NT, NT+T,
NT+T], roots [B, NT]. flatlm's grammars let a symbol do both (30 of the paper grammar's 49), so a
symbol gets an NT copy (its binary rules) and a T copy (its words), and every rule naming it as a
child is repeated for each copy: the derivations, and their weights, are the same.

Conditionals from marginals. Pr(x_t = c, x_{-t}) = sum_A outside(A, t) Pr(A -> c), and autograd of
log Z with respect to the term potential of (A, t) gives outside(A, t) e(A, t) / Z, where e(A, t)
= Pr(A -> x_t). That loses outside(A, t) wherever A cannot emit x_t (90% of the paper grammar's
pairs), so term potentials are floored at ``TERM_FLOOR`` (1e-30): outside(A, t) / Z = marginal /
e. The floor adds derivations of weight <= 1e-30 per floored word, a relative change of Z below
T * 1e-30 / min_c Pr(x_t = c | x_{-t}), far below float32's (and float64's) precision. Rules that
do not exist get log potential ``ABSENT`` (-1e4): exp underflows to exactly 0, with none of the
NaNs that -inf gives torch-struct's logsumexp gradients.

Only the benchmark imports this (torch-struct is a dev dependency, not the library's).
"""

from __future__ import annotations

import numpy as np
import torch

TERM_FLOOR = 1e-30
ABSENT = -1e4


class TorchStructPCFG:
    """The paper grammar (any flatlm ``Grammar``) in torch-struct's CKY parameterisation."""

    def __init__(self, grammar, device="cpu", dtype=torch.float32):
        g = grammar
        self.nt = np.unique(g.binary_parent)  # symbols with binary rules: the NT copies
        self.t = np.flatnonzero(g.emission.sum(1) > 0)  # symbols with words: the T copies
        NT, T = len(self.nt), len(self.t)
        if not np.isin(g.root_symbols(), self.nt).all():
            raise ValueError("torch-struct's CKY roots are nonterminals: a grammar whose root "
                             "symbol emits a word (one-word sentences) has no peer here")
        nt_of = {int(a): i for i, a in enumerate(self.nt)}
        t_of = {int(a): NT + i for i, a in enumerate(self.t)}
        copies = {a: [m[a] for m in (nt_of, t_of) if a in m] for a in range(g.N)}
        rules = np.zeros((NT, NT + T, NT + T))
        for a, b, c, p in zip(g.binary_parent, g.binary_left, g.binary_right, g.binary_prob,
                              strict=True):
            for bi in copies[int(b)]:
                for ci in copies[int(c)]:
                    rules[nt_of[int(a)], bi, ci] += p
        with np.errstate(divide="ignore"):
            log_rules = np.where(rules > 0, np.log(rules), ABSENT)
            root = g.root[self.nt]
            log_root = np.where(root > 0, np.log(root), ABSENT)
        kw = {"device": device, "dtype": dtype}
        self.rules = torch.as_tensor(log_rules, **kw)
        self.roots = torch.as_tensor(log_root, **kw)
        self.emission = torch.as_tensor(g.emission[self.t], **kw)  # (T, V) Pr(A -> c)

    def conditionals(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Pr(x_t = c | x_{-t}) [B, n, V] of a batch whose real words fill [B, :lengths]."""
        from torch_struct import CKY, LogSemiring

        B, n = tokens.shape
        e = self.emission.T[tokens.clamp(min=0)]  # (B, n, T) Pr(A -> x_t)
        e = torch.where(e > 0, e, torch.full_like(e, TERM_FLOOR))
        terms = e.log().requires_grad_(True)
        rules = self.rules.expand(B, *self.rules.shape)
        roots = self.roots.expand(B, -1)
        with torch.enable_grad():
            log_z, _ = CKY(LogSemiring).logpartition((terms, rules, roots), lengths=lengths)
            (marginal,) = torch.autograd.grad(log_z.sum(), terms)
        outside = marginal / e  # (B, n, T): outside(A, t) / Z
        joint = outside @ self.emission  # (B, n, V)
        real = torch.arange(n, device=tokens.device)[None, :] < lengths[:, None]
        total = joint.sum(-1, keepdim=True)
        total = torch.where(total > 0, total, torch.ones_like(total))
        return torch.where(real[..., None], joint / total, 0.0)
