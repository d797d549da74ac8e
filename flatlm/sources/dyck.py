"""The bracket language of the paper's section 5: strings with as many "<" as ">".

Pre-training distribution P: uniform over the C(T, T/2) strings of even length T with T/2 of each
bracket (word 0 = "<", word 1 = ">"). Under P the masked-LM conditional is one-hot: with o the
number of "<" among the other T - 1 positions,

    Pr(x_t = "<" | x_{-t}) = 1 if o = T/2 - 1,   Pr(x_t = ">" | x_{-t}) = 1 if o = T/2,

and a context with any other count has probability 0 under P; its row is all zero (as for any
source, a zero row marks a context the language cannot produce).

Downstream (task ``g_star``): g*(x) = #">" - #"<" on strings whose brackets are i.i.d. uniform
(``sample_downstream``). Raw labels are g* itself, in -T..T with the parity of T, so they can be
negative; the class index is ``g* + label_offset`` (``label_offset = T``) in 0..2T, and
``num_classes`` is 2T + 1 (only the T + 1 even-offset classes occur). For even-length strings g*
is even, so it never collides with the "undefined" label -1.

``encode`` gives the paper's inputs: x_t = e_t for "<", -e_t for ">", in R^{2T}; a masked position
t gets v ~ Unif{+e_{t+T}, -e_{t+T}}. Then g*(x) = -<1_T, [sum_t x_t]_{1:T}> on unmasked strings.

>>> src = Dyck.from_spec({"kind": "dyck", "length": 4})
>>> tokens, lengths = src.sample(2, seed=0)
>>> src.labels(tokens, lengths).tolist()
[0, 0]
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from flatlm.sources.base import Source, SourceError, as_tokens, padding_mask

OPEN, CLOSE = 0, 1


class Dyck(Source):
    """Balanced-count bracket strings of even length T (see the module docstring)."""

    vocab = ["<", ">"]
    tasks = ("g_star",)

    def __init__(self, length: int = 8):
        if isinstance(length, bool) or not isinstance(length, int) or length < 2 or length % 2:
            raise SourceError(
                f"dyck spec: 'length' must be an even integer >= 2, got {length!r}; "
                "use e.g. length=8"
            )
        self.max_length = length
        self.label_offset = length
        self.spec = {"kind": "dyck", "length": length}

    @classmethod
    def from_spec(cls, spec: dict) -> Dyck:
        """Keys: ``kind`` ("dyck") and ``length`` (even T >= 2, default 8)."""
        for key in spec:
            if key not in ("kind", "length"):
                raise SourceError(
                    f"dyck spec: unknown key {key!r}; allowed keys are kind, length"
                )
        return cls(spec.get("length", 8))

    def _fingerprint_arrays(self) -> list[np.ndarray]:
        return [np.array([self.max_length], dtype=np.int64)]

    def sample(self, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n strings uniform over the balanced ones: a random permutation of T/2 "<" and T/2 ">"."""
        T = self.max_length
        rank = np.argsort(np.random.default_rng(seed).random((n, T)), axis=1)  # (n, T)
        tokens = (rank >= T // 2).astype(np.int64)
        return torch.from_numpy(tokens), torch.full((n,), T, dtype=torch.int64)

    label_rules = ("count",)  # g* is a function of the string: nothing to choose

    def _labelled_sample(self, n, seed, rule, tasks, device):
        """n strings of T i.i.d. uniform brackets (the paper's downstream distribution P_ds)
        labelled by g*."""
        T = self.max_length
        tokens = np.random.default_rng(seed).integers(0, 2, size=(n, T), dtype=np.int64)
        tokens, lengths = torch.from_numpy(tokens), torch.full((n,), T, dtype=torch.int64)
        return tokens, lengths, {task: self.labels(tokens, lengths, task) for task in tasks}

    def _conditionals_batch(self, tokens, lengths, dtype) -> torch.Tensor:
        """One-hot rows [B, T, 2] from the count o of "<" among the others (module docstring).

        A sentence of length L (padding -1 beyond) is treated as a string of the balanced
        language of length L; padded rows and impossible contexts are zero.
        """
        real = padding_mask(lengths, tokens.shape[1])  # (B, T)
        is_open = (tokens == OPEN) & real
        o = is_open.sum(1, keepdim=True) - is_open.long()  # (B, T): "<" among the others
        half2 = lengths[:, None]  # 2 * (L / 2), compared with 2 * counts to allow odd L
        p_open = (2 * (o + 1) == half2) & real
        p_close = (2 * o == half2) & real
        return torch.stack([p_open, p_close], -1).to(dtype)

    def num_classes(self, task: str = "g_star") -> int:
        """2T + 1: class index = g* + ``label_offset`` in 0..2T."""
        self._check_task(task)
        return 2 * self.max_length + 1

    def _check_task(self, task: str) -> None:
        if task not in self.tasks:
            raise ValueError(f"unknown Dyck task {task!r}; the only task is 'g_star'")

    def labels(self, tokens, lengths, task: str = "g_star") -> torch.Tensor:
        """g*(x) = #">" - #"<" over the real positions: [n] int64, may be negative."""
        self._check_task(task)
        tokens, lengths = as_tokens(tokens, lengths)
        real = padding_mask(lengths, tokens.shape[1])
        sign = torch.where(tokens == CLOSE, 1, -1) * real  # (n, T)
        return sign.sum(1)

    def encode(self, tokens, mask_positions=None, generator: torch.Generator | None = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The paper's input encoding: [n, T, 2T] on the tokens' device.

        Row t is e_t for "<" and -e_t for ">"; if position t is masked it is s e_{t+T} with a
        sign s = +-1 drawn uniformly from ``generator`` (a CPU ``torch.Generator``; required when
        anything is masked). ``mask_positions`` is a bool [n, T] mask (True = masked), an int
        [n] of one position per row (-1 = none), or None (nothing masked). Tokens at masked
        positions are ignored; elsewhere they must be 0 or 1.
        """
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        if tokens.ndim != 2 or tokens.shape[1] != self.max_length:
            raise ValueError(f"tokens must be [n, {self.max_length}], got {tuple(tokens.shape)}")
        n, T = tokens.shape
        masked = _mask_matrix(mask_positions, n, T).to(tokens.device)  # (n, T)
        if ((tokens != OPEN) & (tokens != CLOSE) & ~masked).any():
            raise ValueError('unmasked tokens must be 0 ("<") or 1 (">")')
        x = torch.zeros(n, T, 2 * T, dtype=dtype, device=tokens.device)  # (n, T, 2T)
        t = torch.arange(T, device=tokens.device).expand(n, T)
        if masked.any():
            if generator is None:
                raise ValueError("masked positions need a torch.Generator for the signs of v")
            s = torch.randint(0, 2, (n, T), generator=generator).to(tokens.device) * 2 - 1
        else:
            s = torch.zeros(n, T, dtype=torch.int64, device=tokens.device)
        sign = torch.where(masked, s, torch.where(tokens == OPEN, 1, -1))
        column = torch.where(masked, t + T, t)
        x.scatter_(2, column[..., None], sign[..., None].to(dtype))
        return x


def _mask_matrix(mask_positions, n: int, T: int) -> torch.Tensor:
    """bool [n, T] from None, a bool [n, T] mask, or int [n] positions (-1 = no mask)."""
    if mask_positions is None:
        return torch.zeros(n, T, dtype=torch.bool)
    m = torch.as_tensor(mask_positions).cpu()
    if m.dtype == torch.bool and m.shape == (n, T):
        return m
    if m.ndim == 1 and m.shape[0] == n and not m.is_floating_point():
        if ((m < -1) | (m >= T)).any():
            raise ValueError(f"mask positions must lie in 0..{T - 1} (or -1 for none)")
        return (torch.arange(T)[None, :] == m[:, None]) & (m[:, None] >= 0)
    raise ValueError(f"mask_positions must be bool [{n}, {T}] or int [{n}]; got "
                     f"{m.dtype} {tuple(m.shape)}")


def brute_force_conditionals(source: Dyck | int, tokens, lengths) -> np.ndarray:
    """Pr(x_t = c | x_{-t}) by counting the balanced strings of each length: [n, T, 2] float64.

    Enumerates all 2^L strings (tiny L only); padding and impossible contexts give zero rows.
    """
    tokens, lengths = (np.asarray(a) for a in as_tokens(tokens, lengths))
    n, T = tokens.shape
    out = np.zeros((n, T, 2))
    for i in range(n):
        L = int(lengths[i])
        strings = np.array(list(itertools.product((OPEN, CLOSE), repeat=L)))  # (2^L, L)
        balanced = strings[2 * (strings == OPEN).sum(1) == L]
        for t in range(L):
            keep = np.ones(L, dtype=bool)
            keep[t] = False
            match = (balanced[:, keep] == tokens[i, :L][keep]).all(1)
            counts = np.bincount(balanced[match, t], minlength=2).astype(np.float64)
            if counts.sum() > 0:
                out[i, t] = counts / counts.sum()
    return out

