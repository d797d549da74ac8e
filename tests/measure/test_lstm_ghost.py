"""The BiLSTM's ghost norms (``measure.lstm_ghost``) against the per-example backward loop."""

import dataclasses

import pytest
import torch

from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.fisher import trace_fisher
from flatlm.models import build_model, parse_model

V, T = 7, 6


def padded_batch(n: int, seed: int):
    """Sentences of 1..T words, padding -1 after them: most rows padded."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    tokens = torch.randint(0, V, (n, T), generator=g)
    tokens[torch.arange(T)[None] >= lengths[:, None]] = -1
    return tokens, lengths


@pytest.mark.parametrize(("layers", "exclude"), [(1, ("bias",)), (2, ()), (2, ("lstm.*",))])
def test_lstm_ghost_norms_equal_the_per_example_loop(layers, exclude):
    cfg = dataclasses.replace(parse_model(f"lstm-h8-l{layers}"), dropout=0.0)
    model = build_model(cfg, vocab_size=V, max_length=T, seed=layers).double().eval()
    tokens, lengths = padded_batch(10, layers)
    fc = FlatnessConfig(n_inputs=10, batch_size=6, labels_per_input=2, exclude=exclude)
    fast = trace_fisher(model, tokens, lengths, fc, per_example=True)  # auto: lstm-ghost
    loop = trace_fisher(model, tokens, lengths, fc, per_example=True, method="loop")
    torch.testing.assert_close(fast["per_example"], loop["per_example"], rtol=1e-10, atol=0)
    assert fast["n_params"] == loop["n_params"]
    assert (model.embed.weight.grad is None) and all(p.grad is None for p in model.parameters())
