"""Growth as a training algorithm (``algorithm="grow"``): AdamW whose BERT grows mid-run.

After ``train.grow.steps[j]`` updates (at the top of the next update, after any checkpoint of
that step was written) the model is replaced by its function-preserving embedding into the shape
``train.grow.to[j]`` (``flatlm.models.growth.grow``, paper B.4) by ``train.grow.construction``,
default "head-norm": width by replication, depth by blocks whose attention-output and MLP-output
projections are zero (and, post-LN, LayerNorms reset so that the stack stays exact; see
growth.py). Not the "paper" construction that ``measure.growth_construction`` defaults to: its
all-zero added blocks would never train (with zero query, key, value and up-projection the
gradients of the zero output projections stay zero, and only the output biases move).
Progressive stacking by copying layers (Gong et al., 2019) changes the function and is not what
this does: the logits, and so the loss on every batch, are unchanged at the growth (to float
rounding; exact in exact arithmetic for width, to a relative 1e-12 for post-LN depth). The
parameters "head-norm" leaves free (query, key, value, MLP up-projection of added blocks) are
initialised from ``(seed, "grow", step)``.

Optimizer state (``carry_state``): a grown parameter that equals ``c`` times its same-named
parameter of the small model tiled along each dimension (``c = 1/k``, k a positive integer:
embeddings, LayerNorms and Linears under replication, with c = 1, 1/f_in or 1/m; any parameter
growth copies unchanged, c = 1) gets that parameter's state moved by the same map: first moments
(``exp_avg``) tiled times c, second moments (``exp_avg_sq``) tiled times c**2, the step count
kept, so that Adam's direction m / sqrt(v) starts as the small parameter's, entry for entry.
Every other parameter (the blocks added, the post-LN LayerNorm reset to (1, 0) below them)
starts with a fresh state: zero moments and its own step count from 0 (its bias correction
restarts). The learning-rate schedule continues: it is a function of the step alone.

A checkpoint at step t holds the shape after the growths at steps < t (``shape_at``); resuming
from one before or after a growth continues bit for bit on the CPU, since the growth is a pure
function of the model, the step and the seed.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from flatlm.core.seeds import derive_seed
from flatlm.models.growth import grow, growth
from flatlm.models.presets import ModelConfig, parse_model, shape_string
from flatlm.train.algorithms import StepContext, build_optimizer
from flatlm.train.config import TrainConfig
from flatlm.train.registry import algorithm_named

_SCALE_TOLERANCE = 1e-6  # relative: c * tile(src) is computed in another order than grow's


def grows(cfg: TrainConfig) -> bool:
    """Whether the run's algorithm grows its model: it reads ``train.grow`` (its section)."""
    return algorithm_named(cfg.algorithm).section == "grow"


def check_schedule(cfg: TrainConfig, model_cfg: ModelConfig) -> list[ModelConfig]:
    """The shapes of ``train.grow.to`` as ``ModelConfig``s, each checked to be a growth of the one
    before it (the first: ``model_cfg``), with its dropout, attention and LayerNorm placement
    (an unsuffixed shape takes the model's ``ln_mode``). Empty unless the algorithm grows."""
    if not grows(cfg):
        return []
    shapes, current = [], model_cfg
    for j in range(len(cfg.grow.to)):
        current = _next_shape(cfg, j, current)
        shapes.append(current)
    return shapes


def _next_shape(cfg: TrainConfig, j: int, current: ModelConfig) -> ModelConfig:
    """``train.grow.to[j]`` as a growth of ``current``; a ValueError names the field."""
    shape = cfg.grow.to[j]
    where = f"train.grow.to[{j}]={shape!r}"
    try:
        target = parse_model(shape)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if target.ln_mode == "post":
        target = dataclasses.replace(target, ln_mode=current.ln_mode)
    target = dataclasses.replace(target, dropout=current.dropout, attention=current.attention)
    try:
        growth(current, target)
    except ValueError as e:
        raise ValueError(f"{where} is not a growth of {shape_string(current)} (the shape "
                         f"before it): {e}") from None
    return target


