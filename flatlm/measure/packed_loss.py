"""Pre-training loss, KL and entropy of K models of one shape in one batched forward (issue 41).

``packed_pretrain_loss(models, source, tokens, lengths, cfg)`` is
``[pretrain_loss(m, source, tokens, lengths, cfg) for m in models]`` (``flatlm.measure.loss``
gives the definitions), computed as one problem: the models' weights stacked into one
``flatlm.models.packed.PackedBert``, every model batch of masked pairs runs once through it for
all K members (each linear layer one ``baddbmm`` over the members), and the true conditionals
of the pairs are computed once for all members (``pair_truth``) instead of once per model.
Only post-LN BERTs stack (``packable``); another model is a ValueError naming the way out.

Equal to the per-member path bit for bit on the CPU (``tests/measure/test_packed_loss.py``,
``==`` on every value): the pairs go through the model in ``loss_terms``'s batches (chunks of
``truth_chunk`` sentences, ``cfg.batch_size`` pairs within a chunk), a member's slice of each
``baddbmm`` is the single model's ``addmm`` on the CPU (except in a batch of one pair, whose
one-row products the single model rounds otherwise: such a batch runs model by model),
LayerNorm runs per member and attention per sentence (``flatlm.models.packed``), and
everything after the logits (float64) is per member in ``loss_terms``'s order. On CUDA,
cuBLAS's batched and single GEMMs need not sum in one order: there the values agree to the
float32 rounding of the logits, not bit for bit (not yet measured on a GPU).

>>> import torch
>>> from flatlm.measure.loss import LossConfig, pretrain_loss
>>> from flatlm.models.bert import build_model
>>> from flatlm.models.presets import parse_model
>>> from flatlm.sources.dyck import Dyck
>>> source = Dyck(4)
>>> tokens, lengths = source.sample_validation(8, seed=0)
>>> models = [build_model(parse_model("d16-h2-l1-i32"), source.V, source.max_length, seed=s)
...           for s in (0, 1)]
>>> packed = packed_pretrain_loss(models, source, tokens, lengths, LossConfig())
>>> packed[1] == pretrain_loss(models[1], source, tokens, lengths, LossConfig())
True
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import nn

from flatlm.core.stats import mean_se, ratio_mean_se
from flatlm.core.tokens import encode, mask_positions
from flatlm.measure import ENTROPY, KL, LOSS, LOSS_DATA, per_sentence_key, se_key
from flatlm.measure.loss import (
    LossConfig,
    data_terms,
    masked_pairs,
    pair_terms,
    pair_truth,
    truth_chunk,
)
from flatlm.models.masked_lm import word_logits
from flatlm.models.packed import PackedBert, packable
from flatlm.sources.base import Source, as_tokens


def packed_pretrain_loss(models: Sequence[nn.Module], source: Source, tokens, lengths,
                         cfg: LossConfig, *, device=None) -> list[dict[str, float]]:
    """``pretrain_loss`` of each of ``models`` (same keys, same values: module docstring), in
    one batched forward per model batch. ``device`` as in ``packed_loss_terms``."""
    L = as_tokens(tokens, lengths)[1].cpu().double().numpy()  # (n,)
    out = []
    for terms in packed_loss_terms(models, source, tokens, lengths, cfg, device=device):
        metrics = {}
        for key, values in terms.items():  # pretrain_loss's summary of its loss_terms
            metrics[key], metrics[se_key(key)] = ratio_mean_se(values.numpy() * L, L)
            sentence_key = per_sentence_key(key)
            metrics[sentence_key], metrics[se_key(sentence_key)] = mean_se(values)
        out.append(metrics)
    return out


@torch.no_grad()
def packed_loss_terms(models: Sequence[nn.Module], source: Source, tokens, lengths,
                      cfg: LossConfig, *, device=None) -> list[dict[str, torch.Tensor]]:
    """``loss_terms`` of each of ``models``: per member, per-sentence values [n] (float64, CPU)
    keyed by the metric keys. The models (post-LN BERTs of one shape) must be on ``device``
    (default: the first model's); they are read, not changed (the pack holds copies)."""
    if not models:
        raise ValueError("packed_loss_terms: no models")
    why = next((w for w in map(packable, models) if w is not None), None)
    if why is not None:
        raise ValueError(f"batched loss: {why}; measure these models one by one "
                         "(flatlm.measure.loss.pretrain_loss)")
    tokens, lengths = as_tokens(tokens, lengths)
    tokens, lengths = tokens.cpu(), lengths.cpu()
    device = torch.device(device) if device is not None else next(models[0].parameters()).device
    pack = PackedBert(models).to(device)
    K, n = pack.k, len(lengths)
    rows, pos = masked_pairs(lengths, cfg)  # (P,), (P,), rows ascending
    # once for all members; the same numbers loss_terms computes per model
    truth = pair_truth(source, tokens, lengths, cfg, device=device) if source.has_truth else None
    keys = (LOSS, ENTROPY, KL, LOSS_DATA) if source.has_truth else (LOSS, LOSS_DATA)
    sums = [{key: torch.zeros(n, dtype=torch.float64) for key in keys} for _ in range(K)]
    for j in _model_batches(rows, n, truth_chunk(cfg.batch_size, tokens.shape[1], source.V),
                            cfg.batch_size):
        r, t = rows[j], pos[j]
        ids, mask = encode(tokens[r].to(device), lengths[r].to(device))  # (B, T+2)
        t_dev = t.to(device)
        ids = mask_positions(ids, t_dev, check=False)
        if len(r) == 1:  # a single model's kernels take another path for one row
            logits = _one_by_one(models, ids, mask, t_dev)  # (K, 1, V)
        else:
            logits = pack.word_logits(ids.expand(K, -1, -1), mask.expand(K, -1, -1),
                                      t_dev.expand(K, -1), dropout=(0.0,) * K)  # (K, B, V)
        word = tokens[r, t].to(device)  # (B,)
        for k in range(K):
            log_q = logits[k].double().log_softmax(-1)  # (B, V)
            terms = data_terms(log_q, word) if truth is None else pair_terms(truth[j], log_q,
                                                                             word)
            for key, value in terms.items():
                sums[k][key].index_add_(0, r, value.cpu())
    count = torch.bincount(rows, minlength=n).double()  # (n,): 1 ("one") or L_i ("all")
    return [{key: s / count for key, s in member.items()} for member in sums]


def _one_by_one(models, ids, mask, positions) -> torch.Tensor:
    """(K, B, V) logits of each model in eval mode, one forward per model, each model's mode
    put back: for a batch of one pair, where the single model's linear layers (a matrix
    product of one row) round otherwise than the pack's batched product."""
    out = []
    for model in models:
        was_training = model.training
        model.eval()
        try:
            out.append(word_logits(model, ids, mask, positions))
        finally:
            model.train(was_training)
    return torch.stack(out)


def _model_batches(rows: torch.Tensor, n: int, chunk: int, batch_size: int) -> Iterator[slice]:
    """The slices of the pairs that ``loss_terms`` runs as one model batch: ``batch_size``
    pairs at a time within each chunk of ``chunk`` sentences (a batch never spans two chunks),
    so that each member's forward sees the rows its single model's forward sees."""
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        lo, hi = (int(i) for i in torch.searchsorted(rows, torch.tensor([start, stop])))
        for i in range(lo, hi, batch_size):
            yield slice(i, min(i + batch_size, hi))
