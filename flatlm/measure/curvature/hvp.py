r"""Curvature-vector products of the masked-LM loss over fixed masked inputs: H v and F v.

.. math::
    L_q(\theta) = \frac{1}{n} \sum_i \sum_c q_i(c) (-\log p_\theta(c | x^{(i)}_{-t})), \qquad
    H = \nabla^2 L_q = F + \frac{1}{n} \sum_i \sum_k (p_{ik} - q_{ik}) \nabla^2 z_{ik}

``CurvatureOperator`` applies H (labels q, e.g. the source's true conditionals: the Hessian of the
population loss that ``flat/trace_hessian`` traces) or the Fisher F (``fisher=True``: q = p_theta
held fixed, which zeroes the residual exactly, Lemma 3.2, so the same double backward gives F v)
to a flat vector over the selected parameters, batch by batch (``per_batch``: the batch sums, the
i.i.d. units of every standard error here). Double backward needs eager attention and the
unrolled BiLSTM, as in ``measure.hessian_trace``.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from flatlm.measure.curvature.common import MaskedInputs, eval_mode
from flatlm.measure.curvature.hessian_trace import (
    eager_attention,
    hessian_vector,
    second_order_logits,
)


def flatten(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(vec: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    return [piece.view_as(p) for piece, p in zip(vec.split([p.numel() for p in like]), like,
                                                 strict=True)]


class CurvatureOperator:
    """v -> H v (or F v) over ``x``, the mean over its inputs, in batches of ``batch_size``.

    ``labels`` (n, V): the label distribution at each input (rows sum to 1); ignored with
    ``fisher``. Use inside ``with op.ready():`` (eval mode, eager attention)."""

    def __init__(self, model: nn.Module, params: list[nn.Parameter], x: MaskedInputs,
                 labels: torch.Tensor | None, batch_size: int, device, *, fisher: bool = False):
        if not fisher and (labels is None or labels.shape[0] != len(x)):
            got = None if labels is None else labels.shape[0]
            raise ValueError(f"labels: need one row per input ({len(x)}), got {got}")
        self.model, self.params, self.x = model, params, x
        self.labels, self.batch_size, self.device, self.fisher = labels, batch_size, device, fisher
        self.n_params = sum(p.numel() for p in params)
        self.dtype = params[0].dtype

    @contextlib.contextmanager
    def ready(self):
        with eval_mode(self.model), eager_attention(self.model):
            yield self

    def spans(self, start: int = 0, stop: int | None = None):
        """(start, stop) of the batches covering inputs start..stop."""
        stop = len(self.x) if stop is None else stop
        for i in range(start, stop, self.batch_size):
            yield i, min(i + self.batch_size, stop)

    def batch_grads(self, start: int, stop: int) -> list[torch.Tensor]:
        """The gradient of the batch's summed loss, with its graph (for products)."""
        batch = self.x.batch(start, stop, self.device)
        z = second_order_logits(self.model)(self.model, batch.input_ids, batch.attention_mask,
                                  batch.positions)  # (B, V)
        log_p = z.log_softmax(-1)
        q = log_p.detach().exp() if self.fisher else self.labels[start:stop].to(self.device,
                                                                                  z.dtype)
        return list(torch.autograd.grad(-(q * log_p).sum(), self.params, create_graph=True))

    def product(self, grads: list[torch.Tensor], vec: torch.Tensor) -> torch.Tensor:
        """(sum over the batch of H_i) vec, flat, from ``batch_grads``'s gradient."""
        hv = hessian_vector(grads, unflatten(vec.to(self.dtype), self.params), self.params)
        return flatten([torch.zeros_like(p) if h is None else h
                        for h, p in zip(hv, self.params, strict=True)])

    def matvec(self, vec: torch.Tensor, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """The mean curvature over inputs start..stop applied to ``vec`` (flat)."""
        stop = len(self.x) if stop is None else stop
        out = torch.zeros_like(vec)
        for a, b in self.spans(start, stop):
            out += self.product(self.batch_grads(a, b), vec).to(vec.dtype)
        return out / (stop - start)

    def per_batch_quadratic(self, vec: torch.Tensor) -> tuple[list[float], list[int]]:
        """(vec^T H_b vec per batch b, summed over its inputs; the batch sizes)."""
        values, counts = [], []
        for a, b in self.spans():
            values.append(float(self.product(self.batch_grads(a, b), vec).double()
                                @ vec.double()))
            counts.append(b - a)
        return values, counts
