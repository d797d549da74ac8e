"""Pre-training loss on a synthetic source, exactly: loss = entropy + KL(truth || model) (A.7).

With the true conditional p = Pr(. | x_{-t}) known and the model's q = p_theta(. | x_{-t}) (the
model reads x with word t replaced by [MASK]), the cross-entropy at a masked position is

    CE = sum_c p(c) (-log q(c)) = H(p) + KL(p || q),   H(p) = -sum_c p(c) log p(c),

the expectation of the one-hot loss -log q(x_t) over x_t ~ p given x_{-t}. Averaging CE over
validation sentences estimates the population MLM loss L(theta) of section 2.1 with less variance
than the one-hot loss, which is still reported as ``pretrain/loss_data``: both have the same
expectation over sentences drawn from the source (tests/measure/test_loss.py checks this exactly
by enumerating a tiny grammar).

Positions (``LossConfig.positions``):

- ``"one"``: one position t_i ~ Unif{0..L_i - 1} per sentence, drawn from ``LossConfig.seed``
  (the paper's formulation: t sampled uniformly and independently);
- ``"all"``: every real position of every sentence, each masked alone (sentences are replicated
  once per position and batched); a sentence's value is the mean over its L_i positions.

Two weightings, each under its own keys (``flatlm.measure``):

- per token (``pretrain/loss`` ...; the default, as in ``Source.entropy``, the README and the
  paper's code): every masked word weighs the same, E_x[sum_t CE_t] / E_x[L]. With "all" it is the
  pooled mean over every position; with "one" each sentence's value is weighted by its length L
  (L CE_t is unbiased for the sentence's sum). Standard error clustered by sentence
  (``flatlm.core.stats.ratio_mean_se``).
- per sentence (``pretrain/loss_per_sentence`` ...): each sentence weighs the same,
  E_x E_{t ~ Unif}[CE_t]; standard error std / sqrt(n) over the n per-sentence values.

All arithmetic after the model's logits is in float64.

A source without a truth (real text, ``Source.has_truth`` False) has no entropy and no KL:
``pretrain/loss`` is then the one-hot validation loss, equal to ``pretrain/loss_data``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from flatlm.core.stats import mean_se, ratio_mean_se
from flatlm.core.tokens import encode, mask_positions, uniform_positions
from flatlm.measure import ENTROPY, KL, LOSS, LOSS_DATA, per_sentence_key, se_key
from flatlm.measure.precision import check_precision, computing_in
from flatlm.models.masked_lm import word_logits
from flatlm.sources.base import Source, as_tokens

POSITIONS = ("one", "all")
LOSS_PRECISIONS = ("fp32", "tf32")  # loss.precision (measure.precision)


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """How ``pretrain_loss`` masks and batches; the sentences are an argument."""

    positions: str = "one"  # "one" (a seeded uniform position per sentence) or "all" (each)
    batch_size: int = 256  # masked inputs per forward pass (sentence copies with "all"); 1..8192
    seed: int = 0  # draws the masked position of each sentence when positions="one"
    # arithmetic of the model's forward passes (flatlm.measure.precision): "fp32" (default, the
    # released code's) or "tf32"; bf16 is refused (KL at saturation is smaller than its error)
    precision: str = "fp32"

    def __post_init__(self):
        if self.positions not in POSITIONS:
            raise ValueError(f"loss.positions={self.positions!r}: use one of {POSITIONS}")
        if self.batch_size < 1:
            raise ValueError(f"loss.batch_size={self.batch_size}: use an integer >= 1")
        check_precision(self.precision, "loss.precision", LOSS_PRECISIONS)


def masked_pairs(lengths: torch.Tensor, cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The (sentence, word position) pairs to mask, as two int64 tensors [P] on the CPU.

    >>> masked_pairs(torch.tensor([2, 3]), LossConfig(positions="all"))
    (tensor([0, 0, 1, 1, 1]), tensor([0, 1, 0, 1, 2]))
    """
    lengths = lengths.cpu()
    n = len(lengths)
    if cfg.positions == "one":
        return torch.arange(n), uniform_positions(lengths, torch.Generator().manual_seed(cfg.seed))
    rows = torch.repeat_interleave(torch.arange(n), lengths)  # (P,)
    starts = torch.cumsum(lengths, 0) - lengths  # (n,)
    return rows, torch.arange(len(rows)) - starts[rows]


