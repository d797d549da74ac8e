"""Flatness across model sizes (paper Fig. 5, B.3-B.4): Tr(F) and Tr(H) in one common shape.

A trace over parameters depends on the parameterisation, not only on the function: growing a
d128 BERT to d256 with ``flatlm.models.growth.grow`` keeps its logits (to float rounding) but
changes Tr(F), since replication rescales weights (``W' = tile(W) / m``) and adds parameters.
Comparing the native traces of models of different sizes therefore compares parameterisations.
B.3 instead views every model as a point of one large architecture, the smallest that each of
them grows into (``lcm_shape``: Table 4's widths have least common multiple 1920), and compares
the traces there.

Which point of the large architecture a model becomes is the growth construction
(``flatlm.models.constructions.CONSTRUCTIONS``; ``measure.growth_construction``, default "paper":
B.4.2 and the released ``enlarge.py`` divide the input embeddings by m; "head-norm" divides the MLM
head's LayerNorm instead). Both keep the function; the trace is not kept: the tiny scale's three
models (1500 steps) grown to d64-h4-l2-i256 have Tr(F) 264 / 132 / 90 by the paper's and 44 / 48 /
90 by "head-norm" (``bench/growth_constructions.py``): the largest is the flattest by one, the
sharpest by the other. A Fig. 5 verdict depends on it: measure both (``measure.growth_compare``).

``grown_model`` grows a checkpoint's model into that shape and ``grown_flatness`` measures it
with the estimators of ``measure.flatness`` on the same inputs and seeds, under the keys
``grown_key(key)``:
``flat/trace_fisher_grown`` and, with ``hessian=True``, ``flat/trace_hessian_grown`` and
``flat/hessian_fisher_gap_grown`` (each with its ``_se``); given a ``construction`` its
name follows (``flat/trace_fisher_grown_head_norm``). Under "head-norm" the
parameters the growth leaves free (query, key, value and MLP up-projection of added blocks) are
drawn from ``seed``; they reach the traces through the zeroed output projections of added blocks,
so fix ``seed`` across a sweep ("paper" sets them to zero).

>>> from flatlm.models import TABLE4, shape_string
>>> shape_string(lcm_shape(TABLE4))
'd1920-h30-l20-i7680'
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import torch
from torch import nn

from flatlm.measure import TRACE_FISHER, grown_key, se_key
from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.models.architectures import architecture, can_grow, labels_where
from flatlm.models.constructions import DEFAULT_CONSTRUCTION
from flatlm.models.masked_lm import ln_mode_of
from flatlm.models.presets import ModelConfig, parse_model
from flatlm.sources.base import Source


def lcm_shape(shapes: Iterable[str | ModelConfig]) -> ModelConfig:
    """The smallest BERT shape every one of ``shapes`` grows into (``growth.grow``, Table 4):
    d_model and d_inter the least common multiples, n_layers the largest, and the common head
    size d_model / n_heads. A ValueError names the shape that does not fit."""
    cfgs = [parse_model(s) for s in shapes]
    if not cfgs:
        raise ValueError("measure.grow_to: give at least one model shape")
    for cfg in cfgs:
        if not can_grow(cfg):
            raise ValueError(f"model {cfg}: only {_growers()}s can grow (B.4); measure.grow_to "
                             f"needs every model of the sweep to be a {_growers()}")
    ln_modes = {c.ln_mode for c in cfgs}
    if len(ln_modes) > 1:
        raise ValueError("the models mix pre-LN and post-LN encoders (model.ln_mode): growth "
                         "keeps the encoder, so give them one ln_mode")
    head = {c.d_model // c.n_heads for c in cfgs}
    if len(head) > 1:
        raise ValueError(f"head sizes {sorted(head)} differ: growth keeps the head size "
                         "(d_model / n_heads), so the shapes have no common grown shape")
    d_model = math.lcm(*(c.d_model for c in cfgs))
    return ModelConfig(arch="bert", d_model=d_model, n_heads=d_model // head.pop(),
                       n_layers=max(c.n_layers for c in cfgs),
                       d_inter=math.lcm(*(c.d_inter for c in cfgs)), dropout=0.0,
                       ln_mode=ln_modes.pop())


def check_grow_to(target: str | ModelConfig) -> ModelConfig:
    """``measure.grow_to`` as a ``ModelConfig`` (dropout 0); a ValueError names the field."""
    try:
        cfg = parse_model(target)
    except ValueError as err:
        raise ValueError(f"measure.grow_to={target!r}: {err}") from err
    if not can_grow(cfg):
        raise ValueError(f"measure.grow_to={target!r}: only {_growers()} shapes (B.4); use "
                         "e.g. 'd256-h4-l4-i1024'")
    return dataclasses.replace(cfg, dropout=0.0)


def _growers() -> str:
    return labels_where(can_grow)


def grown_model(model: nn.Module, target: str | ModelConfig, *, seed: int = 0,
                construction: str = DEFAULT_CONSTRUCTION) -> nn.Module:
    """``model`` grown into the shape ``target`` (a preset or shape string) by ``construction``,
    dropout 0, with the model's own LayerNorm placement (growth keeps it; a sweep may vary
    ``ln_mode`` with one ``grow_to``). A ValueError names ``measure.grow_to`` when ``model``
    cannot grow into it."""
    cfg = dataclasses.replace(check_grow_to(target), ln_mode=ln_mode_of(model))
    try:
        return architecture(cfg).grow(model, cfg, seed=seed, construction=construction)
    except ValueError as err:
        raise ValueError(f"measure.grow_to={target!r}: {err}. Use a shape every model of the "
                         "sweep grows into, e.g. shape_string(lcm_shape(shapes))") from err


def grown_flatness(
    big: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: FlatnessConfig,
    device: str | torch.device | None = None,
    *,
    hessian: bool = False,
    construction: str | None = None,
) -> dict[str, float]:
    """Tr(F) (and with ``hessian`` Tr(H) and the gap) of ``big``, a model ``grown_model`` grew,
    on the inputs and seeds ``measure_flatness`` would use, under ``grown_key`` keys (with
    ``construction``, its name in them: a compared construction's)."""
    from flatlm.measure.curvature.fisher import trace_fisher
    from flatlm.measure.curvature.flatness import measure_flatness

    big = big.eval()
    if hessian:
        out = measure_flatness(big, source, tokens, lengths, cfg, device)
    else:
        fisher = trace_fisher(big, tokens, lengths, cfg, device=device)
        out = {TRACE_FISHER: fisher["mean"], se_key(TRACE_FISHER): fisher["se"]}
    return {_grown(k, construction): v for k, v in out.items()}


def _grown(key: str, construction: str | None) -> str:
    """``flat/trace_fisher_se`` -> ``flat/trace_fisher_grown_se``."""
    if key.endswith("_se"):
        return se_key(grown_key(key[:-3], construction))
    return grown_key(key, construction)
