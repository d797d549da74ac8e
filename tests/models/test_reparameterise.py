"""The function-preserving reparameterisations (``flatlm.models.reparameterise``): each keeps the
logits of a post-LN BERT to 1e-5 in float32 while moving its weights, carries Adam's moments as
the gradient moves, and moves the raw traces at c = 10; the MLP's analogue under GELU is no
reparameterisation."""

import dataclasses

import pytest
import torch

from flatlm.measure.curvature.common import FlatnessConfig
from flatlm.measure.curvature.flatness import measure_flatness
from flatlm.models import build_model, parse_model
from flatlm.models.growth import max_logit_difference
from flatlm.models.reparameterise import (
    TENSOR_REPARAMETERISATIONS,
    TensorMap,
    moved,
    moved_moments,
)
from flatlm.sources import load
from tests.measure.conftest import TINY_PCFG

V, T = 6, 8
SHAPES = ("d16-h1-l1-i64", "d32-h2-l2-i128")


def _model(shape: str, seed: int = 0) -> torch.nn.Module:
    """A BERT, dropout 0, every weight moved from its initialisation (whose LayerNorms are 1 and
    0, its biases 0 and its weights so small that attention and the MLP barely act) by
    N(0, 0.2^2)."""
    cfg = dataclasses.replace(parse_model(shape), dropout=0.0)
    model = build_model(cfg, V, T, seed=seed).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return model


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(TENSOR_REPARAMETERISATIONS))
def test_the_logits_stay_and_the_weights_move(shape, name):
    model = _model(shape)
    new = TENSOR_REPARAMETERISATIONS[name](model)
    assert max_logit_difference(model, new, n=16) < 1e-5
    moved_by = max(float((a - b).detach().abs().max())
                   for a, b in zip(model.parameters(), new.parameters(), strict=True))
    assert moved_by > 0.5
    assert all(torch.equal(a, b) for a, b in  # the original is left as it was
               zip(model.parameters(), _model(shape).parameters(), strict=True))


def test_the_mlps_analogue_is_not_a_reparameterisation():
    """Up-projection times 10, down-projection / 10: GELU(10 z) != 10 GELU(z)."""
    model = _model("d16-h1-l1-i64")
    up = {"bert.encoder.layer.0.intermediate.dense.weight": 10.0,
          "bert.encoder.layer.0.intermediate.dense.bias": 10.0,
          "bert.encoder.layer.0.output.dense.weight": 0.1}
    maps = {k: TensorMap(factor=f) for k, f in up.items()}
    assert max_logit_difference(model, moved(model, maps)) > 0.1


@pytest.mark.parametrize("name", sorted(TENSOR_REPARAMETERISATIONS))
def test_moments_move_as_the_gradient_does(name):
    """The gradient of the moved model at its own weights is each map's moment(gradient, 1): so
    Adam's moments, averages of gradients and of their squares, move as ``moved_moments``
    moves them."""
    model = _model("d32-h2-l2-i128").double()
    maps = TENSOR_REPARAMETERISATIONS[name].maps(model)
    new = moved(model, maps)
    ids = torch.randint(4, 4 + V, (4, T + 2), generator=torch.Generator().manual_seed(3))
    grads = []
    for m in (model, new):
        m.zero_grad()
        m(input_ids=ids).logits.square().mean().backward()
        grads.append({k: p.grad for k, p in m.named_parameters()})
    for key, g in grads[0].items():
        state = {"step": torch.tensor(5.0), "exp_avg": g, "exp_avg_sq": g * g}
        carried = moved_moments(state, maps.get(key))
        torch.testing.assert_close(carried["exp_avg"], grads[1][key], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(carried["exp_avg_sq"], grads[1][key] ** 2, rtol=1e-9,
                                   atol=1e-12)
        assert carried["step"] == 5


def test_a_pre_ln_model_is_refused():
    model = build_model(parse_model("d16-h1-l1-i64-pre"), V, T, seed=0)
    with pytest.raises(ValueError, match="post-LN"):
        TENSOR_REPARAMETERISATIONS["query-key"](model)


@pytest.mark.parametrize("name", ["query-key", "value-output", "layer-norm"])
def test_the_raw_traces_move_at_c_10(name):
    """Tr(F) (whose estimator shares every draw before and after: labels from the unchanged
    p_theta) moves by more than 1% at c = 10; Tr(H) too where the move is far beyond its
    Hutchinson noise (layer-norm). tests/measure/test_invariance.py has every measure, on a
    trained model, at c = 100."""
    source = load(TINY_PCFG)
    model = _model("d16-h1-l1-i64").double()
    tokens, lengths = source.sample(128, seed=1)
    cfg = FlatnessConfig(n_inputs=128, batch_size=128, hutchinson_batch_size=32)
    before = measure_flatness(model, source, tokens, lengths, cfg)
    new = TENSOR_REPARAMETERISATIONS[name].maps(model, 10.0)
    after = measure_flatness(moved(model, new), source, tokens, lengths, cfg)
    fisher = after["flat/trace_fisher"] / before["flat/trace_fisher"]
    assert abs(fisher - 1) > 0.01, fisher
    if name == "layer-norm":
        # far from a minimum H is indefinite, and scaling moves its negative directions too
        assert abs(after["flat/trace_hessian"]) > 10 * abs(before["flat/trace_hessian"])