def pair_terms(p: torch.Tensor, log_q: torch.Tensor, word: torch.Tensor) -> dict:
    """Per-pair entropy, KL, expected and one-hot cross-entropy (nats) from the true conditional
    ``p`` (P, V), the model's log-probabilities ``log_q`` (P, V) and the data's words (P,).

    Each is computed from its own definition (none as a difference of the others), so that
    CE = H + KL is a check, not an identity of the code. 0 log 0 = 0.
    """
    log_p = torch.where(p > 0, p.log(), torch.zeros_like(p))  # (P, V)
    return {
        LOSS: -(p * log_q).sum(-1),
        ENTROPY: -(p * log_p).sum(-1),
        KL: (p * (log_p - log_q)).sum(-1),
        LOSS_DATA: -log_q.gather(1, word[:, None]).squeeze(1),
    }


def data_terms(log_q: torch.Tensor, word: torch.Tensor) -> dict:
    """Per-pair terms of a source without a truth (real text): the one-hot validation loss is
    all there is, and it is ``pretrain/loss`` as well as ``pretrain/loss_data``."""
    one_hot = -log_q.gather(1, word[:, None]).squeeze(1)
    return {LOSS: one_hot, LOSS_DATA: one_hot}


TRUTH_BYTES = 2**28  # one call's exact conditionals (float64): 8192 paper-grammar sentences


