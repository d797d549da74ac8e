r"""Tr(H) per parameter block: where in the network the curvature of the population loss sits.

For a Rademacher v split by blocks, v = (v_1, ..., v_B), v_b^T (H v)_b is unbiased for
Tr(H_bb), the trace of the diagonal block (the cross terms v_b^T H_bc v_c, b != c, have mean
zero), and the blocks' values add up to v^T H v exactly. With ``FlatnessConfig``'s inputs, seed and
batches the vectors are those of ``hessian_trace.trace_hessian``, so the blocks split the
``flat/trace_hessian`` of the same config exactly (to rounding). Each block's standard error is
over the Hutchinson batches, as Tr(H)'s.

Blocks (``block_of``): ``embeddings`` (word, position, token-type embeddings and their LayerNorm;
the word embedding includes the tied MLM decoder weight), ``layer<i>`` (encoder layer i; for the
BiLSTM both directions of LSTM layer i), ``head`` (everything above the last layer: the MLM head,
the pre-LN encoder's final LayerNorm, the BiLSTM's projection and norm). Excluded parameters
(``FlatnessConfig.exclude``) are in no block.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from flatlm.measure import block_key, se_key
from flatlm.measure.curvature.common import (
    FlatnessConfig,
    grouped_mean_se,
    masked_inputs,
    model_device_dtype,
    selected_parameters,
)
from flatlm.measure.curvature.hessian_trace import rademacher_like
from flatlm.measure.curvature.hvp import CurvatureOperator, flatten

_LAYER = re.compile(r"(?:\.layer\.(\d+)\.|^lstm\.\w+_l(\d+)(?:_reverse)?$)")


def block_of(name: str) -> str:
    """The block of a parameter name.

    >>> [block_of(n) for n in ("bert.embeddings.LayerNorm.weight", "embed.weight",
    ...  "bert.encoder.layer.1.output.dense.bias", "lstm.weight_hh_l0_reverse", "lm_head.bias")]
    ['embeddings', 'embeddings', 'layer1', 'layer0', 'head']
    """
    match = _LAYER.search(name)
    if match:
        return f"layer{match.group(1) or match.group(2)}"
    if ".embeddings." in name or name.startswith(("embeddings.", "embed.")):
        return "embeddings"
    return "head"


def block_order(blocks) -> list[str]:
    def rank(b: str):
        return (0, 0) if b == "embeddings" else (2, 0) if b == "head" else (1, int(b[5:]))
    return sorted(set(blocks), key=rank)


def block_traces(
    model: nn.Module, tokens: torch.Tensor, lengths: torch.Tensor, cfg: FlatnessConfig,
    soft_labels: torch.Tensor, *, positions: torch.Tensor | None = None, device=None,
) -> dict[str, dict]:
    """block -> ``{"mean", "se"}`` of Tr(H_bb), H the Hessian of the loss with ``soft_labels``
    (n, V) at the masked words of ``masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs)``
    (or at ``positions``, as ``trace_hessian``); and ``"total"``, their sum (Hutchinson's Tr(H)
    with the same vectors)."""
    device = device or model_device_dtype(model)[0]
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs, positions=positions)
    named = selected_parameters(model, cfg.exclude)
    params = list(named.values())
    names = block_order(block_of(n) for n in named)
    index = torch.tensor([names.index(block_of(n)) for n in named], device=device)
    op = CurvatureOperator(model, params, x, soft_labels, cfg.hutchinson_batch_size, device)
    g = torch.Generator(device=device).manual_seed(cfg.seed + 2)  # trace_hessian's vectors
    rows, counts = [], []
    with op.ready():
        for a, b in op.spans():
            grads = op.batch_grads(a, b)
            per_block = torch.zeros(len(names), dtype=torch.float64, device=device)
            for _ in range(cfg.hutchinson_probes):
                v = rademacher_like(params, g)
                hv = op.product(grads, flatten(v)).split([p.numel() for p in params])
                per_param = torch.stack([(h * vi.reshape(-1)).sum().double()
                                         for h, vi in zip(hv, v, strict=True)])
                per_block.index_add_(0, index, per_param)
            rows.append(per_block.cpu() / cfg.hutchinson_probes)
            counts.append(b - a)
    table = torch.stack(rows)  # (n_batches, n_blocks)
    out = {}
    for j, name in enumerate([*names, "total"]):
        column = table.sum(1) if name == "total" else table[:, j]
        mean, se = grouped_mean_se(column, cfg.se_groups, counts=counts)
        out[name] = {"mean": mean, "se": se}
    return out


def block_metrics(traces: dict[str, dict]) -> dict[str, float]:
    """``flat/blocks/<block>/trace_hessian`` (+ ``_se``) for every block (not the total)."""
    out = {}
    for name, est in traces.items():
        if name != "total":
            out[block_key(name)], out[se_key(block_key(name))] = est["mean"], est["se"]
    return out
