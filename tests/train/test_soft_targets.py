"""``train.targets``: "sampled" (the masked word the data holds, the default and the run before the
setting existed) or "truth" (the source's true conditional Pr(. | x_{-t}) of the masked word). The
soft-target loss is H(truth) + KL(truth || model) at the batch's masked words, computed here a
second way; at the truth its gradient is 0 on every batch while the sampled one is not; it trains;
a bad value or combination is refused before any work. Resume bit for bit:
tests/train/test_resume.py (case "truth-rate"); data-parallel: tests/train/test_distributed.py
(case "noreg-truth-rate")."""

import copy
import dataclasses

import pytest
import torch

from flatlm.core.config import apply_overrides
from flatlm.core.seeds import derive_seed
from flatlm.models import build_model, parse_model, word_logits
from flatlm.runs.pack import unpacked_reason
from flatlm.runs.trial import TrialConfig
from flatlm.train import TrainConfig, train
from flatlm.train.algorithms import masked_targets, masked_word_loss, mlm_loss_sum
from flatlm.train.data import BatchPipeline, FreshSamples
from tests.train.conftest import assert_learns

MODEL = "d16-h1-l1-i64"
SEED = 5


def _pipeline(src, prefetch=0, **fields) -> BatchPipeline:
    cfg = TrainConfig(targets="truth", batch_size=32, seed=SEED, **fields)
    return BatchPipeline(cfg, FreshSamples(src, cfg.batch_size, cfg.seed), torch.device("cpu"),
                         truth=src, prefetch=prefetch)


def _model(src):
    shape = dataclasses.replace(parse_model(MODEL), dropout=0.0)
    return build_model(shape, vocab_size=src.V, max_length=src.max_length, seed=0).eval()


def _masked_pairs(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sentence, word position) of every masked word, in the order of the head's logits."""
    if positions.dtype == torch.bool:
        return positions.nonzero(as_tuple=True)
    return torch.arange(len(positions)), positions


@pytest.mark.parametrize("mask", ["one", 0.3])
def test_the_soft_target_loss_is_entropy_plus_kl_to_the_truth(src, mask):
    batch = _pipeline(src, mask=mask, mask_replace=(1.0, 0.0, 0.0)).inputs_at(0).mlm
    model = _model(src)
    with torch.no_grad():
        soft = float(mlm_loss_sum(model, batch)) / int(batch.n_targets())
        # the other way: the truth from the sentences the batch was drawn from, the model's
        # log-probabilities from its logits at every position, both in float64
        tokens, lengths = src.sample(32, derive_seed(SEED, "data", 0))
        truth = src.conditionals(tokens, lengths, dtype=torch.float64)  # (n, T, V)
        rows, words = _masked_pairs(batch.positions)
        p = truth[rows, words]  # (k, V)
        logits = word_logits(model, batch.input_ids, batch.attention_mask)  # (n, T + 2, V)
        log_q = logits[rows, words + 1].double().log_softmax(-1)
    log_p = torch.where(p > 0, p.log(), torch.zeros_like(p))  # 0 log 0 = 0
    entropy = -(p * log_p).sum(-1)
    kl = (p * (log_p - log_q)).sum(-1)
    assert float(kl.mean()) > 0.05  # an untrained model: far from the truth
    assert soft == pytest.approx(float((entropy + kl).mean()), abs=1e-6)
    with torch.no_grad():
        sampled = float(mlm_loss_sum(model, dataclasses.replace(batch, soft_targets=None)))
    assert sampled / int(batch.n_targets()) != pytest.approx(soft, abs=1e-3)  # another loss


def _gradient_at_the_truth(batch, *, sampled: bool = False) -> torch.Tensor:
    """The gradient in a bias b (V,) shared by every masked word of a "model" whose logits are
    log p + b, at b = 0: the log true conditionals (p = 0 as a log of 1e-300, whose softmax
    underflows to 0); of the soft-target loss, or with ``sampled`` of the data's words'."""
    p = masked_targets(batch).double()  # (k, V)
    bias = torch.zeros(p.shape[1], dtype=torch.float64, requires_grad=True)
    against = dataclasses.replace(batch, soft_targets=None) if sampled else batch
    loss = masked_word_loss(p.clamp_min(1e-300).log() + bias, against)
    return torch.autograd.grad(loss, bias)[0]


