"""algorithm="label_noise": SGD on masked-word targets replaced with probability p by uniform
words; p = 0 is plain SGD bit for bit, and a resumed run draws the same noise."""

import dataclasses
import math

import pytest
import torch

from flatlm.core.config import apply_overrides
from flatlm.core.seeds import generator
from flatlm.train import TrainConfig, resolve, train
from flatlm.train.config import LabelNoiseConfig
from flatlm.train.data import BatchPipeline, FreshSamples
from flatlm.train.label_noise import noisy_targets


def _changed_fraction_is_binomial(changed: torch.Tensor, q: float) -> None:
    """The fraction of changed targets lies within 4 standard errors of q (binomial)."""
    n = changed.numel()
    se = math.sqrt(q * (1 - q) / n)
    assert abs(float(changed.float().mean()) - q) < 4 * se, (float(changed.float().mean()), q)


@pytest.mark.parametrize("p", [0.05, 0.3, 1.0])
def test_replaced_fraction_matches_p_and_the_words_are_uniform(p):
    V, n = 12, 40_000
    targets = torch.zeros(n, dtype=torch.long)  # all word 0: a changed one shows its draw
    noisy = noisy_targets(targets, torch.zeros(n, dtype=torch.long), p, V, generator(0, "t", 0))
    changed = noisy != targets
    _changed_fraction_is_binomial(changed, p * (1 - 1 / V))  # a draw may be the word itself
    counts = torch.bincount(noisy[changed], minlength=V)[1:].double()  # uniform on words 1..11
    expected = counts.sum() / (V - 1)
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 35.0, chi2  # chi-square with 10 degrees of freedom: P(> 35) ~ 1e-4


def test_at_a_rate_only_masked_words_are_touched():
    V = 12
    g = torch.Generator().manual_seed(2)
    positions = torch.rand(2000, 8, generator=g) < 0.3
    targets = torch.where(positions, torch.randint(0, V, (2000, 8), generator=g), -1)
    noisy = noisy_targets(targets, positions, 0.5, V, generator(0, "t", 1))
    assert torch.equal(noisy[~positions], targets[~positions])  # -1 stays -1
    _changed_fraction_is_binomial((noisy != targets)[positions], 0.5 * (1 - 1 / V))


def test_the_pipeline_noises_targets_only(src):
    base = TrainConfig(algorithm="sgd", steps=10, batch_size=4000, seed=3)
    noisy_cfg = dataclasses.replace(base, algorithm="label_noise",
                                    sections={"label_noise": LabelNoiseConfig(p=0.2)})
    plain, noisy = (BatchPipeline(resolve(c), FreshSamples(src, 4000, 3), torch.device("cpu"))
                    .inputs_at(7).mlm for c in (base, noisy_cfg))
    assert torch.equal(plain.input_ids, noisy.input_ids)
    assert torch.equal(plain.positions, noisy.positions)
    _changed_fraction_is_binomial(plain.targets != noisy.targets, 0.2 * (1 - 1 / src.V))


RUN = dict(steps=6, batch_size=32, lr=0.3, checkpoint_steps=(3, 6), seed=4, log_every=2)


def _params(result):
    return [p.detach() for p in result.model.parameters()]


def test_p0_is_plain_sgd_bit_for_bit_and_p_positive_is_not(src, tiny_model, tmp_path):
    sgd = train(TrainConfig(algorithm="sgd", **RUN), src, tiny_model, tmp_path / "sgd",
                progress=False)
    cfg = TrainConfig(algorithm="label_noise",
        sections={"label_noise": LabelNoiseConfig(p=0.0)}, **RUN)
    assert resolve(cfg).warmup_steps == resolve(TrainConfig(algorithm="sgd", **RUN)).warmup_steps
    zero = train(cfg, src, tiny_model, tmp_path / "p0", progress=False)
    assert all(torch.equal(a, b) for a, b in zip(_params(sgd), _params(zero), strict=True))
    assert zero.history == sgd.history
    half = train(dataclasses.replace(cfg,
        sections={"label_noise": LabelNoiseConfig(p=0.5)}), src, tiny_model,
                 tmp_path / "p5", progress=False)
    assert not all(torch.equal(a, b) for a, b in zip(_params(sgd), _params(half), strict=True))


def test_resume_draws_the_same_noise(src, tiny_model, tmp_path):
    cfg = TrainConfig(algorithm="label_noise",
        sections={"label_noise": LabelNoiseConfig(p=0.5)}, **RUN)
    straight = train(cfg, src, tiny_model, tmp_path / "a", progress=False)

    class StopError(Exception):
        pass

    def stop(step, model, ckpt):
        if step == 3:
            raise StopError

    with pytest.raises(StopError):
        train(cfg, src, tiny_model, tmp_path / "b", progress=False, on_checkpoint=stop)
    resumed = train(cfg, src, tiny_model, tmp_path / "b", progress=False, resume=True)
    assert all(torch.equal(a, b) for a, b in zip(_params(straight), _params(resumed),
                                                 strict=True))
    assert resumed.history == straight.history


@pytest.mark.parametrize("p", ["-0.1", "1.5", float("nan")])
def test_a_bad_p_is_named(p):
    with pytest.raises(ValueError, match=r"train\.label_noise\.p="):
        apply_overrides(TrainConfig(), {"algorithm": "label_noise", "label_noise.p": p})
