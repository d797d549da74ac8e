"""What the flatness estimators (``fisher.py``, ``hessian_trace.py``) share: their config, the
masked inputs x_{-t}, which parameters count, and the standard error.

- ``FlatnessConfig``: budget, estimator, excluded parameters, seed.
- ``masked_inputs(tokens, lengths, seed)``: one uniformly random masked word per sentence.
- ``selected_parameters(model, exclude)``: the parameters whose curvature counts, each once.
- ``grouped_mean_se(values, n_groups)``: mean and standard error of per-input values.

>>> cfg = FlatnessConfig(n_inputs=100, batch_size=50)
>>> cfg.estimator, cfg.labels_per_input, cfg.exclude
('sampled', 8, ('*pooler*', 'cls.predictions.bias', 'lm_head.bias', 'bias'))
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from flatlm.core.stats import ratio_mean_se
from flatlm.core.tokens import encode, mask_positions, uniform_positions
from flatlm.measure.precision import check_precision
from flatlm.sources.base import as_tokens

ESTIMATORS = ("probe", "sampled")
HESSIAN_PRECISIONS = ("fp32", "tf32")  # flatness.hessian_precision (measure.precision)
# B.1: "we sample 10000 x_{-t} and sample 50 x_t for each x_{-t}" (labels per input)
B1_LABELS_PER_INPUT = 50


@dataclass(frozen=True, kw_only=True)
class FlatnessConfig:
    """Budget and options of the flatness estimators (Tr(F), Tr(H)); see ``measure.flatness``."""

    # masked inputs x_{-t}: the first n_inputs sentences given (all if fewer), one masked word
    # each; None = all (a trial's: its measure.n_eval validation sentences).
    # Relative s.e. of Tr(F) is about 1.6 / sqrt(n_inputs) with the defaults on a partly trained
    # bert-2m (paper PCFG): 2.5% needs ~4,000 inputs (bench/flatness_se.py).
    n_inputs: int | None = None
    # output directions (labels c, or probes) per input, from one forward and this many backward
    # passes; the per-input value is their mean. Per-input values are heavy-tailed across inputs,
    # and a variance-based s.e. understates when the sample misses the rare large ones; averaging
    # labels cuts the tail: kurtosis 376 (1 label) -> 97 (8) on that bert-2m, 778 for 1 probe.
    # The paper's B.1 used 10^4 inputs x 50 labels.
    labels_per_input: int = 8
    # "sampled": c ~ p_theta, the paper's B.1; "probe": output-space Rademacher probe
    # u = sqrt(p) xi - p <sqrt(p), xi>, E[u u^T] = diag(p) - p p^T. Both unbiased for Tr(F); the
    # probe has a lower variance on tiny models but heavier tails on trained ones.
    estimator: str = "sampled"
    # Rademacher vectors in parameter space per batch of trace_hessian (one double backward each)
    hutchinson_probes: int = 1
    # inputs per forward pass of trace_fisher; 64..1024 on a GPU
    batch_size: int = 256
    # inputs per Hutchinson batch (one forward, 1 + hutchinson_probes backward passes, two of
    # them with a graph). Its probe noise, 2 ||H_batch / B||_F^2, does not shrink with the batch
    # size, so many small batches beat few large ones until per-pass overhead dominates.
    hutchinson_batch_size: int = 32
    # fnmatch patterns on parameter names; a parameter is left out if any of its names matches
    # (tied and aliased parameters have several). Default: the paper's, which leaves out the
    # pooler and the MLM output bias (BERT "cls.predictions.bias" = "...decoder.bias"; pre-LN
    # "lm_head.bias" = "lm_head.decoder.bias"; the LSTM's top-level "bias").
    exclude: tuple[str, ...] = ("*pooler*", "cls.predictions.bias", "lm_head.bias", "bias")
    # None: the standard error treats every input (Hutchinson: every batch) as its own i.i.d. unit,
    # which they are; an integer >= 2: batch means over that many groups. See ``grouped_mean_se``.
    se_groups: int | None = None
    # seeds the masked positions, the labels / probes and the Hutchinson vectors
    seed: int = 0
    # Hutchinson vectors whose Hessian-vector products run as one batched second backward
    # (autograd's is_grads_batched, vmap over the vectors); 1..hutchinson_probes. 1 (default):
    # one product per vector, the released order of summation; more draws the same vectors but
    # sums each product in another order (equal to 1e-5 relative, tests/measure/
    # test_hutchinson_stack.py), for fewer launches on a GPU
    hutchinson_stack: int = 1
    # arithmetic of the Tr(F) passes (flatlm.measure.precision): "fp32" (default, the released
    # code's), "tf32" or "bf16" (within 1% of fp32, tests/measure/test_precision.py)
    fisher_precision: str = "fp32"
    # arithmetic of the Hutchinson passes (Tr(H), the gap, Tr(H) with data labels): "fp32"
    # (default) or "tf32"; bf16 is refused (the gap is a small difference: measure.precision)
    hessian_precision: str = "fp32"

    def __post_init__(self):
        if self.n_inputs is not None and self.n_inputs < 1:
            raise ValueError(f"flatness.n_inputs={self.n_inputs}: use >= 1, or None for all")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"flatness.estimator={self.estimator!r}: use one of {ESTIMATORS}")
        sizes = ("labels_per_input", "hutchinson_probes", "batch_size", "hutchinson_batch_size")
        for name in sizes:
            if getattr(self, name) < 1:
                raise ValueError(f"flatness.{name}={getattr(self, name)}: use an integer >= 1")
        if self.se_groups is not None and self.se_groups < 2:
            raise ValueError(f"flatness.se_groups={self.se_groups}: use >= 2, or None for one "
                             "group per input")
        if not 1 <= self.hutchinson_stack <= self.hutchinson_probes:
            raise ValueError(f"flatness.hutchinson_stack={self.hutchinson_stack}: use 1.."
                             f"{self.hutchinson_probes} (flatness.hutchinson_probes)")
        check_precision(self.fisher_precision, "flatness.fisher_precision")
        check_precision(self.hessian_precision, "flatness.hessian_precision", HESSIAN_PRECISIONS)
        if isinstance(self.exclude, str):
            raise ValueError("flatness.exclude must be a tuple of patterns, not one string")


@dataclass(frozen=True)
class MaskedInputs:
    """n masked sentences x_{-t}: model inputs (n, T+2), word positions t and the masked words."""

    input_ids: torch.Tensor  # (n, T+2) with [MASK] at input position t + 1
    attention_mask: torch.Tensor  # (n, T+2)
    positions: torch.Tensor  # (n,) 0-based word positions t
    targets: torch.Tensor  # (n,) the masked word x_t (the data's label)

    def __len__(self) -> int:
        return len(self.positions)

    def batch(self, start: int, stop: int, device) -> MaskedInputs:
        """Inputs start..stop on ``device``, trailing all-padding columns cut."""
        mask = self.attention_mask[start:stop]
        width = int(mask.sum(1).max()) if len(mask) else mask.shape[1]
        return MaskedInputs(
            self.input_ids[start:stop, :width].to(device),
            self.attention_mask[start:stop, :width].to(device),
            self.positions[start:stop].to(device), self.targets[start:stop].to(device))

    def sorted_batches(self, batch_size: int, device):
        """Yields (rows, batch): inputs of similar length together, trailing all-padding columns
        cut (about a third of the work on the paper's PCFG). Rows index this object."""
        lengths = self.attention_mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = int(lengths[rows].max())
            yield rows, MaskedInputs(
                self.input_ids[rows, :width].to(device), self.attention_mask[rows, :width].to(
                    device), self.positions[rows].to(device), self.targets[rows].to(device))


def masked_inputs(
    tokens, lengths, seed: int, *, n: int | None = None, positions: torch.Tensor | None = None
) -> MaskedInputs:
    """The first ``n`` sentences (all if None or if there are fewer: ``n`` is a cap, as the other
    measures' ``n_inputs``, so that a scale's cap holds under a smaller ``measure.n_eval``), each
    with one word masked: position t uniform over the sentence's words from
    ``torch.Generator().manual_seed(seed)``, or the given ``positions``.

    >>> x = masked_inputs(torch.tensor([[3, 1, -1], [0, 2, 2]]), torch.tensor([2, 3]), seed=0)
    >>> x.input_ids.shape, bool((x.positions < torch.tensor([2, 3])).all())
    (torch.Size([2, 5]), True)
    """
    tokens, lengths = as_tokens(tokens, lengths)
    tokens, lengths = tokens.cpu(), lengths.cpu()
    if n is not None:
        tokens, lengths = tokens[:n], lengths[:n]
    if positions is None:
        positions = uniform_positions(lengths, torch.Generator().manual_seed(seed))  # (n,)
    positions = torch.as_tensor(positions, dtype=torch.int64).cpu()
    if positions.shape != lengths.shape:
        raise ValueError(f"positions must be [n] = {tuple(lengths.shape)}")
    ids, mask = encode(tokens, lengths)
    targets = tokens.gather(1, positions[:, None]).squeeze(1)
    return MaskedInputs(mask_positions(ids, positions), mask, positions, targets)


def selected_parameters(
    model: nn.Module, exclude: tuple[str, ...] = ()
) -> dict[str, nn.Parameter]:
    """name -> parameter for those that count: trainable, each object once (tied and aliased
    parameters under their first name), and none of whose names matches a pattern in ``exclude``.

    >>> lin = nn.Linear(2, 3)
    >>> list(selected_parameters(lin, exclude=("bias",)))
    ['weight']
    """
    names: dict[int, list[str]] = {}
    first: dict[int, tuple[str, nn.Parameter]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
        first.setdefault(id(p), (name, p))
    out = {}
    for key, (name, p) in first.items():
        left_out = any(fnmatch.fnmatchcase(n, pat) for n in names[key] for pat in exclude)
        if p.requires_grad and not left_out:
            out[name] = p
    return out


def grouped_mean_se(values, n_groups: int | None = None, *, counts=None) -> tuple[float, float]:
    """Mean of per-input values and its standard error.

    ``n_groups=None``: the plain s.e. sd / sqrt(n) of i.i.d. values (one sentence is one input,
    so inputs are independent). An integer: batch means, the values cut in order into
    ``min(n_groups, len)`` contiguous groups of near-equal size and the s.e. that of the mean of
    group means, weighted by group size (``ratio_mean_se``); with i.i.d. values it estimates the
    same quantity with fewer degrees of freedom.

    Per-input squared gradient norms are heavy-tailed, and then any variance-based s.e. tends to
    understate in the typical sample (it misses the rare large values). Measured coverage of
    mean +- 1.96 se for Tr(F) on a partly trained bert-2m (``bench/flatness_se.py``): with 8
    sampled labels per input 0.87 / 0.91 / 0.93 at 100 / 500 / 2,000 inputs (median reported /
    true s.e. 0.84 / 0.95 / 0.99); the old default (1 probe, 32 batch means) 0.83 / 0.89 / -,
    ratio 0.66 / 0.82 / 0.90. Use >= 500 inputs.

    With ``counts``, ``values[j]`` is a sum over ``counts[j]`` inputs (a Hutchinson batch) and the
    mean is sum(values) / sum(counts).

    >>> grouped_mean_se([1.0, 3.0, 1.0, 3.0], n_groups=2)
    (2.0, 0.0)
    >>> grouped_mean_se([1.0, 3.0, 1.0, 3.0])[1] == (4 / 3) ** 0.5 / 2
    True
    """
    values = np.asarray(torch.as_tensor(values, dtype=torch.float64).cpu(), dtype=np.float64)
    counts = np.ones_like(values) if counts is None else np.asarray(counts, dtype=np.float64)
    n = len(values)
    if n == 0:
        return float("nan"), float("nan")
    k = n if n_groups is None else max(1, min(n_groups, n))
    starts = np.linspace(0, n, k + 1).round().astype(int)[:-1]
    mean, se = ratio_mean_se(np.add.reduceat(values, starts), np.add.reduceat(counts, starts))
    return mean, (se if math.isfinite(se) else float("nan"))


@contextlib.contextmanager
def eval_mode(model: nn.Module):
    """Dropout off while measuring; puts back the model's train/eval mode."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    p = next(model.parameters())
    return p.device, p.dtype