@pytest.mark.parametrize("mask", ["one", 0.3])
def test_at_the_truth_the_soft_gradient_is_zero_on_every_batch_and_the_sampled_one_is_not(
        src, mask):
    pipeline = _pipeline(src, mask=mask)
    batches = [pipeline.inputs_at(i).mlm for i in range(8)]
    soft = torch.stack([_gradient_at_the_truth(b) for b in batches])  # (batches, V)
    sampled = torch.stack([_gradient_at_the_truth(b, sampled=True) for b in batches])
    assert soft.abs().max() <= 1e-12  # q - p at q = p: 0 up to float64 rounding, every batch
    assert soft.var(0).max() <= 1e-24
    assert sampled.abs().max() > 1.0  # sum of p - onehot(x_t) over the batch's words
    assert sampled.var(0).max() > 1.0


def test_truth_targets_train_a_tiny_model(src, eval_sentences, tmp_path):
    cfg = TrainConfig(targets="truth", steps=40, batch_size=64, lr=3e-3, warmup_steps=5,
                      checkpoint_steps=(0, 40), seed=1)
    assert_learns(cfg, src, MODEL, eval_sentences, tmp_path)


def test_sampled_is_the_run_without_the_key(src, tmp_path):
    """"sampled" is the default: a config without the key is that run, bit for bit (and the
    same as the code before the setting: tests/train/test_golden.py's curve)."""
    absent = TrainConfig(steps=5, batch_size=16, warmup_steps=2, mask=0.3, seed=2)
    given = apply_overrides(absent, {"targets": "sampled"})
    assert absent.targets == "sampled" and given == absent
    a = train(absent, src, MODEL, tmp_path / "a", progress=False)
    b = train(given, src, MODEL, tmp_path / "b", progress=False)
    truth = train(dataclasses.replace(absent, targets="truth"), src, MODEL, tmp_path / "c",
                  progress=False)
    for (name, x), y in zip(a.model.state_dict().items(), b.model.state_dict().values(),
                            strict=True):
        assert torch.equal(x, y), name
    assert any(not torch.equal(x, z) for x, z in zip(a.model.parameters(),
                                                     truth.model.parameters(), strict=True))


def test_the_unpadded_layout_carries_the_soft_targets_with_its_rows(src):
    """Sorted by length into micro-batches and trimmed: the same words against the same truth,
    so the same summed loss up to float order."""
    model = _model(src)
    total = {}
    for layout in ("padded", "unpadded"):
        pipeline = _pipeline(src, mask=0.3, sequence_packing=layout, micro_batch_size=8)
        batch = pipeline.inputs_at(0).mlm
        with torch.no_grad():
            total[layout] = sum(float(mlm_loss_sum(model, micro.trimmed()))
                                for micro in batch.split(8))
    assert total["unpadded"] == pytest.approx(total["padded"], rel=1e-6)


def test_batches_built_ahead_carry_the_same_soft_targets(src):
    now, ahead = _pipeline(src, mask=0.3), _pipeline(src, mask=0.3, prefetch=2)
    try:
        for i in range(3):
            assert torch.equal(now.inputs_at(i).mlm.soft_targets,
                               ahead.inputs_at(i).mlm.soft_targets)
    finally:
        ahead.close()


def test_bad_values_and_combinations_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"train\.targets='soft': use one of sampled, truth"):
        TrainConfig(targets="soft")
    with pytest.raises(ValueError, match=r"train\.targets='soft': use one of sampled, truth"):
        apply_overrides(TrialConfig(), {"train.targets": "soft"})
    with pytest.raises(ValueError, match=r"train\.targets='truth': the rows layout"):
        TrainConfig(targets="truth", sequence_packing="rows")
    with pytest.raises(ValueError, match=r"train\.targets='truth': label_noise changes the "
                                         "sampled targets"):
        TrainConfig(targets="truth", algorithm="label_noise")
    trial = apply_overrides(TrialConfig(), {"train.targets": "truth", "model": MODEL})
    assert "train.targets=truth: the packed updates train on the sampled words" in \
        unpacked_reason(trial)


def test_a_source_without_the_truth_is_refused_before_work(src, tmp_path):
    text = copy.copy(src)
    text.has_truth = False  # as real text (flatlm.sources.text)
    with pytest.raises(ValueError, match=r"train\.targets='truth': the source \(PCFG\) has no "
                                         r"exact conditionals .* use train\.targets=sampled"):
        train(TrainConfig(targets="truth", steps=2, batch_size=8), text, MODEL, tmp_path / "run",
              progress=False)
    assert not (tmp_path / "run").exists()
