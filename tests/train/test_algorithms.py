"""Each algorithm learns the language; SAM and the adversarial update do what A.5 says."""

import contextlib
import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from flatlm.measure.loss import kl_to_truth
from flatlm.models import build_model, parse_model, word_logits
from flatlm.sources import load
from flatlm.train import AdversarialConfig, SamConfig, TrainConfig, resolve, train
from flatlm.train.algorithms import (
    StepContext,
    build_optimizer,
    mlm_loss_sum,
    ridge_head_loss,
    sam_step,
    sentence_features,
    standard_step,
)
from flatlm.train.data import DownstreamPool, StepInputs, generator, mask_batch

RUNS = {  # algorithm -> fields besides the shared ones; SGD needs a larger rate to move in 40
    "adamw": {},
    "sgd": {"lr": 0.5},
    "noreg": {},
    "sam": {},
    "adversarial": {"sections": {"adversarial": AdversarialConfig(d1=32, d2=32, pool=256)}},
    "adamw-rate": {"algorithm": "adamw", "mask": 0.3},  # each word masked at a rate
    "adamw-accumulated": {"algorithm": "adamw", "micro_batch_size": 16},
    "adamw-bf16": {"algorithm": "adamw", "precision": "bf16"},  # the CUDA autocast, on the CPU
    "label_noise": {"lr": 0.5},  # p = 0.1 of the targets replaced: still learns
}


@pytest.mark.parametrize("name", RUNS)
def test_each_algorithm_lowers_kl_to_truth(name, src, tiny_model, eval_sentences, tmp_path):
    fields = {"algorithm": name, "lr": 3e-3, **RUNS[name]}
    cfg = TrainConfig(steps=40, batch_size=64, warmup_steps=5, checkpoint_steps=(0, 40), seed=1,
                      **fields)
    kl = {}
    train(cfg, src, tiny_model, tmp_path, progress=False,
          on_checkpoint=lambda step, model, _: kl.update({step: kl_to_truth(model, src,
                                                                             *eval_sentences)}))
    assert kl[40] < 0.5 * kl[0], kl


def _tiny_float64(dropout=0.0, seed=0):
    model = build_model(dataclasses.replace(parse_model("d32-h2-l1-i64"), dropout=dropout),
                        vocab_size=12, max_length=4, seed=seed)
    return model.double()


def _context(cfg, model):
    cfg = resolve(cfg)
    return StepContext(cfg=cfg, model=model, optimizer=build_optimizer(cfg, model),
                       autocast=contextlib.nullcontext, mlm_loss=mlm_loss_sum)


def _mlm_inputs(src, n, seed):
    tokens, lengths = src.sample(n, seed)
    return StepInputs(mask_batch(tokens, lengths, "one", generator(seed, "mask", 0)))


def _mean_loss(model, batch):
    logits = word_logits(model, batch.input_ids, batch.attention_mask, batch.positions)
    return F.cross_entropy(logits, batch.targets)


def test_sam_step_equals_the_two_pass_computation_by_hand(src):
    cfg = TrainConfig(algorithm="sam", steps=1, batch_size=16, lr=1e-2, warmup_steps=0,
                      weight_decay=0.01, sections={"sam": SamConfig(rho=0.05)})
    model = _tiny_float64()
    ref = copy.deepcopy(model)
    inputs = _mlm_inputs(src, 16, seed=3)
    sam_step(_context(cfg, model), inputs)

    first, second = inputs.mlm.split(8)  # perturbation from the first half, update the second
    params = list(ref.parameters())
    g = torch.autograd.grad(_mean_loss(ref, first), params)
    norm = torch.sqrt(sum((gi ** 2).sum() for gi in g))
    perturbed = copy.deepcopy(ref)
    with torch.no_grad():
        for p, gi in zip(perturbed.parameters(), g, strict=True):
            p += 0.05 * gi / norm
    g2 = torch.autograd.grad(_mean_loss(perturbed, second), list(perturbed.parameters()))
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=1e-2, betas=(0.9, 0.98), eps=1e-6)
    for p, gi in zip(params, g2, strict=True):
        p.grad = gi
    opt.step()
    for (name, got), want in zip(model.named_parameters(), params, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12, msg=name)