def truth_chunk(n_batch: int, T: int, V: int) -> int:
    """Sentences whose exact conditionals are computed in one call: as many as ``TRUTH_BYTES``
    holds, at least one model batch. One large call per chunk, not one per model batch, so the
    source's batched inference (grouped by length) runs at full width on the device."""
    return max(n_batch, TRUTH_BYTES // (8 * max(1, T * V)))


def _chunks(rows: torch.Tensor, n: int, chunk: int):
    """Yields (start, stop, lo, hi): the sentences start..stop whose truth is computed in one
    call, and the masked pairs lo..hi of theirs (``rows`` ascending)."""
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        lo, hi = (int(i) for i in torch.searchsorted(rows, torch.tensor([start, stop])))
        yield start, stop, lo, hi


@torch.no_grad()
def pair_truth(source: Source, tokens, lengths, cfg: LossConfig, *,
               device: str | torch.device) -> torch.Tensor:
    """The true conditionals (P, V) of the pairs ``masked_pairs`` masks, float64 on ``device``,
    computed as ``loss_terms`` computes them (the same chunks, so the same numbers): passed to
    ``loss_terms`` it spares the truth's inference when one set of sentences is measured on many
    models (``measure.noise``: the same model under many perturbations)."""
    if not source.has_truth:
        raise ValueError(f"{type(source).__name__} has no exact conditionals (Source.has_truth)")
    tokens, lengths = as_tokens(tokens, lengths)
    tokens, lengths = tokens.cpu(), lengths.cpu()
    rows, pos = masked_pairs(lengths, cfg)
    parts = []
    for start, stop, lo, hi in _chunks(rows, len(lengths),
                                       truth_chunk(cfg.batch_size, tokens.shape[1], source.V)):
        truth = source.conditionals(tokens[start:stop], lengths[start:stop], device=device,
                                    dtype=torch.float64)
        parts.append(truth[(rows[lo:hi] - start).to(device), pos[lo:hi].to(device)])
    return torch.cat(parts)


@torch.no_grad()
def loss_terms(
    model: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: LossConfig,
    *,
    device: str | torch.device | None = None,
    truth: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Per-sentence values [n] (float64, CPU) of loss, entropy, kl and loss_data (loss and
    loss_data only for a source without a truth, ``Source.has_truth``), keyed by the metric keys:
    the value at the sentence's position ("one") or the mean over its positions ("all"). The model
    must already be on ``device`` (default: its own); it runs in eval mode and its train/eval mode
    is put back afterwards. The truth is computed on ``device`` too, a chunk of sentences at a
    time (``truth_chunk``), unless given: ``truth`` from ``pair_truth`` on the same sentences
    and ``cfg``.
    """
    tokens, lengths = as_tokens(tokens, lengths)
    tokens, lengths = tokens.cpu(), lengths.cpu()
    device = torch.device(device) if device is not None else next(model.parameters()).device
    rows, pos = masked_pairs(lengths, cfg)  # (P,), (P,), rows ascending
    if truth is not None and truth.shape != (len(rows), source.V):
        raise ValueError(f"truth has shape {tuple(truth.shape)}; pair_truth of these sentences "
                         f"and this LossConfig gives ({len(rows)}, {source.V})")
    n = len(lengths)
    chunk = truth_chunk(cfg.batch_size, tokens.shape[1], source.V)
    batches = []  # (sentences r, the batch's terms on the device): read once, after the last
    was_training = model.training
    model.eval()
    try:
        for start, stop, lo, hi in _chunks(rows, n, chunk):
            computed = None  # the chunk's conditionals (C, T, V), when not given
            if source.has_truth and truth is None:
                computed = source.conditionals(tokens[start:stop], lengths[start:stop],
                                               device=device, dtype=torch.float64)
            for i in range(lo, hi, cfg.batch_size):
                j = slice(i, min(i + cfg.batch_size, hi))
                r, t = rows[j], pos[j]
                p = truth[j].to(device) if truth is not None else None
                if computed is not None:
                    p = computed[(r - start).to(device), t.to(device)]
                with computing_in(cfg.precision, device):
                    batches.append((r, _batch_terms(model, p, tokens, lengths, r, t, device)))
    finally:
        model.train(was_training)
    keys = (LOSS, ENTROPY, KL, LOSS_DATA) if source.has_truth else (LOSS, LOSS_DATA)
    return _per_sentence(batches, keys, rows, n)


def _per_sentence(batches, keys, rows: torch.Tensor, n: int) -> dict[str, torch.Tensor]:
    """The batches' per-pair terms moved to the host in one transfer and added up per sentence
    in batch order (the order, hence the rounding, of adding each batch as it comes)."""
    sums = {key: torch.zeros(n, dtype=torch.float64) for key in keys}
    if batches:
        flat = torch.cat([torch.stack([terms[key] for key in keys]) for _, terms in batches],
                         1).cpu()  # (keys, P)
        start = 0
        for r, _ in batches:
            for key, value in zip(keys, flat[:, start : start + len(r)], strict=True):
                sums[key].index_add_(0, r, value)
            start += len(r)
    count = torch.bincount(rows, minlength=n).double()  # (n,): 1 ("one") or L_i ("all")
    return {key: s / count for key, s in sums.items()}


def _batch_terms(model, p, tokens, lengths, r, t, device) -> dict[str, torch.Tensor]:
    """One model batch of masked pairs (sentence r, position t): the per-pair terms (B,) on
    ``device``; ``p`` holds the pairs' true conditionals (B, V) on ``device`` (None: a source
    without a truth, whose only term is the one-hot loss)."""
    ids, mask = encode(tokens[r].to(device), lengths[r].to(device))  # (B, T+2)
    t_dev = t.to(device)
    ids = mask_positions(ids, t_dev, check=False)
    log_q = word_logits(model, ids, mask, t_dev).double().log_softmax(-1)  # (B, V)
    word = tokens[r, t].to(device)  # (B,)
    return data_terms(log_q, word) if p is None else pair_terms(p, log_q, word)


def pretrain_loss(
    model: nn.Module,
    source: Source,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cfg: LossConfig,
    *,
    device: str | torch.device | None = None,
    truth: torch.Tensor | None = None,
) -> dict[str, float]:
    """``pretrain/loss``, ``pretrain/entropy``, ``pretrain/kl``, ``pretrain/loss_data`` (nats,
    per token) and their ``_per_sentence`` twins, each with its ``_se``, over the validation
    sentences ``tokens`` [n, T], ``lengths`` [n] (the module docstring gives the definitions).
    ``device`` and ``truth`` (``pair_truth`` of these sentences, when computed already) as in
    ``loss_terms``.
    """
    out = {}
    L = as_tokens(tokens, lengths)[1].cpu().double().numpy()  # (n,)
    terms = loss_terms(model, source, tokens, lengths, cfg, device=device, truth=truth)
    for key, values in terms.items():
        out[key], out[se_key(key)] = ratio_mean_se(values.numpy() * L, L)
        sentence_key = per_sentence_key(key)
        out[sentence_key], out[se_key(sentence_key)] = mean_se(values)
    return out


def per_token_loss(model: nn.Module, source: Source, tokens, lengths, cfg: LossConfig, *,
                   device=None, truth: torch.Tensor | None = None) -> float:
    """``pretrain/loss`` (per token) alone, as ``pretrain_loss`` reports it, with the pairs'
    ``truth`` from ``pair_truth`` if given (``loss_terms``): the loss of many models on one set
    of sentences (``measure.noise``, ``measure.barrier``)."""
    values = loss_terms(model, source, tokens, lengths, cfg, device=device, truth=truth)[LOSS]
    L = as_tokens(tokens, lengths)[1].cpu().double().numpy()  # (n,)
    return ratio_mean_se(values.numpy() * L, L)[0]


def kl_to_truth(model: nn.Module, source: Source, tokens, lengths) -> float:
    """Per-token KL(truth || model) in nats over every word of the given sentences, each masked
    alone: the check training tests use to see that an algorithm learns the language."""
    return pretrain_loss(model, source, tokens, lengths, LossConfig(positions="all"))[KL]
