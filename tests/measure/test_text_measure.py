"""Measurements on real text (no truth) and GLUE fine-tuning, on tiny local files: the one-hot
loss against a loop by hand, GLUE's metrics against their definitions, fine-tuning against a
scikit-learn logistic regression on the same frozen features, and a whole trial that says what it
skipped."""

import logging
import math

import numpy as np
import pytest
import torch

from flatlm.core.config import apply_overrides  # noqa: E402
from flatlm.core.tokens import encode, mask_positions  # noqa: E402
from flatlm.measure import LOSS, LOSS_DATA  # noqa: E402
from flatlm.measure.loss import LossConfig, pretrain_loss  # noqa: E402
from flatlm.measure.probes.finetune import FinetuneConfig  # noqa: E402
from flatlm.measure.probes.glue import glue_finetune, glue_scores  # noqa: E402
from flatlm.models.masked_lm import build_model, cls_features, word_logits  # noqa: E402
from flatlm.models.presets import parse_model  # noqa: E402
from flatlm.sources import load  # noqa: E402
from tests.assets.text_assets import make_text_assets, text_spec  # noqa: E402


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_text_assets(tmp_path_factory.mktemp("text"))


@pytest.fixture(scope="module")
def src(assets):
    return load(text_spec(assets, length=16))


def _model(src, shape="d16-h1-l1-i32"):
    return build_model(parse_model(shape), src.V, src.max_length, seed=0).eval()


def test_the_loss_of_a_source_without_truth_is_the_one_hot_loss(src):
    model = _model(src)
    tokens, lengths = src.sample_validation(5, seed=0)
    out = pretrain_loss(model, src, tokens, lengths, LossConfig(positions="all", batch_size=7))
    total = 0.0
    with torch.no_grad():
        for i in range(len(tokens)):
            for t in range(int(lengths[i])):
                ids, mask = encode(tokens[i : i + 1], lengths[i : i + 1])
                pos = torch.tensor([t])
                logits = word_logits(model, mask_positions(ids, pos), mask, pos).double()
                total -= float(logits.log_softmax(-1)[0, tokens[i, t]])
    assert out[LOSS] == pytest.approx(total / int(lengths.sum()), rel=1e-9)
    assert out[LOSS] == out[LOSS_DATA]
    assert not any(k.startswith(("pretrain/kl", "pretrain/entropy")) for k in out)


def test_glue_scores_are_their_definitions():
    rng = np.random.default_rng(0)
    y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    tp, tn = int(((y == 1) & (p == 1)).sum()), int(((y == 0) & (p == 0)).sum())
    fp, fn = int(((y == 0) & (p == 1)).sum()), int(((y == 1) & (p == 0)).sum())
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert glue_scores("cola", y, p) == {"matthews_correlation": pytest.approx(mcc, abs=1e-12)}
    assert glue_scores("mrpc", y, p) == {"accuracy": pytest.approx((tp + tn) / 200),
                                         "f1": pytest.approx(2 * tp / (2 * tp + fp + fn))}
    assert set(glue_scores("sst2", y, p)) == {"accuracy"}
    with pytest.raises(ValueError, match="stsb"):
        glue_scores("stsb", y, p)


def test_glue_finetuning_reaches_a_logistic_regression_on_the_same_frozen_features(src):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = _model(src, "d32-h2-l1-i64")

    def frozen(split):
        tokens, lengths, y = src.glue_split("sst2", split)
        with torch.no_grad():
            return cls_features(model, *encode(tokens, lengths)).numpy(), y.numpy()

    logistic = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    baseline = logistic.fit(*frozen("train")).score(*frozen("dev"))
    cfg = FinetuneConfig(lr=1e-3, warmup_steps=10, epochs=10, seeds=2)
    tuned = glue_finetune(model, src, "sst2", cfg, "cpu")
    assert set(tuned) == {"glue/sst2/accuracy", "glue/sst2/accuracy_std"}
    assert tuned["glue/sst2/accuracy"] >= baseline > 0.7  # the bound means something


def test_a_trial_on_text_measures_what_it_can_and_says_what_it_skipped(src, assets, tmp_path,
                                                                       caplog):
    from flatlm.runs.trial import TrialConfig, run_trial

    cfg = apply_overrides(TrialConfig(), {
        "source": text_spec(assets, length=16), "model": "d16-h1-l1-i32", "train.steps": 4,
        "train.batch_size": 8, "train.warmup_steps": 1, "train.checkpoint_steps": [4],
        "train.mask": 0.15, "measure.n_eval": 16, "measure.n_downstream": 60,
        "measure.what": ["loss", "fisher", "hessian", "probe", "lookup", "glue"],
        "measure.tasks": ["mrpc"], "measure.probe.epochs": 2, "measure.probe.seeds": 2,
        "measure.finetune.epochs": 1, "measure.finetune.seeds": 1,
        "measure.flatness.n_inputs": 16})
    with caplog.at_level(logging.WARNING):
        metrics = run_trial(cfg, tmp_path / "trial")[4]
    for key in ("pretrain/loss", "pretrain/loss_data", "flat/trace_fisher",
                "flat/trace_hessian_data", "probe/mrpc/acc_mean", "random_init/mrpc/acc_mean",
                "glue/mrpc/accuracy", "glue/mrpc/f1"):
        assert math.isfinite(metrics[key]), key
    for key in ("pretrain/kl", "pretrain/entropy", "flat/trace_hessian", "lookup/mrpc/acc_mean"):
        assert key not in metrics, key
    assert ("not measured: pretrain/entropy, pretrain/kl, flat/trace_hessian, "
            "flat/hessian_fisher_gap, lookup/*") in caplog.text


def test_glue_on_a_source_without_glue_is_an_error_naming_the_field(assets):
    from flatlm.runs.trial import TrialConfig, validate_trial

    cfg = apply_overrides(TrialConfig(), {"source": text_spec(assets, glue=False),
                                          "measure.what": ["loss", "glue"]})
    with pytest.raises(ValueError, match="measure.what: 'glue' needs a text source"):
        validate_trial(cfg)