def test_gradient_accumulation_equals_the_whole_batch(src):
    inputs = _mlm_inputs(src, 32, seed=4)
    whole, accumulated = _tiny_float64(), _tiny_float64()
    standard_step(_context(TrainConfig(batch_size=32, lr=1e-2), whole), inputs)
    standard_step(_context(TrainConfig(batch_size=32, micro_batch_size=8, lr=1e-2), accumulated),
                  inputs)
    for a, b in zip(whole.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_ridge_head_dual_equals_primal():
    g = torch.Generator().manual_seed(5)
    H1, H2 = torch.randn(40, 10, generator=g), torch.randn(30, 10, generator=g)
    y1, y2 = torch.randint(0, 3, (40,), generator=g), torch.randint(0, 3, (30,), generator=g)
    primal = ridge_head_loss(H1, y1, H2, y2, 3, 1e-2)  # 40 rows > 10 features: primal
    # the same rows with features padded by zeros: 40 rows <= 50 features, solved in the dual
    dual = ridge_head_loss(F.pad(H1, (0, 40)), y1, F.pad(H2, (0, 40)), y2, 3, 1e-2)
    torch.testing.assert_close(primal[0], dual[0], rtol=1e-4, atol=1e-5)
    # and both agree with the textbook formula
    mu, Y1 = H1.mean(0), F.one_hot(y1, 3).float()
    A = H1 - mu
    r = 1e-2 * A.pow(2).sum(1).mean()
    phi = torch.linalg.solve(A.T @ A + r * torch.eye(10), A.T @ (Y1 - Y1.mean(0)))
    pred = (H2 - mu) @ phi + Y1.mean(0)
    expected = (pred - F.one_hot(y2, 3).float()).pow(2).sum(1).mean()
    torch.testing.assert_close(primal[0], expected, rtol=1e-4, atol=1e-5)


def test_adversarial_raises_the_heads_d2_loss_while_mlm_loss_falls(src, tiny_model,
                                                                    eval_sentences, tmp_path):
    # labels of the released code's rule on every sentence, over a span every sentence has
    # (one word): on this 1-4 word grammar they carry more of the signal the adversarial head
    # is fitted to than posterior labels of longer spans
    src = load({**src.spec, "label_rule": "inside", "downstream_min_length": 1,
                "spans": {"C": 1}})
    pool = DownstreamPool(src, "C", size=256, d1=64, d2=64, seed=99)  # held out of training
    probe = pool.draw(0, stream="eval")

    def measure(model):
        with torch.no_grad():
            H = sentence_features(model, probe.input_ids, probe.attention_mask)
        d2_loss, _ = ridge_head_loss(H[:64], probe.labels[:64], H[64:], probe.labels[64:],
                                     pool.n_classes, 1e-3)
        return float(d2_loss), kl_to_truth(model, src, *eval_sentences)

    out = {}
    for lam in (0.0, 1.0):
        cfg = TrainConfig(algorithm="adversarial", steps=40, batch_size=64, lr=3e-3,
                          warmup_steps=5, checkpoint_steps=(0, 40),
                          sections={"adversarial": AdversarialConfig(
                              lambda_=lam, task="C", d1=64, d2=64, pool=512)})
        seen = {}
        train(cfg, src, tiny_model, tmp_path / str(lam), progress=False,
              on_checkpoint=lambda step, model, _, seen=seen: seen.update({step: measure(model)}))
        out[lam] = seen
    (d2_start, kl_start), (d2_end, kl_end) = out[1.0][0], out[1.0][40]
    assert d2_end > 1.3 * d2_start, out  # the head fitted on D1 transfers worse to D2
    assert d2_end > 1.3 * out[0.0][40][0], out  # ... than after plain MLM training
    assert kl_end < 0.5 * kl_start, out  # while the MLM loss still falls
