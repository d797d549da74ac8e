"""The input layout every flatlm model reads: word ids from a source -> model input ids.

A source gives sentences as word ids 0..V-1 padded with -1 (``tokens [n, T]``, ``lengths [n]``).
Models see BERT-style ids::

    [PAD]=0  [MASK]=1  [CLS]=2  [SEP]=3  word c -> c + 4
    input:   [CLS] x_1 .. x_L [SEP] [PAD] ..      (T + 2 positions)

so word position t (0-based) sits at input position t + 1, and a model's logits over words are its
columns 4 .. V + 3.

>>> ids, mask = encode(torch.tensor([[5, 0, -1]]), torch.tensor([2]))
>>> ids.tolist(), mask.tolist()
([[2, 9, 4, 3, 0]], [[1, 1, 1, 1, 0]])
>>> mask_positions(ids, torch.tensor([1])).tolist()
[[2, 9, 1, 3, 0]]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

PAD_ID = 0
MASK_ID = 1
CLS_ID = 2
SEP_ID = 3
WORD_OFFSET = 4  # input id of word 0; word c has input id c + WORD_OFFSET
SPECIAL_TOKENS = {"[PAD]": PAD_ID, "[MASK]": MASK_ID, "[CLS]": CLS_ID, "[SEP]": SEP_ID}
INPUT_LAYOUT = "[CLS] x_1 .. x_T [SEP], padding [PAD]"


@dataclass(frozen=True, kw_only=True)
class TokenLayout:
    """Everything needed to rebuild model inputs without flatlm; written to ``flatlm.json``."""

    n_words: int  # V, the source's vocabulary size; words are 0..V-1
    max_length: int  # T, the longest sentence in words; inputs have T + 2 positions
    special_tokens: dict[str, int]  # name -> input id; always SPECIAL_TOKENS
    word_offset: int = WORD_OFFSET  # input id of word 0
    input_layout: str = INPUT_LAYOUT
    word_position_rule: str = "word position t (0-based) is input position t + 1"

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding matrix: V words + the special tokens."""
        return self.n_words + self.word_offset

    @property
    def n_positions(self) -> int:
        return self.max_length + 2

    def to_dict(self) -> dict:
        return {**asdict(self), "vocab_size": self.vocab_size, "n_positions": self.n_positions}


def token_layout(n_words: int, max_length: int) -> TokenLayout:
    """The layout for a source with ``n_words`` words and sentences of at most ``max_length``."""
    if n_words < 1 or max_length < 1:
        raise ValueError(f"need n_words >= 1 and max_length >= 1, got {n_words}, {max_length}")
    return TokenLayout(n_words=n_words, max_length=max_length, special_tokens=dict(SPECIAL_TOKENS))


def encode(tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Word ids [n, T] (padding -1) and lengths [n] -> (input_ids, attention_mask), both [n, T+2].

    Real words are shifted by ``WORD_OFFSET``, wrapped in [CLS] .. [SEP] and padded with [PAD];
    ``attention_mask`` is 1 on [CLS], the words and [SEP]. Runs on the device of ``tokens``.
    """
    tokens = torch.as_tensor(tokens, dtype=torch.int64)
    lengths = torch.as_tensor(lengths, dtype=torch.int64, device=tokens.device)
    n, T = tokens.shape
    pos = torch.arange(T + 2, device=tokens.device)  # (T+2,)
    real = pos[None, :T] < lengths[:, None]  # (n, T): True on real words
    if bool((lengths > T).any() | (lengths < 0).any()) or bool((tokens[real] < 0).any()):
        raise ValueError(f"lengths must lie in 0..{T} and real positions hold word ids >= 0")
    ids = torch.full((n, T + 2), PAD_ID, dtype=torch.int64, device=tokens.device)
    ids[:, 0] = CLS_ID
    ids[:, 1:-1] = torch.where(real, tokens + WORD_OFFSET, PAD_ID)
    ids.scatter_(1, (lengths + 1)[:, None], SEP_ID)
    attention_mask = (pos[None, :] < (lengths + 2)[:, None]).long()  # (n, T+2)
    return ids, attention_mask


def mask_positions(
    input_ids: torch.Tensor, positions: torch.Tensor, *, check: bool = True
) -> torch.Tensor:
    """Copy of ``input_ids`` [n, T+2] with word position ``positions[i]`` of row i set to [MASK].

    ``positions`` [n] are 0-based word positions (input position + 1). With ``check`` it raises if
    a chosen slot does not hold a word; pass ``check=False`` in a hot loop on an accelerator to
    skip the host synchronisation the check costs.
    """
    index = (positions.to(input_ids.device, torch.int64) + 1)[:, None]  # (n, 1)
    if check and bool((input_ids.gather(1, index) < WORD_OFFSET).any()):
        raise ValueError("mask_positions: a position points past the sentence (not a word)")
    return input_ids.scatter(1, index, MASK_ID)


def uniform_positions(lengths: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One word position per sentence, uniform over its words 0..L-1: [n] int64 (CPU).

    The one draw every stage uses (training's one-word masking, the loss, the flatness inputs),
    so that the same generator state gives the same positions everywhere.

    >>> uniform_positions(torch.tensor([1, 3]), torch.Generator().manual_seed(0)).tolist()
    [0, 2]
    """
    lengths = lengths.cpu()
    u = torch.rand(len(lengths), generator=gen, dtype=torch.float64)  # (n,)
    return (u * lengths).long().clamp(max=lengths - 1)
