"""The pack's hand-batched optimizer step (``PackedOptimizer.step``) equals torch's own
functional AdamW / SGD called once per member on the member's views (``step_per_member``), bit
for bit on the CPU, over several updates, with members that differ in rate, weight decay and
Adam constants. The hand-written step stays because it is faster (bench/packs.py
``optimizer_costs``); this test is what keeps it torch's math."""

import pytest
import torch

from flatlm.models.bert import build_model
from flatlm.models.packed import PackedBert
from flatlm.models.presets import parse_model
from flatlm.train import TrainConfig
from flatlm.train.config import resolve
from flatlm.train.packed_optim import PackedOptimizer

MEMBERS = (dict(seed=1, lr=1e-3), dict(seed=2, lr=3e-3, weight_decay=0.05, beta1=0.8),
           dict(seed=3, lr=1e-2, weight_decay=0.0, beta2=0.999, eps=1e-8))


def _pack(kind, tiny_model):
    cfgs = [resolve(TrainConfig(algorithm=kind, steps=10, **m)) for m in MEMBERS]
    models = [build_model(parse_model(tiny_model), 12, 6, seed=c.seed) for c in cfgs]
    return cfgs, list(PackedBert(models).params)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_hand_batched_step_is_torchs_step_per_member(kind, foreach, tiny_model):
    cfgs, params = _pack(kind, tiny_model)
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    hand, stock = PackedOptimizer(params, cfgs, kind), PackedOptimizer(twins, cfgs, kind)
    generator = torch.Generator().manual_seed(0)
    for step in range(1, 5):
        for p, q in zip(params, twins, strict=True):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        lrs = [c.lr * step / 4 for c in cfgs]  # a warm-up: the rate changes every update
        hand.step(lrs)
        stock.step_per_member(lrs, foreach=foreach)
    assert hand.step_count == stock.step_count == 4
    for a, b in zip(params, twins, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(hand.exp_avg + hand.exp_avg_sq, stock.exp_avg + stock.exp_avg_sq,
                    strict=True):
        assert torch.equal(a, b)
