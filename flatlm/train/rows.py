"""Sentences packed end to end into fixed-length rows (``train.sequence_packing="rows"``).

A PCFG sentence fills 3 to 18 input positions (about 70% of the 18 on average); padded, a
batch computes on padding, and cut into length groups (``"unpadded"``) it takes several passes
of varying widths. Here every micro-batch of sentences becomes R rows of L =
``train.row_length`` slots:

- each sentence ([CLS] x_1 .. x_n [SEP]) occupies consecutive slots of one row, placed best
  fit decreasing (``place_in_rows``); slots left over hold [PAD];
- ``segment_ids`` name the sentence of each slot (its index in the row, 0, 1, ...), so that the
  attention mask ``segment_ids[i] == segment_ids[j]`` is block-diagonal: a sentence never reads
  its row neighbours; an unused slot j has its own id -(j + 1) and reads only itself (a query
  that may read nothing would make the softmax NaN);
- ``position_ids`` restart at 0 at each sentence's [CLS], as in its own padded row;
- the MLM head runs only at ``masked_slots``: the flat slot of each masked word, padded to a
  static count with target -100 (ignored).

Shapes are static up to a small set: R and the masked-slot count are rounded up
(``bucketed``), so a compiled loss sees a few shapes, not one per batch. The result is the
padded update up to the order of float sums and the dropout draws (tests/train/test_rows.py):
each sentence sees the same keys and the same position ids. BERT only (its position ids and
attention mask are inputs); one process (a data-parallel shard cuts a batch by sentences).

Not the *trial packs* of ``flatlm.train.pack`` (several runs trained as one model): this module
lays out the sentences of one run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from flatlm.core.tokens import PAD_ID
from flatlm.models.bert import row_word_logits

IGNORED = -100  # cross-entropy's ignore_index: the target of a padding entry of masked_slots


@dataclass(frozen=True)
class RowBatch:
    """C micro-batches of ``sentences`` sentences each, every one laid out in R rows of L slots.

    ``split``, ``trimmed``, ``n_targets`` and ``len`` answer as ``MLMBatch``'s do, so the
    updates (``flatlm.train.algorithms``) run on either; a split keeps whole micro-batches.
    """

    input_ids: torch.Tensor  # (C, R, L) token ids, [PAD] in unused slots
    segment_ids: torch.Tensor  # (C, R, L) the slot's sentence in its row; unused slot j: -(j+1)
    position_ids: torch.Tensor  # (C, R, L) position in its own sentence (0 at [CLS]); unused: 0
    masked_slots: torch.Tensor  # (C, P) flat slot r * L + l of each masked word; padding: 0
    targets: torch.Tensor  # (C, P) word ids at masked_slots; IGNORED at padding entries
    sentences: int  # sentences per micro-batch
    masked: tuple[int, ...]  # masked words per micro-batch, on the host (no device sync)

    def __len__(self) -> int:
        return self.input_ids.shape[0] * self.sentences

    def n_targets(self) -> int:
        """Masked words in the batch."""
        return sum(self.masked)

    def split(self, size: int) -> list[RowBatch]:
        """Consecutive sub-batches of ``size`` sentences: whole micro-batches."""
        if size % self.sentences:
            raise ValueError(f"rows: a batch laid out in micro-batches of {self.sentences} "
                             f"sentences cannot be split into parts of {size}")
        step = size // self.sentences
        return [RowBatch(*(t[c:c + step] for t in self.tensors()), sentences=self.sentences,
                         masked=self.masked[c:c + step])
                for c in range(0, len(self.masked), step)]

    def trimmed(self) -> RowBatch:
        """Itself: rows have no padding columns to cut."""
        return self

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.input_ids, self.segment_ids, self.position_ids, self.masked_slots,
                self.targets)

    def attend(self) -> torch.Tensor:
        """(C R, L, L) bool: slot i may read slot j (the same sentence of the same row)."""
        segments = self.segment_ids.flatten(0, 1)  # (C R, L)
        return segments[:, :, None] == segments[:, None, :]

    def flat_slots(self) -> torch.Tensor:
        """(C P,) the masked slots as indices into all C R L slots."""
        C, R, L = self.input_ids.shape
        first = torch.arange(C, device=self.masked_slots.device)[:, None] * (R * L)
        return (self.masked_slots + first).flatten()

    def to(self, device: torch.device) -> RowBatch:
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name).to(device, non_blocking=getattr(self, f.name)
                                             .is_pinned())
            for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)})

    def pin_memory(self) -> RowBatch:
        return dataclasses.replace(self, **{
            f.name: getattr(self, f.name).pin_memory()
            for f in dataclasses.fields(self) if isinstance(getattr(self, f.name), torch.Tensor)})


def check_rows(cfg, model_cfg, max_length: int) -> None:
    """Refuses ``train.sequence_packing="rows"`` (``cfg`` a TrainConfig) where rows cannot run:
    a model other than BERT (rows need position ids and an attention mask as inputs), or rows
    shorter than the source's longest sentence (``max_length`` words + [CLS] + [SEP])."""
    if cfg.sequence_packing != "rows":
        return
    if model_cfg.arch != "bert":
        raise ValueError(f"train.sequence_packing='rows': model.arch={model_cfg.arch!r} reads "
                         "no position ids or attention mask; rows are for BERT, use 'padded' "
                         "or 'unpadded' (or 'auto')")
    if cfg.row_length < max_length + 2:
        raise ValueError(f"train.row_length={cfg.row_length}: the source's sentences take up to "
                         f"{max_length + 2} positions ([CLS], {max_length} words, [SEP]); use "
                         f"a row_length >= {max_length + 2}")


