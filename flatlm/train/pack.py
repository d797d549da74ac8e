"""``train_pack``: K pre-training runs of one model shape trained together as one model (issue 41).

Small models leave a GPU (and a CPU core) idle between the kernels of one update; K trials that
differ in seed, learning rate, regularisation or length but share a shape can instead be one
model with a leading member axis (``flatlm.models.packed.PackedBert``): one update then costs
about the operations of one trial (HFTA, Wang et al., MLSys 2021). Each member is its own run
(``MemberRun``, a ``flatlm.train.run.Run``): its own initialisation, data stream, masking,
label noise and dropout (all from its own ``cfg.seed``), learning rate, schedule, weight decay
and algorithm settings, log window, divergence check, checkpoints under its own ``out_dir`` in
``train``'s format (``find_checkpoints`` and ``load_checkpoint`` read them, ``train(...,
resume=True)`` continues one unpacked) and its training log (``train_log.jsonl``).

Equal to unpacked. On the CPU a member's every loss, checkpoint and final weight equal those of
``train(cfg_k, ...)`` run alone, bit for bit: the packed forward, gradients and optimizer step
repeat the single model's arithmetic (``flatlm.models.packed``, ``packed_optim``), and each
member's dropout masks come from its own generator in the state of its twin's global RNG. On
CUDA the twin's fused kernels (dropout, attention, bf16 autocast) sum and draw differently: there
a member equals its twin in distribution, not bit for bit. A resumed pack equals an uninterrupted
one bit for bit (tests/train/test_pack.py): at a checkpoint step every member's files are
written before any hook runs, and a pack stopped in the middle of a round resumes each member
from the step all of them reached (``aligned_starts``). The pack trains eagerly
(``train.compile`` is not read) and never cuts a micro-batch to its longest sentence: with
``train.unpad`` on (CUDA's default; off on the CPU unless asked for) its rows are sorted as the
twin's, but the twin's shorter micro-batches sum and draw dropout in other shapes.

Members leave the pack when done: after its last update and checkpoint (members may differ in
``steps``), or when it diverges (``Diverged``, recorded as its result): the others go on, in a
smaller pack. What members must share, because it is the pack's shape: the model shape, the
batch and micro-batch sizes, the masking kind ("one" or a rate), the optimizer (adamw-based or
sgd-based algorithms), the precision, and the checkpoint steps a resume goes back to.
Packable algorithms are those with an ``Algorithm.packed_step`` (adamw, sgd, noreg, label_noise,
sam, adversarial); the others say why not (``unpacked_reason``): grow. Only the post-LN BERT is
hand-batched (the pre-LN variant and the BiLSTM train unpacked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from flatlm.core.schedules import learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.models.architectures import unpackable_reason
from flatlm.models.bert import build_model
from flatlm.models.checkpoint import load_checkpoint, quiet_transformers_bars
from flatlm.models.masked_lm import architecture_of
from flatlm.models.presets import ModelConfig, parse_model
from flatlm.sources.base import Source
from flatlm.storage.dirlock import writer_lock
from flatlm.train.algorithms import StepContext, mlm_loss_sum
from flatlm.train.config import ALGORITHMS, TrainConfig, resolve
from flatlm.train.pack_steps import PackContext, stack_inputs
from flatlm.train.packed_optim import PackedOptimizer
from flatlm.train.registry import algorithm_named, check_before_training
from flatlm.train.run import (
    CheckpointHook,
    Diverged,
    Run,
    StepHook,
    TrainResult,
    autocast_for,
    build_pipeline,
    start_checkpoint,
)
from flatlm.train.sizes import check_fits
from flatlm.train.state import checkpoint_dir, find_checkpoints, load_state, set_aside

# What every member must share: the fields that make the pack's tensors one shape, or one loop.
SHARED_FIELDS = ("batch_size", "micro_batch_size", "precision", "world_size")


def train_pack(
    cfgs: Sequence[TrainConfig],
    source: Source,
    model_cfg: ModelConfig | str,
    out_dirs: Sequence[str | Path],
    *,
    device: str | torch.device = "cpu",
    on_checkpoint: CheckpointHook | Sequence[CheckpointHook | None] | None = None,
    progress: bool = True,
    resume: bool = False,
    corpus: tuple[torch.Tensor, torch.Tensor] | None = None,
    on_step: StepHook | None = None,
    on_round: Callable[[int], None] | None = None,
    resume_before: Sequence[int | None] | None = None,
) -> list[TrainResult | Diverged]:
    """Trains run k = ``train(cfgs[k], source, model_cfg, out_dirs[k], ...)`` for every k, as
    one packed model (module docstring). ``on_checkpoint``: one hook for every member (it gets
    the member's model and checkpoint directory; all members' checkpoints of a step are on
    disk before the first hook of that step runs) or one per member. Returns each member's
    ``TrainResult``, or the ``Diverged`` that stopped it. ``on_step(step)``: told the pack's
    step where it starts and after every update (a progress line's, as ``train``'s).
    ``on_round(step)``: told after the hooks of the members checkpointed at ``step`` (a sink
    that reports once per round: the Ray sweeps' packs). ``resume_before[k]``: member k
    resumes from a checkpoint before that step (``train``'s ``resume_before``). Bad or
    unpackable configurations raise ``ValueError`` before any training."""
    if len(cfgs) != len(out_dirs) or not cfgs:
        raise ValueError(f"pack: {len(cfgs)} configs for {len(out_dirs)} output directories")
    cfgs = [resolve(c) for c in cfgs]  # as the twin saves it (compile / unpad: docstring)
    shape = parse_model(model_cfg)
    model_cfgs = [dataclasses.replace(shape, dropout=c.dropout) for c in cfgs]
    out_dirs = [Path(d).absolute() for d in out_dirs]
    device = torch.device(device)
    check_packable(cfgs, shape, out_dirs)
    hooks = list(on_checkpoint) if isinstance(on_checkpoint, Sequence) \
        else [on_checkpoint] * len(cfgs)
    for cfg, mc in zip(cfgs, model_cfgs, strict=True):
        check_before_training(cfg, mc)
        check_fits(cfg, mc, source, device)
    with contextlib.ExitStack() as stack:
        if not progress:
            stack.enter_context(quiet_transformers_bars())
        before = list(resume_before) if resume_before is not None else [None] * len(cfgs)
        starts = aligned_starts(cfgs, [start_checkpoint(c, mc, d, resume, source, b)
                                       for c, mc, d, b in zip(cfgs, model_cfgs, out_dirs, before,
                                                              strict=True)])
        pipelines = []
        stack.callback(lambda: [p.close() for p in pipelines])
        built = [build_pipeline(c, source, device, corpus) for c in cfgs]
        pipelines += [p for p, _ in built]
        for d, (_, unreadable) in zip(out_dirs, starts, strict=True):
            stack.enter_context(writer_lock(d))
            for bad, _ in unreadable:
                set_aside(bad)
        members = [MemberRun.begin(c, source, mc, d, device, p, s[0], hook)
                   for c, mc, d, p, s, hook in zip(cfgs, model_cfgs, out_dirs, pipelines, starts,
                                                   hooks, strict=True)]
        for m, (_, n_classes) in zip(members, built, strict=True):
            m.ctx.n_classes = n_classes  # adversarial: the classes of its probe task
        cuda = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):  # a hook may draw; training never does
            Pack(members, device).loop(progress, on_step, on_round)
    return [m.result() for m in members]


def aligned_starts(cfgs, starts):
    """``start_checkpoint``'s answers, the unfinished members moved back to the step they all
    reached: a pack stopped while writing one round of checkpoints (a crash, a full disk) has
    some members one checkpoint ahead. A member goes back to its own checkpoint at that step (it
    then retrains to the same newer checkpoint, bit for bit), or afresh if that step is the
    start; a ValueError if it has no checkpoint there (members checkpointed at other steps)."""
    def step(start):
        return 0 if start[0] is None else start[0][1].step

    unfinished = [k for k, (c, s) in enumerate(zip(cfgs, starts, strict=True))
                  if step(s) < c.steps]
    if len({step(starts[k]) for k in unfinished}) <= 1:
        return starts
    target = min(step(starts[k]) for k in unfinished)
    aligned = list(starts)
    for k in unfinished:
        if step(starts[k]) == target:
            continue
        ckpt, _ = starts[k][0]
        older = find_checkpoints(ckpt.parent.parent).get(target)
        if older is None and target > 0:
            raise ValueError(f"pack: the unfinished members resume from different steps "
                             f"({sorted({step(starts[j]) for j in unfinished})}) and "
                             f"{ckpt.parent.parent} has no checkpoint at step {target}; "
                             "resume them unpacked, or in packs of one step")
        aligned[k] = ((older, load_state(older)) if older is not None else None,
                      starts[k][1])
    return aligned


def check_packable(cfgs: Sequence[TrainConfig], shape: ModelConfig, out_dirs) -> None:
    """Raises ``ValueError`` naming what keeps these runs from being one pack."""
    if len(set(out_dirs)) != len(out_dirs):
        raise ValueError("pack: two members share an output directory")
    why = unpackable_reason(shape)
    if why is not None:
        raise ValueError(f"pack: {why}; train these trials unpacked")
    for cfg in cfgs:
        algorithm_named(cfg.algorithm).packed_update()  # a ValueError saying why not
    for field in SHARED_FIELDS:
        values = {getattr(c, field) for c in cfgs}
        if len(values) > 1:
            raise ValueError(f"pack: the members differ in train.{field} {sorted(values, key=str)}"
                             "; a pack's members share it")
    if any(c.sequence_packing == "rows" for c in cfgs):
        raise ValueError("pack: train.sequence_packing='rows' lays out one run's sentences in "
                         "rows; a trial pack stacks its members' padded batches: use 'padded', "
                         "'unpadded' or 'auto' (or train these trials unpacked)")
    if cfgs[0].world_size != 1:
        raise ValueError("pack: train.world_size must be 1 (a pack is one process)")
    if any(c.targets != "sampled" for c in cfgs):
        raise ValueError("pack: train.targets='truth': the packed updates train on the sampled "
                         "words; train these trials unpacked (or with train.targets=sampled)")
    kinds = {("one" if c.mask == "one" else "rate") for c in cfgs}
    optimizers = {ALGORITHMS[c.algorithm].optimizer for c in cfgs}
    updates = {algorithm_named(c.algorithm).packed_step for c in cfgs}
    for what, values in (("masking kind", kinds), ("optimizer", optimizers),
                         ("update", updates)):
        if len(values) > 1:
            raise ValueError(f"pack: the members differ in their {what} {sorted(values)}; a "
                             "pack's members share it")


class _MemberOptimizer:
    """What ``Run.write_checkpoint`` reads of an optimizer, for one member of a pack."""

    def __init__(self, member: MemberRun):
        self.member = member

    def state_dict(self) -> dict:
        m = self.member
        return m.pack.ctx.optimizer.member_state_dict(m.index, m.ctx.model)


class MemberRun(Run):
    """One member of a pack as its own run: ``Run``'s history, log window, divergence check and
    checkpoints, its model a copy of its slice of the pack (synced before it is read) and its
    RNG its own dropout generator."""

    @classmethod
    def begin(cls, cfg, source, model_cfg, out_dir, device, pipeline, start,
              hook) -> MemberRun:
        if start is None:
            model = build_model(model_cfg, source.V, source.max_length, seed=cfg.seed)
        else:
            model, state = load_checkpoint(start[0])[0], start[1]
            pipeline.check_state(state.data, state.step)
        model = model.to(device).train()
        ctx = StepContext(cfg=cfg, model=model, optimizer=None, autocast=autocast_for(cfg, device),
                          mlm_loss=mlm_loss_sum)
        run = cls(cfg, source, model_cfg, out_dir, device, pipeline, ctx,
                  resumed=None if start is None else state)
        ctx.optimizer = _MemberOptimizer(run)
        run.hook, run.error, run.pack, run.index = hook, None, None, None
        run.generator = torch.Generator(device).manual_seed(derive_seed(cfg.seed, "dropout", 0))
        if start is not None:
            run.generator.set_state(state.rng["cuda"][0] if device.type == "cuda"
                                    else state.rng["cpu"])
        run.optimizer_state = None if start is None else state.optimizer
        return run

    @property
    def done(self) -> bool:
        return self.error is not None or self.step >= self.cfg.steps

    def capture_rng(self) -> dict:
        """The member's dropout stream where its twin keeps it: the global CPU RNG's slot (on
        CUDA the device's slot, the CPU's holding the process's state)."""
        if self.device.type == "cuda":
            return {"cpu": torch.get_rng_state(), "cuda": [self.generator.get_state()]}
        return {"cpu": self.generator.get_state(), "cuda": []}

    def learning_rate(self) -> float:
        cfg = self.cfg
        return learning_rate(self.step, peak=cfg.lr, warmup_steps=cfg.warmup_steps,
                             total_steps=cfg.steps, schedule=cfg.schedule)

    def sync(self) -> None:
        """The member's model takes its slice of the pack's parameters."""
        if self.pack is not None:
            self.pack.ctx.model.load_member(self.index, self.ctx.model)

    def checkpoint_due(self) -> bool:
        """A checkpoint step not resumed from, and the member not diverged: a read-out that
        diverged at a checkpoint step leaves it in the pack until ``retire``, and ``train``
        alone raises before that checkpoint is written."""
        return (self.error is None and self.step in self.cfg.checkpoint_steps
                and self.step != self.resumed_at)

    def write_due_checkpoint(self) -> None:
        """``Run.loop``'s checkpoint without its hook: the read-out's check, then the files."""
        self.sync()
        try:
            self.check_window()
        except Diverged as e:
            self.error = e
            return
        self.checkpoint(None)
        self.interval_start = (time.perf_counter(), self.step)

    def call_hook(self) -> None:
        """The hook on the checkpoint just written, the model in eval mode (as ``Run``)."""
        if self.hook is None or self.error is not None:
            return
        self.ctx.model.eval()
        try:
            self.hook(self.step, self.ctx.model, checkpoint_dir(self.out_dir, self.step))
        finally:
            self.ctx.model.train()

    def record(self, metrics: dict[str, torch.Tensor], lr: float) -> None:
        """One update's metrics into the log window, and the read-out when due."""
        self.step += 1
        self.accumulate(metrics)
        if self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps:
            try:
                self.flush(lr)
            except Diverged as e:
                self.error = e

    def result(self) -> TrainResult | Diverged:
        if self.error is not None:
            return self.error
        return TrainResult(model=self.ctx.model, step=self.step, history=self.history,
                           checkpoints=find_checkpoints(self.out_dir))


class Pack:
    """The members still training, as one model: the loop of ``Run.loop`` over all of them."""

    def __init__(self, members: Sequence[MemberRun], device: torch.device):
        self.members, self.device = list(members), device
        training = [m for m in members if not m.done]  # a finished member resumed: nothing
        steps = {m.step for m in training}
        if len(steps) > 1:
            raise ValueError(f"pack: the unfinished members resume from different steps "
                             f"{sorted(steps)}; resume them unpacked or in packs of one step")
        self.alive: list[MemberRun] = []
        if not training:
            return
        cfgs = [m.cfg for m in training]
        models = [m.ctx.model for m in training]  # check_packable: their architecture packs
        model = architecture_of(models[0]).pack(models).to(device)
        optimizer = PackedOptimizer(list(model.params), cfgs, ALGORITHMS[cfgs[0].algorithm]
                                    .optimizer)
        if training[0].optimizer_state is not None:
            optimizer.load_members([m.optimizer_state for m in training],
                                   [m.ctx.model for m in training])
        self.ctx = PackContext(cfgs=cfgs, model=model, optimizer=optimizer,
                               generators=[m.generator for m in training],
                               autocast=training[0].ctx.autocast,
                               n_classes=[m.ctx.n_classes for m in training])
        self.update: Callable = algorithm_named(cfgs[0].algorithm).packed_update()
        for i, m in enumerate(training):
            m.pack, m.index = self, i
        self.alive = training

    def loop(self, progress: bool, on_step: StepHook | None = None,
             on_round: Callable[[int], None] | None = None) -> None:
        on_step = on_step or (lambda step: None)
        total = max((m.cfg.steps for m in self.members), default=0)
        start = self.alive[0].step if self.alive else total
        bar = tqdm(total=total, initial=start, disable=not progress, unit="step",
                   desc=f"train pack of {len(self.alive)}")
        with bar:
            on_step(start)
            while self.alive:
                due = [m for m in self.alive if m.checkpoint_due()]
                for m in due:  # every member's files first: a hook that stops the process
                    m.write_due_checkpoint()  # leaves the pack's checkpoints one round
                for m in due:
                    m.call_hook()
                if due and on_round is not None:
                    on_round(due[0].step)
                self.retire()
                if not self.alive:
                    return
                lrs = [m.learning_rate() for m in self.alive]
                step = self.alive[0].step
                batch = stack_inputs([m.pipeline.inputs_at(step) for m in self.alive])
                metrics = self.update(self.ctx, batch, lrs)
                for k, (m, lr) in enumerate(zip(self.alive, lrs, strict=True)):
                    m.record({name: v[k] for name, v in metrics.items()}, lr)
                bar.update()
                on_step(step + 1)

    def retire(self) -> None:
        """Members that finished or diverged leave the pack (their models synced first)."""
        keep = [k for k, m in enumerate(self.alive) if not m.done]
        if len(keep) == len(self.alive):
            return
        for m in self.alive:
            m.sync()
        gone = [m for m in self.alive if m.done]
        self.alive = [self.alive[k] for k in keep]
        if self.alive:
            self.ctx.keep(keep)
        for i, m in enumerate(self.alive):
            m.index = i
        for m in gone:
            m.pack, m.index = None, None
