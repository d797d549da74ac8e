r"""Tr(F), the trace of the model's Fisher at masked words: the flatness of the paper's B.1.

.. math::
    \mathrm{Tr}(F) = E_{x_{-t}} E_{c \sim p_\theta(\cdot|x_{-t})}
                     \|\nabla_\theta \log p_\theta(c | x_{-t})\|^2
                   = E_{x_{-t}} \mathrm{Tr}(J^T (\mathrm{diag}\, p - p p^T) J)

with p = p_theta(. | x_{-t}) the softmax over the V words and J = dz/dtheta the Jacobian of the
word logits z. x_{-t} is a sentence from the source with one uniformly random word masked (every
sentence weighs the same; t is uniform over its words). By Lemma 3.2 this is the trace of the
Hessian of the pre-training loss at a minimiser whose predictions are the true conditionals.

Per input, ||J^T u||^2 is unbiased for Tr(J^T (diag p - p p^T) J) for any random direction u in
logit space with E[u u^T] = diag p - p p^T:

- ``"sampled"`` (the paper; default): u = e_c - p with c ~ p, so J^T u = grad log p(c | x_{-t});
- ``"probe"``: u = sqrt(p) * xi - p <sqrt(p), xi>, xi Rademacher. Then
  u = (I - p 1^T) diag(sqrt p) xi and E[u u^T] = (I - p 1^T) diag(p) (I - 1 p^T) = diag p - p p^T.
  It never lands on a rare label with a huge gradient, so its variance per input is lower on tiny
  models; on a trained BERT its values across inputs were the more heavy-tailed (kurtosis 778 vs
  376 for one sampled label), which makes its standard error less trustworthy.

The per-input value averages ``cfg.labels_per_input`` directions (default 8), which thins the tail
that a variance-based standard error misses (``curvature.grouped_mean_se``).

||J^T u_i||^2 for every input i of a batch comes from one forward and one backward of
sum_i <u_i, z_i> (``measure.ghost``) for BERT, post- or pre-LN, and through an unrolled BiLSTM
(``method="lstm-ghost"``, ``measure.lstm_ghost``); ``method="vmap"`` is ``torch.func.vmap(grad)``
over the unrolled BiLSTM (``measure.per_example``; on a CPU no faster than the loop, measured);
``method="loop"`` is the per-example backward loop they replace (the reference in tests and
benchmarks), and the fallback for any other model. ``method="auto"`` takes the model's
architecture's ``fisher_method`` (``flatlm.models.architectures``; "loop" for a model from
elsewhere).

>>> import torch
>>> from flatlm.models import build_model, parse_model
>>> model = build_model(parse_model("d16-h2-l1-i32"), vocab_size=6, max_length=4, seed=0)
>>> tokens, lengths = torch.tensor([[0, 1, 2, 3], [5, 4, -1, -1]] * 8), torch.tensor([4, 2] * 8)
>>> cfg = FlatnessConfig(n_inputs=16, batch_size=8, seed=0)
>>> fast = trace_fisher(model, tokens, lengths, cfg, per_example=True)
>>> slow = trace_fisher(model, tokens, lengths, cfg, per_example=True, method="loop")
>>> torch.allclose(fast["per_example"], slow["per_example"], rtol=1e-4)
True
"""

from __future__ import annotations

import torch
from torch import nn

from flatlm.measure.curvature import ghost, lstm_ghost, per_example
from flatlm.measure.curvature.common import (
    FlatnessConfig,
    MaskedInputs,
    eval_mode,
    grouped_mean_se,
    masked_inputs,
    model_device_dtype,
    selected_parameters,
)
from flatlm.measure.precision import computing_in
from flatlm.models.masked_lm import find_architecture, word_logits


def output_directions(
    logits: torch.Tensor, k: int, estimator: str, generator: torch.Generator
) -> torch.Tensor:
    """k random directions per row of ``logits`` (B, V) -> (k, B, V), E[u u^T] = diag p - p p^T.

    >>> g = torch.Generator().manual_seed(0)
    >>> u = output_directions(torch.zeros(2, 4, dtype=torch.float64), 3, "sampled", g)
    >>> u.shape, bool(u.sum(-1).abs().max() < 1e-12)
    (torch.Size([3, 2, 4]), True)
    """
    p = logits.detach().to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)  # (B, V)
    B, V = p.shape
    if estimator == "sampled":
        c = torch.multinomial(p, k, replacement=True, generator=generator).T  # (k, B)
        return nn.functional.one_hot(c, V).to(p.dtype) - p  # (k, B, V)
    if estimator == "probe":
        xi = torch.randint(0, 2, (k, B, V), generator=generator, device=p.device).to(p.dtype)
        s_xi = p.sqrt() * (2 * xi - 1)  # (k, B, V)
        return s_xi - p * s_xi.sum(-1, keepdim=True)
    raise ValueError(f"estimator={estimator!r}: use 'probe' or 'sampled'")


def _ghost_values(model, params, x: MaskedInputs, cfg: FlatnessConfig, g) -> torch.Tensor:
    """(k, B) squared norms ||J^T u||^2 from one forward and k backward passes."""
    with ghost.GhostNorms(model, params) as gn:
        logits = ghost.word_logits_b(model, x.input_ids, x.attention_mask, x.positions)  # (B, V)
        u = output_directions(logits, cfg.labels_per_input, cfg.estimator, g).to(logits.dtype)
        out = []
        for j in range(len(u)):
            gn.backward((u[j] * logits).sum(), retain_graph=j < len(u) - 1)
            out.append(gn.pop())
    return torch.stack(out)


