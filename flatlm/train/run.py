"""A run in progress (``Run``) and what starts one: the pipeline, the checkpoint to resume from.

Shared by the one-process loop (``flatlm.train.loop.train``) and every data-parallel rank
(``flatlm.train.distributed``, whose ``RankRun`` is a ``Run``): both import this module and
neither imports the other's internals. The run is a pure function of its config and seed (see
``flatlm.train.loop``): the global RNG is forked around it by the caller, and the
``on_checkpoint`` hook runs on a copy of the RNG state, so measuring changes nothing in training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import SafetensorError
from torch import nn
from tqdm.auto import tqdm

from flatlm.core.config import flatten_dict, to_dict
from flatlm.core.safe_io import make_fresh_dir, refuse_link
from flatlm.core.schedules import learning_rate
from flatlm.core.seeds import derive_seed
from flatlm.models.bert import build_model
from flatlm.models.checkpoint import (
    INFO_NAME,
    SOURCE_FINGERPRINT,
    check_language,
    load_checkpoint,
    save_checkpoint,
)
from flatlm.models.masked_lm import non_finite_part
from flatlm.storage.manifest import write_manifest
from flatlm.storage.metrics_log import write_train_log
from flatlm.train.algorithms import STEPS, StepContext, build_optimizer
from flatlm.train.compiled import loss_function
from flatlm.train.config import TrainConfig
from flatlm.train.data import (
    BatchPipeline,
    CorpusBatches,
    FreshSamples,
    prefetch_depth,
    read_corpus,
)
from flatlm.train.errors import CheckpointWriteError, Diverged  # callers import them here too
from flatlm.train.growth import grow_context, growth_due, shape_at
from flatlm.train.registry import algorithm_named, load_ref, unused_sections
from flatlm.train.state import (
    TrainState,
    capture_rng,
    checkpoint_dir,
    find_checkpoints,
    load_state,
    readable_checkpoints,
    restore_rng,
    save_state,
)

log = logging.getLogger(__name__)

CheckpointHook = Callable[[int, nn.Module, Path], None]
StepHook = Callable[[int], None]  # told the step after every update (a progress line's)


class TrainHooks(NamedTuple):
    """What a run tells its caller: each checkpoint written (``on_checkpoint(step, model,
    ckpt_dir)``), each step (``on_step``), and whether it shows a progress bar."""

    on_checkpoint: CheckpointHook | None = None
    progress: bool = True
    on_step: StepHook | None = None
# A checkpoint's record of the training before it: {"seconds", "updates"} since the previous
# checkpoint (or since this process started or resumed the run).
TRAINING_INTERVAL = "training_interval"
# Fields a resumed run may change: how long it runs and what it saves, not what it computes.
RESUMABLE_CHANGES = ("steps", "checkpoint_steps", "log_every", "compile", "precision",
                     "divergence_factor", "unpad", "sequence_packing", "row_length", "prefetch",
                     "prefetch_workers")


# What a writer raises when the disk is full: OSError (ENOSPC, EDQUOT), torch's RuntimeError
# ("basic_ios::clear"), and safetensors' own SafetensorError (neither of those).
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


@dataclass
class TrainResult:
    model: nn.Module  # the trained model, on the device, in train mode
    step: int  # updates done (cfg.steps)
    history: list[dict]  # {"step", "train/lr", "train/loss", ...}: means over each log window
    checkpoints: dict[int, Path] = field(default_factory=dict)  # every checkpoint in out_dir


def build_pipeline(cfg, source, device, corpus) -> tuple[BatchPipeline, int]:
    """(update index -> inputs on ``device``, classes of the algorithm's probe task or 0);
    checks ``train.data``. ``corpus``: (tokens, lengths) in memory instead of ``cfg.data``."""
    if cfg.data == "fresh":
        if corpus is not None:
            raise ValueError("train.data='fresh' but corpus tensors were given; set train.data "
                             "to the corpus's name or path")
        sentences = FreshSamples(source, cfg.batch_size, cfg.seed)
    else:
        tokens, lengths = corpus if corpus is not None else read_corpus(cfg.data, source)
        sentences = CorpusBatches(tokens, lengths, cfg.batch_size, cfg.seed, n_words=source.V)
    make_pool = algorithm_named(cfg.algorithm).probe_pool  # adversarial: D1, D2 each update
    pool = load_ref(make_pool)(cfg, source, device) if make_pool is not None else None
    pipeline = BatchPipeline(cfg, sentences, device, pool=pool,
                             prefetch=prefetch_depth(cfg, device), workers=cfg.prefetch_workers,
                             truth=truth_for_targets(cfg, source))
    return pipeline, pool.n_classes if pool else 0


def truth_for_targets(cfg, source):
    """The source whose true conditionals are the targets (``train.targets="truth"``), or None
    (the sampled words); a source without them is refused before any work."""
    if cfg.targets == "sampled":
        return None
    if not source.has_truth:
        raise ValueError(f"train.targets={cfg.targets!r}: the source ({type(source).__name__}) "
                         "has no exact conditionals (Source.has_truth); use train.targets="
                         "sampled")
    return source


def start_checkpoint(cfg, model_cfg, out_dir, resume, source=None, before=None):
    """(the checkpoint to resume from and its state, or None to start afresh; the newer
    checkpoints that do not load), after checking that it continues this run (on ``source``'s
    language, when given). ``before``: resume from a checkpoint at an earlier step (one at
    that step must be trained again: ``flatlm.runs.trial.retrain_from``); None: the newest."""
    found = find_checkpoints(out_dir)
    if not resume:
        if found:
            raise ValueError(f"{out_dir} already holds checkpoints (steps {list(found)}); resume "
                             "them (--resume / resume=True) or choose another output directory")
        return None, []
    ckpt, unreadable = readable_checkpoints(out_dir, before)  # a torn or truncated one skipped
    if ckpt is None:
        return None, unreadable
    state = load_state(ckpt)
    renamed = TrainConfig.RENAMED_KEYS  # a checkpoint saved before the keys moved
    own = flatten_dict(cfg.own_settings())  # a section at its defaults writes no keys
    saved = {**flatten_dict(to_dict(TrainConfig())),  # a key added since: its default
             **own,
             **{renamed.get(k, k): v for k, v in flatten_dict(state.config).items()}}
    now = {**own, **flatten_dict(to_dict(cfg))}
    # what the run does not read may differ too: the sections of the other algorithms
    unread = {*RESUMABLE_CHANGES, *unused_sections(cfg.algorithm)}
    changed = [k for k in now if k.split(".")[0] not in unread and saved.get(k) != now[k]]
    if changed:
        diffs = ", ".join(f"train.{k}={saved.get(k)!r} -> {now[k]!r}" for k in changed)
        raise ValueError(f"resume from {ckpt}: the run changed ({diffs}); only "
                         f"{', '.join(RESUMABLE_CHANGES)} (and the sections of other "
                         "algorithms) may change when resuming")
    if state.step > cfg.steps:
        raise ValueError(f"resume from {ckpt}: it is past train.steps={cfg.steps}")
    info = json.loads((ckpt / INFO_NAME).read_text())
    if source is not None:
        check_language(ckpt, info, source, "resume")
    model_cfg = shape_at(cfg, model_cfg, state.step)  # grow: the shape it had grown into
    if info["model"] != model_cfg.to_dict():
        raise ValueError(f"resume from {ckpt}: the checkpoint's model is {info['model']}, this "
                         f"run asks for {model_cfg.to_dict()}")
    return (ckpt, state), unreadable




class Run:
    """A run in progress: its step, the objects it updates and its metric log."""

    def __init__(self, cfg, source, model_cfg, out_dir, device, pipeline, ctx, *,
                 resumed: TrainState | None = None):
        self.cfg, self.source, self.model_cfg = cfg, source, model_cfg
        self.out_dir, self.device, self.pipeline, self.ctx = out_dir, device, pipeline, ctx
        self.step = resumed.step if resumed else 0
        self.resumed_at = resumed.step if resumed else None  # its checkpoint exists already
        self.history = list(resumed.history) if resumed else []
        window = resumed.window if resumed else {}
        self.window_count = window.get("count", 0)  # updates summed in self.window
        self.window = {k: torch.tensor(v, device=device)
                       for k, v in window.get("sums", {}).items()}
        self.interval_start = (time.perf_counter(), self.step)  # training since: clock, step

    @classmethod
    def begin(cls, cfg, source, model_cfg, out_dir, device, pipeline, n_classes, start) -> Run:
        """A fresh run (``start`` None) or one restored from ``start`` = (checkpoint, state)."""
        if start is None:
            model = build_model(model_cfg, source.V, source.max_length, seed=cfg.seed)
            torch.manual_seed(derive_seed(cfg.seed, "dropout", 0))  # inside the forked RNG
        else:
            model, state = load_checkpoint(start[0])[0], start[1]
            model_cfg = shape_at(cfg, model_cfg, state.step)
            pipeline.check_state(state.data, state.step)
            restore_rng(state.rng, device)
        model = model.to(device).train()
        optimizer = build_optimizer(cfg, model, fused=device.type == "cuda")
        ctx = StepContext(cfg=cfg, model=model, optimizer=optimizer, n_classes=n_classes,
                          autocast=autocast_for(cfg, device),
                          mlm_loss=loss_function(cfg, device))
        if start is None:
            return cls(cfg, source, model_cfg, out_dir, device, pipeline, ctx)
        optimizer.load_state_dict(state.optimizer)
        return cls(cfg, source, model_cfg, out_dir, device, pipeline, ctx, resumed=state)

    def loop(self, hooks: TrainHooks) -> None:
        on_checkpoint, progress, on_step = hooks
        cfg, step_fn = self.cfg, self.update_function()
        bar = tqdm(total=cfg.steps, initial=self.step, disable=not progress, unit="step",
                   desc=f"train {cfg.algorithm}")
        with bar:
            if on_step is not None:
                on_step(self.step)  # where it starts: the line shows before the first update
            while True:
                if self.step in cfg.checkpoint_steps and self.step != self.resumed_at:
                    self.check_window()  # between read-outs: never save a diverged model
                    self.checkpoint(on_checkpoint)
                    self.interval_start = (time.perf_counter(), self.step)
                if self.step >= cfg.steps:
                    return
                self.grow_if_due()
                lr = learning_rate(self.step, peak=cfg.lr, warmup_steps=cfg.warmup_steps,
                                   total_steps=cfg.steps, schedule=cfg.schedule)
                for group in self.ctx.optimizer.param_groups:  # grow replaces it
                    # a group's lr_scale: its peak as a multiple of train.lr (muon's Muon part)
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                metrics = step_fn(self.ctx, self.pipeline.inputs_at(self.step))
                self.step += 1
                self.accumulate(metrics)
                if self.step % cfg.log_every == 0 or self.step == cfg.steps:
                    record = self.flush(lr)
                    bar.set_postfix(loss=f"{record['train/loss']:.4f}", refresh=False)
                bar.update()
                if on_step is not None:
                    on_step(self.step)

    def update_function(self):
        """The algorithm's update (a data-parallel rank has its own)."""
        return STEPS[self.cfg.algorithm]

    def training_interval(self) -> dict:
        """The training since the last checkpoint (or the run's start in this process): wall
        seconds, the device synchronised first, and updates. The checkpoint records it, so a
        measurement's cost can be read against the training it interrupts
        (``time/measure_share``)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start, from_step = self.interval_start
        return {"seconds": time.perf_counter() - start, "updates": self.step - from_step}

    def grow_if_due(self) -> None:
        """grow: the model becomes its function-preserving embedding into the next shape, the
        optimizer state carried over (``flatlm.train.growth``)."""
        target = growth_due(self.cfg, self.model_cfg, self.step)
        if target is not None:
            self.ctx = grow_context(self.ctx, target, step=self.step)
            self.model_cfg = target

    def accumulate(self, metrics: dict[str, torch.Tensor]) -> None:
        for k, v in metrics.items():
            self.window[k] = self.window[k] + v if k in self.window else v.clone()
        self.window_count += 1

    def window_sums(self) -> dict[str, float]:
        """The window's sums as floats (one host sync)."""
        if not self.window:
            return {}
        return dict(zip(self.window, torch.stack(list(self.window.values())).tolist(),
                        strict=True))

    def flush(self, lr: float) -> dict:
        """Appends the window's means to the history and starts a new window."""
        means = {k: v / self.window_count for k, v in self.window_sums().items()}
        record = {"step": self.step, "train/lr": lr, **means}
        self.history.append(record)
        self.window, self.window_count = {}, 0
        if "train/loss" in record:
            self.check_loss(record["train/loss"])
        return record

    def check_window(self) -> None:
        """Checks the loss of the updates since the last read-out, and that the weights and the
        outputs are finite (``non_finite_part``): the loss of an update is taken before it, so
        the update just before a checkpoint can leave non-finite weights, or finite weights
        that overflow the logits, that no loss has shown yet (a few host syncs a checkpoint)."""
        if self.window_count and "train/loss" in self.window:
            self.check_loss(float(self.window["train/loss"]) / self.window_count)
        broken = non_finite_part(self.ctx.model)
        if broken is not None:
            raise Diverged(self.step, float("nan"), f"(the {broken} after the last update are "
                                                     "not finite)")

    def check_loss(self, loss: float) -> None:
        """Raises ``Diverged`` if ``loss`` (at ``self.step``) is non-finite, or above
        ``cfg.divergence_factor`` times the initial loss log V (a uniform guess over the V words:
        a run that diverges before its first read-out has no sane first loss to compare with)
        or times the run's first logged loss."""
        if not math.isfinite(loss):
            raise Diverged(self.step, loss, "is not finite")
        factor = self.cfg.divergence_factor
        if factor is None:
            return
        initial = math.log(max(self.source.V, 2))
        if loss > factor * initial:
            raise Diverged(self.step, loss, f"exceeds train.divergence_factor={factor:g} times "
                                            f"the initial loss log V = {initial:.6g}")
        first = self.history[0].get("train/loss") if self.history else None
        if first is not None and loss > factor * first:
            raise Diverged(self.step, loss, f"exceeds train.divergence_factor={factor:g} times "
                                            f"the first logged loss {first:.6g}")

    def checkpoint(self, on_checkpoint: CheckpointHook | None) -> None:
        """Writes checkpoint ``self.step`` atomically (a directory renamed into place), then
        calls the hook with the model in eval mode and restores the RNG state after it."""
        model, step = self.ctx.model, self.step
        final = checkpoint_dir(self.out_dir, step)
        tmp = final.with_name(final.name + ".tmp")
        rng = self.capture_rng()
        try:
            self.write_checkpoint(tmp, rng)
        except WRITE_ERRORS as e:  # a full disk: torch says "basic_ios::clear", safetensors
            if not tmp.is_symlink():  # raises its own SafetensorError
                shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointWriteError.of(final, e) from e
        refuse_link(final)  # renamed over: a link there would be a planted one
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        try:
            write_train_log(self.out_dir, self.history)
        except OSError as e:  # the checkpoint is whole; only the curve's file is behind
            raise CheckpointWriteError.of(final, e, what="the training log of") from e
        log.info("checkpoint %s", final)
        if on_checkpoint is not None:
            model.eval()
            try:
                on_checkpoint(step, model, final)
            finally:
                model.train()
                restore_rng(rng, self.device)

    def write_checkpoint(self, tmp: Path, rng: dict) -> None:
        """The checkpoint's files in the fresh directory ``tmp`` (a link there is refused)."""
        refuse_link(tmp.parent)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        make_fresh_dir(tmp)
        save_checkpoint(self.ctx.model, tmp, source_spec=self.source.spec,
                        model_cfg=self.model_cfg,
                        extra={"step": self.step, "train": to_dict(self.cfg),
                               "last_log": self.history[-1] if self.history else {},
                               TRAINING_INTERVAL: self.training_interval(),
                               SOURCE_FINGERPRINT: self.fingerprint()})
        save_state(TrainState(step=self.step, data=self.pipeline.state_dict(self.step), rng=rng,
                              optimizer=self.ctx.optimizer.state_dict(),
                              config=to_dict(self.cfg), history=self.history,
                              window={"count": self.window_count,
                                      "sums": self.window_sums()}), tmp)
        write_manifest(tmp)  # last: every file's hash, checked before a resume trusts it

    def fingerprint(self) -> str:
        """The language's fingerprint, which every checkpoint records (hashed once a run)."""
        if not hasattr(self, "_fingerprint"):
            self._fingerprint = self.source.fingerprint()
        return self._fingerprint

    def capture_rng(self) -> dict:
        """The RNG state a checkpoint stores (a data-parallel run adds every rank's)."""
        return capture_rng(self.device)


def autocast_for(cfg: TrainConfig, device: torch.device):
    """A factory of autocast contexts: bf16 when asked for (or "auto" on CUDA), else none."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")

    def context():
        if not bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    return context
