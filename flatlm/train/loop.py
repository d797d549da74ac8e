"""``train``: one pre-training run, shared by every algorithm, resumable from any checkpoint.

The run is a pure function of its config and seed: the model's initialisation, every batch, every
masked position and every dropout mask derive from ``cfg.seed``, and a checkpoint stores the
optimizer, the data position and the RNG state, so stopping at a checkpoint and resuming gives the
same parameters as never stopping (bit for bit on the CPU; see tests/train/test_resume.py).
The global RNG is forked for the run and restored after it, and the ``on_checkpoint`` hook runs on
a copy of the RNG state, so measuring at a checkpoint changes nothing in training.

The run itself (``Run``, its pipeline, the checkpoint it resumes from) lives in
``flatlm.train.run``, which the data-parallel ranks (``flatlm.train.distributed``) share; this
module picks one process or many. ``Diverged``, ``CheckpointWriteError``, ``TrainResult``,
``TRAINING_INTERVAL`` and ``autocast_for`` are importable from here as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import torch

from flatlm.models.checkpoint import quiet_transformers_bars
from flatlm.models.presets import ModelConfig, parse_model
from flatlm.sources.base import Source
from flatlm.storage.dirlock import writer_lock
from flatlm.train.config import TrainConfig, resolve
from flatlm.train.distributed import train_data_parallel
from flatlm.train.registry import check_before_training
from flatlm.train.rows import check_rows
from flatlm.train.run import (
    TRAINING_INTERVAL,
    CheckpointHook,
    CheckpointWriteError,
    Diverged,
    Run,
    StepHook,
    TrainHooks,
    TrainResult,
    autocast_for,
    build_pipeline,
    start_checkpoint,
)
from flatlm.train.sizes import check_fits
from flatlm.train.state import find_checkpoints, set_aside

__all__ = ["TRAINING_INTERVAL", "CheckpointHook", "CheckpointWriteError", "Diverged",
           "TrainResult", "autocast_for", "train"]


def train(
    cfg: TrainConfig,
    source: Source,
    model_cfg: ModelConfig | str,
    out_dir: str | Path,
    *,
    device: str | torch.device = "cpu",
    on_checkpoint: CheckpointHook | None = None,
    progress: bool = True,
    on_step: StepHook | None = None,
    resume: bool = False,
    corpus: tuple[torch.Tensor, torch.Tensor] | None = None,
    resume_before: int | None = None,
) -> TrainResult:
    """Pre-trains a masked LM of shape ``model_cfg`` on ``source`` for ``cfg.steps`` updates.

    Checkpoints go to ``out_dir/checkpoints/step-<N>/`` at ``cfg.checkpoint_steps``; after each is
    written, ``on_checkpoint(step, model, ckpt_dir)`` is called with the live model in eval mode
    (it is put back in train mode after). ``resume`` continues from the newest checkpoint in
    ``out_dir`` (or starts afresh if there is none); without it, an ``out_dir`` that already holds
    checkpoints is an error. The hook is not called again for the checkpoint resumed from.
    ``resume_before``: resume from the newest checkpoint at an earlier step (a checkpoint at
    that step was set aside unmeasured and must be trained again; the newer ones are trained
    again on the way, bit for bit on the CPU, and replaced).
    ``on_step(step)``: called where training starts and after every update (a progress line).
    ``corpus``: (tokens, lengths) already in memory, used instead of reading ``cfg.data``.
    ``model_cfg.dropout`` is replaced by ``cfg.dropout`` (resolved). Bad configurations raise
    ``ValueError`` before any training. ``cfg.world_size`` > 1 trains data-parallel, this
    process being rank 0 (``flatlm.train.distributed``).
    """
    if cfg.world_size > 1:
        return train_data_parallel(cfg, source, model_cfg, out_dir, device=device,
                                   on_checkpoint=on_checkpoint, progress=progress, resume=resume,
                                   corpus=corpus, on_step=on_step, resume_before=resume_before)
    cfg = resolve(cfg)
    model_cfg = dataclasses.replace(parse_model(model_cfg), dropout=cfg.dropout)
    check_before_training(cfg, model_cfg)  # grow: every shape a growth of the one before it
    check_rows(cfg, model_cfg, source.max_length)  # rows: BERT, long enough for a sentence
    device = torch.device(device)
    out_dir = Path(out_dir).absolute()
    check_fits(cfg, model_cfg, source, device)  # before any allocation: sizes vs memory
    with contextlib.nullcontext() if progress else quiet_transformers_bars():
        start, unreadable = start_checkpoint(cfg, model_cfg, out_dir, resume, source,
                                             resume_before)
        pipeline, n_classes = build_pipeline(cfg, source, device, corpus)
        try:
            with writer_lock(out_dir):  # one writer: two runs into one directory would mix them
                for bad, _ in unreadable:  # kept for inspection, out of the way of those retrained
                    set_aside(bad)
                run = _train(cfg, source, model_cfg, out_dir, device, (pipeline, n_classes),
                             start, TrainHooks(on_checkpoint, progress, on_step))
        finally:
            pipeline.close()
    return TrainResult(model=run.ctx.model, step=run.step, history=run.history,
                       checkpoints=find_checkpoints(out_dir))


def _train(cfg, source, model_cfg, out_dir, device, built, start, hooks: TrainHooks) -> Run:
    """The run from ``start`` with the ``built`` (pipeline, n_classes) of ``build_pipeline``."""
    cuda = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        run = Run.begin(cfg, source, model_cfg, out_dir, device, *built, start)
        run.loop(hooks)
    return run