def _directions(model, x: MaskedInputs, cfg: FlatnessConfig, g) -> torch.Tensor:
    """(k, B, V) ``output_directions`` at the model's logits of ``x``, in their dtype, from a
    forward without a graph (the methods that use it differentiate their own passes)."""
    with torch.no_grad():
        logits = word_logits(model, x.input_ids, x.attention_mask, x.positions)  # (B, V)
    return output_directions(logits, cfg.labels_per_input, cfg.estimator, g).to(logits.dtype)


def _vmap_values(model, params, x: MaskedInputs, cfg: FlatnessConfig, g) -> torch.Tensor:
    """The same (k, B) by ``vmap(grad)`` over an unrolled BiLSTM (``measure.per_example``)."""
    u = _directions(model, x, cfg, g)
    return per_example.per_example_sq_norms(model, params, x.input_ids, x.attention_mask,
                                            x.positions, u)


def _lstm_ghost_values(model, params, x: MaskedInputs, cfg: FlatnessConfig, g) -> torch.Tensor:
    """The same (k, B) for a BiLSTM from one batched backward per direction
    (``measure.lstm_ghost``)."""
    u = _directions(model, x, cfg, g)
    return lstm_ghost.per_example_sq_norms(model, params, x.input_ids, x.attention_mask,
                                           x.positions, u)


def _loop_values(model, params, x: MaskedInputs, cfg: FlatnessConfig, g) -> torch.Tensor:
    """The same (k, B) by one forward and backward per example and direction."""
    u = _directions(model, x, cfg, g)
    plist = list(params.values())
    out = torch.zeros(u.shape[:2], dtype=torch.float64, device=u.device)
    for i in range(len(x)):
        z = word_logits(model, x.input_ids[i : i + 1], x.attention_mask[i : i + 1],
                        x.positions[i : i + 1])[0]  # (V,)
        for j in range(len(u)):
            grads = torch.autograd.grad(z @ u[j, i], plist, retain_graph=j < len(u) - 1,
                                        allow_unused=True)
            out[j, i] = sum(gr.double().square().sum() for gr in grads if gr is not None)
    return out


# (k, B) squared norms by method; an Architecture's fisher_method names one
_VALUES = {"ghost": _ghost_values, "lstm-ghost": _lstm_ghost_values, "vmap": _vmap_values,
           "loop": _loop_values}
METHODS = ("auto", *_VALUES)


def auto_method(model: nn.Module) -> str:
    """The method of ``method="auto"``: the architecture's ``fisher_method``, else "loop"."""
    arch = find_architecture(model)
    method = arch.fisher_method if arch is not None else "loop"
    if method not in _VALUES:
        raise ValueError(f"architecture {arch.name!r}: fisher_method={method!r} is none of "
                         f"{tuple(_VALUES)}")
    return method


def per_input_values(
    model: nn.Module, x: MaskedInputs, cfg: FlatnessConfig, *, device=None, method: str = "auto"
) -> torch.Tensor:
    """(n,) float64: per masked input, the mean over ``cfg.labels_per_input`` directions of
    ||J^T u||^2; each is unbiased for Tr(J^T (diag p - p p^T) J) at that input. Inputs are
    batched by length (``MaskedInputs.sorted_batches``); values come back in input order."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: use one of {METHODS}")
    if method == "auto":
        method = auto_method(model)
    device = device or model_device_dtype(model)[0]
    params = selected_parameters(model, cfg.exclude)
    g = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    values = torch.zeros(len(x), dtype=torch.float64)
    fn = _VALUES[method]
    rows_done, parts = [], []  # kept on the device: one transfer after the last batch
    with eval_mode(model), computing_in(cfg.fisher_precision, device):
        for rows, batch in x.sorted_batches(cfg.batch_size, device):
            rows_done.append(rows)
            parts.append(fn(model, params, batch, cfg, g).double().mean(0))
    if parts:
        values[torch.cat(rows_done)] = torch.cat(parts).cpu()
    return values


def trace_fisher(
    model: nn.Module,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: FlatnessConfig,
    *,
    device: str | torch.device | None = None,
    per_example: bool = False,
    method: str = "auto",
) -> dict:
    """Estimate Tr(F) over the first ``cfg.n_inputs`` sentences, one masked word each.

    ``device``: where to compute (default: the model's; the model must already be there).
    ``method``: "ghost" (one batched backward; BERT, either ln_mode), "lstm-ghost" (the same for a
    BiLSTM), "vmap" (BiLSTM), "loop" (per-example backward; any model), or "auto" (the first of
    these the model supports).
    Returns ``{"mean", "se", "n", "n_params"}`` and, with ``per_example``, the (n,) per-input
    values (each the mean over ``cfg.labels_per_input`` directions). ``se`` is the standard error
    of the mean of these i.i.d. values, or batch means over ``cfg.se_groups`` groups
    (``curvature.grouped_mean_se``).
    """
    x = masked_inputs(tokens, lengths, cfg.seed, n=cfg.n_inputs)
    values = per_input_values(model, x, cfg, device=device, method=method)
    mean, se = grouped_mean_se(values, cfg.se_groups)
    n_params = sum(p.numel() for p in selected_parameters(model, cfg.exclude).values())
    out = {"mean": mean, "se": se, "n": len(values), "n_params": n_params}
    if per_example:
        out["per_example"] = values
    return out
