"""A small check of training: KL(truth || model) at masked words, from the source's exact truth.

``flatlm.measure`` holds the official measurements (loss = entropy + KL with standard errors);
this is the minimum the training tests need to show that an algorithm learns the language.
"""

from __future__ import annotations

import torch
from torch import nn

from flatlm.models.bert import word_logits
from flatlm.sources.base import Source
from flatlm.tokens import encode, mask_positions


@torch.no_grad()
def kl_to_truth(model: nn.Module, src: Source, tokens: torch.Tensor,
                lengths: torch.Tensor) -> float:
    """Mean over every word of every sentence (each word masked alone) of
    KL(Pr(x_t | x_{-t}) || model(x_{-t})) in nats; words weigh equally, as in ``Source.entropy``.

    Runs the model in eval mode on its own device and puts back its train/eval mode.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    truth = src.conditionals(tokens, lengths, dtype=torch.float64)  # (n, T, V)
    ids, mask = encode(tokens, lengths)
    total, count = 0.0, 0
    for t in range(tokens.shape[1]):
        rows = (lengths > t).nonzero().squeeze(1)
        if len(rows) == 0:
            break
        pos = torch.full((len(rows),), t)
        logits = word_logits(model, mask_positions(ids[rows], pos).to(device),
                             mask[rows].to(device), pos.to(device))  # (k, V)
        log_q = logits.double().log_softmax(-1).cpu()
        p = truth[rows, t]  # (k, V)
        log_p = torch.where(p > 0, p.log(), 0.0)
        total += float((p * (log_p - log_q)).sum())
        count += len(rows)
    model.train(was_training)
    return total / count
