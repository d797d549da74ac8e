"""A pack's checkpoints measured a round at a time, the loss of all members in one batched
forward (``run_pack(..., batched_measure=True)``, issue 41).

``RoundMeasurer`` stands in for the members' ``TrialMeasurer`` hooks: a hook only records
(member, step, model, checkpoint); ``flush()``, called after each round of the pack's hooks
(``train_pack``'s ``on_round``, and after the resume's catch-up), measures what was recorded,
oldest step first: for each step, the pre-training loss, KL and entropy of every member there
that measures the loss, on the same evaluation data and ``LossConfig``, as one problem
(``flatlm.measure.packed_loss``), then each member's other measurements through its own
``TrialMeasurer`` as before. Every value equals the per-member path's bit for bit on the CPU
(``tests/runs/test_run_pack.py``); ``time/loss_s`` is the member's share of the batched
loss's wall time (that time over the members in it), so that a sum over the members counts
it once.

What is batched: ``loss`` (``pretrain/*``). What is not, and runs member by member: Tr(F),
Tr(H) and the other curvature estimators, the probes, fine-tuning and the reference rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from flatlm.measure.packed_loss import packed_pretrain_loss
from flatlm.runs.trial import Premeasured, TrialMeasurer

BATCHED = ("loss",)  # the MeasureConfig.what names measured for the round as one problem


class RoundMeasurer:
    """The members' checkpoint hooks, measured a round at a time (module docstring)."""

    def __init__(self, measurers: Sequence[TrialMeasurer], device):
        self.measurers, self.device = list(measurers), device
        self.pending: list[tuple[int, int, object, Path]] = []  # (member, step, model, ckpt)

    def hook(self, member: int) -> Callable:
        """Member ``member``'s ``on_checkpoint`` hook: records the checkpoint for ``flush``."""
        def record(step: int, model, ckpt_dir) -> None:
            self.pending.append((member, step, model, Path(ckpt_dir)))
        return record

    def flush(self) -> None:
        """Measures, records and reports every recorded checkpoint, oldest step first."""
        pending, self.pending = self.pending, []
        for step in sorted({s for _, s, _, _ in pending}):
            due = [(k, model, ckpt) for k, s, model, ckpt in pending if s == step]
            given = self._batched(step, due)
            for k, model, ckpt in due:
                was_training = model.training  # train_pack's hook hands it back in train mode
                try:
                    self.measurers[k](step, model, ckpt, given=given.get(k))
                finally:
                    model.train(was_training)

    def _batched(self, step: int, due) -> dict[int, Premeasured]:
        """The batched measurements of the members ``due`` at ``step``: one problem per set of
        members sharing their evaluation data (members measured alike share it, ``run_pack``)."""
        groups: dict[int, list] = {}
        for k, model, _ in due:
            m = self.measurers[k]
            if "loss" in m.cfg.measure.what and step not in m.done:  # else: its row kept
                groups.setdefault(id(m.data), []).append((k, model))
        given = {}
        for members in groups.values():
            first = self.measurers[members[0][0]]
            first.watch.measuring(step, f"loss of {len(members)} members")  # the pack's watch
            start = time.perf_counter()
            losses = packed_pretrain_loss([model for _, model in members], first.source,
                                          first.data.tokens, first.data.lengths,
                                          first.cfg.measure.loss, device=self.device)
            share = (time.perf_counter() - start) / len(members)
            for (k, _), metrics in zip(members, losses, strict=True):
                given[k] = Premeasured(BATCHED, {**metrics, "time/loss_s": share}, share)
        return given