def row_loss_sum(model: nn.Module, batch: RowBatch) -> torch.Tensor:
    """Summed cross-entropy (nats) of the masked words of ``batch`` (``mlm_loss_sum``'s
    quantity): the encoder over every row, the head only at the masked slots."""
    logits = row_word_logits(model, batch.input_ids.flatten(0, 1), batch.attend(),
                             batch.position_ids.flatten(0, 1), batch.flat_slots())  # (C P, V)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32
    return F.cross_entropy(logits, batch.targets.flatten(), ignore_index=IGNORED,
                           reduction="sum")


def bucketed(count: int, share: int = 16) -> int:
    """``count`` rounded up to a multiple of the largest power of two <= count / ``share``: at
    most 1/share more, and few distinct values across batches (each a shape a compiled loss
    sees). Rows use share 16 (their slots are the encoder's work), masked slots 4 (the head's
    work per slot is small, and their count varies more at a masking rate).

    >>> [bucketed(n) for n in (0, 5, 17, 31, 32, 100, 404, 410)]
    [0, 5, 17, 31, 32, 100, 416, 416]
    >>> [bucketed(n, share=4) for n in (480, 500, 544)]
    [512, 512, 640]
    """
    step = 1 << max(0, (count // share).bit_length() - 1)
    return -(-count // step) * step


def place_in_rows(sizes: Sequence[int], row_length: int) -> tuple[list[int], list[int],
                                                                  list[int]]:
    """(row, first slot, index within the row) of each sentence of ``sizes`` slots, best fit
    decreasing: longest first, each into the fullest row that still has room (a new row when
    none has); ties go to the sentence first in the batch and to the row that came to that room
    last. Deterministic.

    >>> place_in_rows([5, 8, 3, 2], row_length=10)  # row 0: the 8; row 1: 5, 3, 2
    ([1, 0, 1, 1], [0, 0, 5, 8], [0, 0, 1, 2])
    >>> place_in_rows([5, 8, 3, 4], row_length=10)[0]  # 3 fits in neither row: a third
    [1, 0, 2, 1]
    """
    with_room: list[list[int]] = [[] for _ in range(row_length + 1)]  # room -> rows
    room: list[int] = []  # slots left in each row
    placed: list[int] = []  # sentences in each row so far
    row, first, index = [0] * len(sizes), [0] * len(sizes), [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # stable: ties keep order
        size = sizes[i]
        fits = next((r for r in range(size, row_length + 1) if with_room[r]), None)
        if fits is None:
            r = len(room)
            room.append(row_length)
            placed.append(0)
        else:
            r = with_room[fits].pop()
        row[i], first[i], index[i] = r, row_length - room[r], placed[r]
        room[r] -= size
        placed[r] += 1
        with_room[room[r]].append(r)
    return row, first, index


def into_rows(batch, row_length: int, sentences: int) -> RowBatch:
    """``batch`` (an ``MLMBatch``: right-padded ``encode``d sentences and their masked words)
    laid out in rows of ``row_length`` slots, each consecutive ``sentences`` of it (a
    micro-batch) in rows of its own. On the CPU, before the batch goes to the device."""
    n = len(batch.input_ids)
    if n % sentences:
        raise ValueError(f"rows: {n} sentences do not split into micro-batches of {sentences}")
    sizes = batch.attention_mask.sum(1)  # (n,) slots per sentence: its words + 2
    if int(sizes.max()) > row_length:
        raise ValueError(f"train.row_length={row_length}: a sentence takes {int(sizes.max())} "
                         "positions ([CLS], its words, [SEP]); use a row_length at least the "
                         "source's max_length + 2")
    starts = range(0, n, sentences)
    placements = [place_in_rows(sizes[lo:lo + sentences].tolist(), row_length) for lo in starts]
    R = bucketed(max(max(row) + 1 for row, _, _ in placements))
    C, L = len(placements), row_length
    input_ids = torch.full((C, R * L), PAD_ID, dtype=torch.int64)
    segment_ids = -torch.arange(1, L + 1).repeat(R).expand(C, R * L).clone()  # unused: own id
    position_ids = torch.zeros(C, R * L, dtype=torch.int64)
    slots, targets = [], []
    for c, (lo, (row, first, index)) in enumerate(zip(starts, placements, strict=True)):
        part = slice(lo, lo + sentences)
        real = batch.attention_mask[part].bool()  # (m, W)
        start = torch.tensor(row) * L + torch.tensor(first)  # (m,) flat slot of each [CLS]
        within = torch.arange(real.shape[1]).expand(real.shape)  # (m, W)
        dest = (start[:, None] + within)[real]  # the slots of every real token, sentence-major
        input_ids[c, dest] = batch.input_ids[part][real]
        segment_ids[c, dest] = torch.tensor(index)[:, None].expand(real.shape)[real]
        position_ids[c, dest] = within[real]
        word_slots, words = _masked_slots(batch.positions[part], batch.targets[part], start)
        slots.append(word_slots)
        targets.append(words)
    P = sentences if batch.positions.dtype != torch.bool else bucketed(max(map(len, slots)), 4)
    masked_slots = torch.zeros(C, P, dtype=torch.int64)
    masked_targets = torch.full((C, P), IGNORED, dtype=torch.int64)
    for c, (word_slots, words) in enumerate(zip(slots, targets, strict=True)):
        masked_slots[c, :len(word_slots)], masked_targets[c, :len(words)] = word_slots, words
    shape = (C, R, L)
    return RowBatch(input_ids.view(shape), segment_ids.view(shape), position_ids.view(shape),
                    masked_slots, masked_targets, sentences=sentences,
                    masked=tuple(len(s) for s in slots))


def _masked_slots(positions: torch.Tensor, targets: torch.Tensor,
                  start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat slots, word ids) of a micro-batch's masked words: word t of a sentence whose
    [CLS] is at slot s sits at s + t + 1. ``positions`` (m,) word positions or (m, T) bool."""
    if positions.dtype == torch.bool:
        sentence, t = positions.nonzero(as_tuple=True)  # row-major, as word_logits gathers
        return start[sentence] + t + 1, targets[positions]
    return start + positions + 1, targets