def shape_at(cfg: TrainConfig, model_cfg: ModelConfig, step: int) -> ModelConfig:
    """The shape in a checkpoint after ``step`` updates of a run that began as ``model_cfg``:
    after the growths at steps before ``step`` (a growth at ``step`` follows that checkpoint)."""
    shapes = check_schedule(cfg, model_cfg)
    done = [shape for s, shape in zip(cfg.grow.steps, shapes, strict=True) if s < step]
    return done[-1] if done else model_cfg


def growth_due(cfg: TrainConfig, current: ModelConfig, step: int) -> ModelConfig | None:
    """The shape to grow ``current`` into before update ``step + 1``, or None."""
    steps = cfg.grow.steps if grows(cfg) else ()
    if step not in steps:
        return None
    return _next_shape(cfg, steps.index(step), current)


def grow_context(ctx: StepContext, target: ModelConfig, *, step: int) -> StepContext:
    """``ctx`` with its model grown into ``target`` and a new optimizer over the grown model
    carrying the old one's state (``carry_state``); the model's device, dtype and mode kept."""
    big = grow(ctx.model, target, seed=derive_seed(ctx.cfg.seed, "grow", step),
               construction=ctx.cfg.grow.construction)
    device = next(big.parameters()).device
    optimizer = build_optimizer(ctx.cfg, big, fused=device.type == "cuda")
    carry_state(ctx.model, big, ctx.optimizer, optimizer)
    return dataclasses.replace(ctx, model=big, optimizer=optimizer)


@torch.no_grad()
def replication_scale(src: torch.Tensor, dst: torch.Tensor) -> float | None:
    """c = 1/k if ``dst`` equals c times ``src`` tiled to ``dst``'s shape (to float rounding),
    else None."""
    if src.dim() != dst.dim() or any(b % a for a, b in zip(src.shape, dst.shape, strict=True)):
        return None
    tiled = src.repeat([b // a for a, b in zip(src.shape, dst.shape, strict=True)]).double()
    target = dst.double()
    norm = float((tiled * tiled).sum())
    if norm == 0.0:
        return 1.0 if not target.any() else None
    c = float((target * tiled).sum()) / norm
    k = round(1.0 / c) if c > 0 else 0
    if k < 1:  # growth never scales a parameter up, nor flips its sign
        return None
    c = 1.0 / k
    error = float((target - c * tiled).abs().max())
    return c if error <= _SCALE_TOLERANCE * c * float(tiled.abs().max()) else None


@torch.no_grad()
def carry_state(small: nn.Module, big: nn.Module, old: torch.optim.Optimizer,
                new: torch.optim.Optimizer) -> None:
    """Moves ``old``'s per-parameter state of ``small`` into ``new`` (over ``big``) by the
    module docstring's rule: replicated parameters get tiled, rescaled moments; others none."""
    sources = dict(small.named_parameters())
    for name, param in big.named_parameters():
        src = sources.get(name)
        state = old.state.get(src) if src is not None else None
        if not state:
            continue
        c = replication_scale(src, param)
        if c is None:
            continue
        reps = [b // a for a, b in zip(src.shape, param.shape, strict=True)]
        new.state[param] = {key: _moved(value, src, reps, c ** (2 if key.endswith("_sq") else 1))
                            for key, value in state.items()}


def _moved(value, src: torch.Tensor, reps: list[int], scale: float):
    """A state entry for the grown parameter: a per-entry tensor tiled and scaled, else a copy
    (the step count)."""
    if isinstance(value, torch.Tensor) and value.shape == src.shape and src.dim() > 0:
        return value.repeat(reps) * scale if scale != 1.0 else value.repeat(reps)
    return value.clone() if isinstance(value, torch.Tensor) else value
